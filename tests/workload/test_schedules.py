"""Pipeline schedules: completeness, ordering, peak in-flight microbatches and bubbles."""

from __future__ import annotations

import pytest

from clustersim.errors import ScenarioError
from clustersim.workload import get_schedule, peak_in_flight, register_schedule, schedule_names
from clustersim.workload.schedules import Order


def _check_complete(order: Order, microbatches: int, chunks: int) -> None:
    units = [(mb, c) for c in range(chunks) for mb in range(microbatches)]
    assert sorted(order) == sorted([("F", *u) for u in units] + [("B", *u) for u in units])
    for c in range(chunks):
        # Each chunk's forwards and backwards run in microbatch order (stages keep in step).
        assert [mb for k, mb, ch in order if k == "F" and ch == c] == list(range(microbatches))
        assert [mb for k, mb, ch in order if k == "B" and ch == c] == list(range(microbatches))
    for mb, c in units:
        assert order.index(("F", mb, c)) < order.index(("B", mb, c))


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("stages", "microbatches"), [(1, 1), (4, 8), (4, 2), (8, 3), (3, 16)])
def test_every_microbatch_once_forward_before_backward(
    name: str, stages: int, microbatches: int
) -> None:
    schedule = get_schedule(name)
    for stage in range(stages):
        _check_complete(schedule(stage, stages, microbatches, 1), microbatches, 1)


@pytest.mark.parametrize(("stages", "microbatches", "chunks"), [(2, 4, 2), (4, 8, 2), (4, 4, 3)])
def test_interleaved_runs_every_chunk_of_every_microbatch(
    stages: int, microbatches: int, chunks: int
) -> None:
    for name in ("1f1b", "gpipe"):
        for stage in range(stages):
            order = get_schedule(name)(stage, stages, microbatches, chunks)
            _check_complete(order, microbatches, chunks)


@pytest.mark.parametrize(("stages", "microbatches"), [(4, 8), (4, 2), (8, 3), (2, 16)])
def test_in_flight(stages: int, microbatches: int) -> None:
    for stage in range(stages):
        one_f_one_b = get_schedule("1f1b")(stage, stages, microbatches, 1)
        assert peak_in_flight(one_f_one_b) == min(stages - stage, microbatches)
        gpipe = get_schedule("gpipe")(stage, stages, microbatches, 1)
        assert peak_in_flight(gpipe) == microbatches


def test_interleaved_in_flight_is_megatrons_warmup_plus_one() -> None:
    stages, chunks, microbatches = 4, 2, 8
    for stage in range(stages):
        order = get_schedule("1f1b")(stage, stages, microbatches, chunks)
        warmup = 2 * (stages - stage - 1) + (chunks - 1) * stages
        assert peak_in_flight(order) == warmup + 1
        # Weighted by each chunk's size (layers, say).
        assert peak_in_flight(order, [1.0, 0.0]) <= peak_in_flight(order)


def test_1f1b_shape() -> None:
    assert get_schedule("1f1b")(1, 4, 5, 1) == [
        ("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("B", 0, 0), ("F", 3, 0), ("B", 1, 0),
        ("F", 4, 0), ("B", 2, 0), ("B", 3, 0), ("B", 4, 0),
    ]  # fmt: skip


def test_interleaved_shape() -> None:
    """Megatron-LM's order for 2 stages, 2 chunks, 4 microbatches, on the first stage."""
    assert get_schedule("1f1b")(0, 2, 4, 2) == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1),  # warm-up: 2 + 2 units
        ("F", 2, 0), ("B", 0, 1), ("F", 3, 0), ("B", 1, 1),
        ("F", 2, 1), ("B", 0, 0), ("F", 3, 1), ("B", 1, 0),
        ("B", 2, 1), ("B", 3, 1), ("B", 2, 0), ("B", 3, 0),
    ]  # fmt: skip


def test_interleaving_needs_whole_groups_of_microbatches() -> None:
    with pytest.raises(ValueError, match="divisible by stages"):
        get_schedule("1f1b")(0, 4, 6, 2)


def _makespan(name: str, stages: int, microbatches: int, chunks: int) -> float:
    """Run each stage's order in sequence, a forward of a whole stage taking 1 and a
    backward 2 (split evenly over its chunks), with free messages; the step's length."""
    orders = [get_schedule(name)(s, stages, microbatches, chunks) for s in range(stages)]
    n_chunks = stages * chunks
    done: dict[tuple[str, int, int], float] = {}
    pos, clock = [0] * stages, [0.0] * stages
    while any(p < len(o) for p, o in zip(pos, orders, strict=True)):
        moved = False
        for s in range(stages):
            if pos[s] == len(orders[s]):
                continue
            kind, mb, local = orders[s][pos[s]]
            c = local * stages + s
            need = [("F", mb, c - 1)] if kind == "F" and c > 0 else []
            if kind == "B":
                need = [("F", mb, c)] + ([("B", mb, c + 1)] if c < n_chunks - 1 else [])
            if all(n in done for n in need):
                start = max([clock[s], *(done[n] for n in need)])
                clock[s] = done[(kind, mb, c)] = start + (1.0 if kind == "F" else 2.0) / chunks
                pos[s] += 1
                moved = True
        assert moved, "deadlock"
    return max(clock)


@pytest.mark.parametrize(("stages", "microbatches", "chunks"), [(4, 8, 1), (4, 8, 2), (4, 16, 4)])
def test_bubble_shrinks_by_the_number_of_chunks(
    stages: int, microbatches: int, chunks: int
) -> None:
    """Narayanan et al. 2021: the bubble is (p - 1) (t_f + t_b) / v."""
    assert _makespan("1f1b", stages, microbatches, chunks) == pytest.approx(
        microbatches * 3.0 + (stages - 1) * 3.0 / chunks
    )


def test_unknown_schedule_lists_valid_names() -> None:
    with pytest.raises(ScenarioError, match="valid: 1f1b, dualpipe, gpipe") as err:
        get_schedule("zero-bubble")
    assert err.value.path == "parallelism.schedule"
    assert schedule_names() == ["1f1b", "dualpipe", "gpipe"]


def test_register_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_schedule("gpipe")(get_schedule("gpipe"))
