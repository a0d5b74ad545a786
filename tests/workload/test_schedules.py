"""Pipeline schedules: completeness, ordering and peak in-flight microbatches."""

from __future__ import annotations

import pytest

from clustersim.errors import ScenarioError
from clustersim.workload import get_schedule, peak_in_flight, register_schedule, schedule_names


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("stages", "microbatches"), [(1, 1), (4, 8), (4, 2), (8, 3), (3, 16)])
def test_every_microbatch_once_forward_before_backward(
    name: str, stages: int, microbatches: int
) -> None:
    schedule = get_schedule(name)
    for stage in range(stages):
        order = schedule(stage, stages, microbatches)
        assert sorted(order) == sorted(
            [("F", mb) for mb in range(microbatches)] + [("B", mb) for mb in range(microbatches)]
        )
        # Forwards and backwards each run in microbatch order (what keeps stages in step).
        assert [mb for k, mb in order if k == "F"] == list(range(microbatches))
        assert [mb for k, mb in order if k == "B"] == list(range(microbatches))
        for mb in range(microbatches):
            assert order.index(("F", mb)) < order.index(("B", mb))


@pytest.mark.parametrize(("stages", "microbatches"), [(4, 8), (4, 2), (8, 3), (2, 16)])
def test_in_flight(stages: int, microbatches: int) -> None:
    for stage in range(stages):
        one_f_one_b = get_schedule("1f1b")(stage, stages, microbatches)
        assert peak_in_flight(one_f_one_b) == min(stages - stage, microbatches)
        gpipe = get_schedule("gpipe")(stage, stages, microbatches)
        assert peak_in_flight(gpipe) == microbatches


def test_1f1b_shape() -> None:
    assert get_schedule("1f1b")(1, 4, 5) == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("F", 4), ("B", 2),
        ("B", 3), ("B", 4),
    ]  # fmt: skip


def test_unknown_schedule_lists_valid_names() -> None:
    with pytest.raises(ScenarioError, match="valid: 1f1b, gpipe") as err:
        get_schedule("zero-bubble")
    assert err.value.path == "parallelism.schedule"
    assert schedule_names() == ["1f1b", "gpipe"]


def test_register_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_schedule("gpipe")(get_schedule("gpipe"))
