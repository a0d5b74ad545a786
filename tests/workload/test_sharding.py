"""ZeRO-2/3 and hybrid sharding: memory hand counts and per-step traffic in closed form."""

from __future__ import annotations

from collections import defaultdict

import pytest

from clustersim.errors import ScenarioError
from clustersim.workload import build_programs, make_layout, memory_per_rank
from clustersim.workload.program import Kind
from clustersim.workload.sharding import stage_units

from .helpers import llama3_8b, setup, tiny

P8B = 8_030_261_248  # llama3-8b, tp 1, pp 1: every parameter on every rank
EMBED = 128256 * 4096  # the token table; the vocabulary needs no padding
HEAD = EMBED + 4096  # LM head and final norm
LAYER = 4096 * 48 * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336 + 2 * 4096


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def test_llama3_8b_units() -> None:
    _, _, lay = setup(8, 1, zero=3)
    units = stage_units(llama3_8b(), lay, 0, "layer")
    assert units["embed"] == EMBED and units["head"] == HEAD and units["L0"] == LAYER
    assert len(units) == 34 and sum(units.values()) == P8B
    assert stage_units(llama3_8b(), lay, 0, "stage") == {"C0": P8B}


@pytest.mark.parametrize("dp_shard", [None, 2])
def test_llama3_8b_memory_hand_count(dp_shard: int | None) -> None:
    """Weights, gradients and Adam state per rank at zero 0-3 on 8 ranks (dp 8)."""
    model = llama3_8b()
    s = dp_shard or 8
    shard = _ceil(P8B, s)

    def mem(zero: int, **over: object) -> tuple[float, float, float]:
        extra = {"dp_shard": dp_shard} if zero >= 2 and dp_shard else {}
        par, train, lay = setup(8, 1, zero=zero, **extra, **over)  # type: ignore[arg-type]
        m = memory_per_rank(model, par, train, lay, 0)
        return m.weights, m.grads, m.optimizer

    if dp_shard is None:
        assert mem(0) == (2 * P8B, 2 * P8B, 12 * P8B)
        assert mem(1) == (2 * P8B, 2 * P8B, 12 * shard)
    buckets = 2 * 64 * 2**20  # two 64 MiB buckets: one filling, one reducing
    assert mem(2) == (2 * P8B, 2 * shard + buckets, 12 * shard)
    # The largest unit is the head: the unit computing and one prefetched, and the
    # gradients of the unit computing and of the one being reduce-scattered.
    assert mem(3) == (2 * shard + 2 * 2 * HEAD, 2 * shard + 2 * 2 * HEAD, 12 * shard)
    assert mem(3, fsdp={"prefetch": 0})[0] == 2 * shard + 2 * HEAD
    assert mem(3, fsdp={"prefetch": 3})[0] == 2 * shard + 4 * 2 * HEAD
    assert mem(3, fsdp={"reshard_after_forward": False})[0] == 2 * shard + 2 * P8B
    assert mem(3, fsdp={"unit": "stage"})[0] == 2 * shard + 2 * P8B


def _traffic(**over: object) -> dict[tuple[str, str], float]:
    model = llama3_8b()
    par, train, lay = setup(8, 1, global_batch_size=over.pop("gbs", 8), **over)  # type: ignore[arg-type]
    (prog,) = build_programs(model, par, train, lay)
    out: dict[tuple[str, str], float] = defaultdict(float)
    for ins in prog.instrs:
        if ins.kind in (Kind.COLLECTIVE, Kind.ASYNC_COLLECTIVE) and ins.group.startswith("dp"):
            out[(ins.group, ins.collective)] += ins.nbytes
    return dict(out)


@pytest.mark.parametrize("microbatches", [1, 3])
def test_fsdp_traffic_closed_form(microbatches: int) -> None:
    """Per microbatch: gathers of 2 x params x 2 B (1 x without reshard after forward),
    reduce-scatters of params x 2 B, over the shard group; nothing else over DP."""
    gbs = 8 * microbatches
    m = microbatches
    assert _traffic(zero=3, gbs=gbs) == {
        ("dp_shard", "all_gather"): m * 2 * 2 * P8B,
        ("dp_shard", "reduce_scatter"): m * 2 * P8B,
    }
    kept = _traffic(zero=3, gbs=gbs, fsdp={"reshard_after_forward": False})
    assert kept[("dp_shard", "all_gather")] == m * 2 * P8B
    staged = _traffic(zero=3, gbs=gbs, fsdp={"unit": "stage", "prefetch": 0})
    assert staged[("dp_shard", "all_gather")] == m * 2 * 2 * P8B
    # ZeRO-2: the buckets every microbatch, one gather of the updated parameters.
    assert _traffic(zero=2, gbs=gbs) == {
        ("dp_shard", "reduce_scatter"): m * 2 * P8B,
        ("dp_shard", "all_gather"): 2 * P8B,
    }
    # ZeRO-1 and plain DP reduce once per step.
    assert _traffic(zero=1, gbs=gbs) == {
        ("dp", "reduce_scatter"): 2 * P8B,
        ("dp", "all_gather"): 2 * P8B,
    }
    assert _traffic(zero=0, gbs=gbs) == {("dp", "all_reduce"): 2 * P8B}


def test_pipeline_keeps_units_gathered_for_the_step() -> None:
    """Without resharding, a pipeline stage gathers each unit once per step."""
    model = llama3_8b()
    par, train, lay = setup(
        16, 1, pp=2, zero=3, global_batch_size=32, fsdp={"reshard_after_forward": False}
    )
    for prog in build_programs(model, par, train, lay):
        units = stage_units(model, lay, prog.stage, "layer")
        gathers = [i.nbytes for i in prog.instrs if i.name == "dp_shard.all_gather"]
        assert sum(gathers) == 2 * sum(units.values())
        scatters = [i.nbytes for i in prog.instrs if i.name == "dp_shard.reduce_scatter"]
        assert sum(scatters) == 4 * 2 * sum(units.values())  # four microbatches


def test_hsdp_replicas_all_reduce_their_shards_once() -> None:
    traffic = _traffic(zero=3, gbs=16, dp_shard=4)
    units = [EMBED, *[LAYER] * 32, HEAD]
    assert traffic[("dp_replicate", "all_reduce")] == sum(_ceil(2 * u, 4) for u in units)
    assert traffic[("dp_shard", "all_gather")] == 2 * 2 * 2 * P8B
    zero2 = _traffic(zero=2, gbs=16, dp_shard=2)
    assert zero2[("dp_replicate", "all_reduce")] == pytest.approx(2 * P8B / 2, rel=1e-6)


def test_prefetch_window() -> None:
    """Before each unit: wait for its gather, keeping the prefetched ones in flight."""
    model = tiny()
    for prefetch in (0, 1, 2):
        par, train, lay = setup(8, 1, zero=3, global_batch_size=8, fsdp={"prefetch": prefetch})
        (prog,) = build_programs(model, par, train, lay)
        # Without replicas every group wait is a gather's.
        waits = [i.tag for i in prog.instrs if i.kind == Kind.WAIT_ASYNC and i.group]
        gathers = [
            i
            for i in prog.instrs
            if i.kind == Kind.ASYNC_COLLECTIVE and i.collective == "all_gather"
        ]
        uses = 2 * (model.layers + 2)  # embedding, layers and head, forward and backward
        assert len(gathers) == len(waits) == uses
        # Gathers left in flight by the wait before use j: those of the next prefetch
        # units but the one started after the wait; the first use waits for its own.
        assert waits == [0] + [max(min(prefetch, uses - j) - 1, 0) for j in range(1, uses)]


def test_bad_sharding_input() -> None:
    par, _, _ = setup(8, 1, zero=3, dp_shard=4)
    with pytest.raises(ScenarioError) as err:
        make_layout(par.model_copy(update={"dp_shard": 3}), 8, 1)
    assert err.value.path == "parallelism.dp_shard"
    with pytest.raises(ScenarioError) as err:
        build_programs(tiny(), *setup(8, 1, zero=1, dp_shard=4))
    assert err.value.path == "parallelism.dp_shard"


@pytest.mark.parametrize("dp_shard", [None, 4])
def test_context_parallel_ranks_join_the_shard_group(dp_shard: int | None) -> None:
    """Under CP, ZeRO-2 and 3 shard over dp_shard x cp ranks (the CP ranks hold the same
    weights, so their gradients are reduced with DP's): 16 ranks, dp 8, cp 2."""
    model = llama3_8b()
    s = 2 * (dp_shard or 8)
    shard = _ceil(P8B, s)
    for zero in (2, 3):
        extra = {"dp_shard": dp_shard} if dp_shard else {}
        par, train, lay = setup(16, 1, cp=2, zero=zero, seq_len=512, global_batch_size=8, **extra)  # type: ignore[arg-type]
        assert lay.group("dp_shard", 0) == tuple(range(0, s))
        m = memory_per_rank(model, par, train, lay, 0)
        assert m.optimizer == 12 * shard
        (prog,) = build_programs(model, par, train, lay)
        out: dict[tuple[str, str], float] = defaultdict(float)
        for ins in prog.instrs:
            if ins.kind in (Kind.COLLECTIVE, Kind.ASYNC_COLLECTIVE) and ins.group.startswith("dp"):
                out[(ins.group, ins.collective)] += ins.nbytes
        assert out[("dp_shard", "reduce_scatter")] == 2 * P8B
        assert out[("dp_shard", "all_gather")] == (2 if zero == 3 else 1) * 2 * P8B
        if dp_shard:
            assert out[("dp_replicate", "all_reduce")] == pytest.approx(2 * P8B / s, rel=1e-6)
