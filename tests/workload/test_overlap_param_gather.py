"""Megatron's distributed optimizer: the ZeRO-1 parameter all-gather under the forward."""

from __future__ import annotations

from clustersim.workload import build_programs
from clustersim.workload.program import Kind, Phase
from clustersim.workload.transformer import grad_buckets

from .helpers import setup, tiny


def test_param_gathers_run_one_bucket_ahead_of_the_forward() -> None:
    bucket = 2**20
    model = tiny()
    plain_cfg, train, lay = setup(8, pp=2, zero=1, grad_bucket_bytes=bucket)
    over_cfg, _, _ = setup(8, pp=2, zero=1, grad_bucket_bytes=bucket, overlap_param_gather=True)
    plain = build_programs(model, plain_cfg, train, lay)
    over = build_programs(model, over_cfg, train, lay)
    for stage, (a, b) in enumerate(zip(plain, over, strict=True)):
        _, sizes = grad_buckets(model, lay, stage, bucket)
        gathers = [i for i in b.instrs if i.phase == Phase.PARAM_SYNC and i.collective and i.nbytes]
        assert len(gathers) == len(sizes) > 1
        # the same bytes as the gathers after the optimizer, in forward (reversed) order
        assert [g.nbytes for g in gathers] == [float(s) for s in reversed(sizes)]
        # the first blocks at the start, the second is dispatched with it
        assert b.instrs[:2] == gathers[:2]
        assert gathers[0].kind == Kind.COLLECTIVE
        assert {g.kind for g in gathers[1:]} == {Kind.ASYNC_COLLECTIVE}
        # every later bucket is waited for before the forward that first uses it, and
        # the next one dispatched then: one gather in flight at a time
        kinds = [i.kind for i in b.instrs if i.phase == Phase.PARAM_SYNC][2:]
        waits = kinds.count(Kind.WAIT_ASYNC)
        assert waits == len(sizes) - 1
        assert kinds[::2] == [Kind.WAIT_ASYNC] * (len(kinds) + 1 >> 1)
        # all of them in the step's first forward
        last = max(j for j, i in enumerate(b.instrs) if i.phase == Phase.PARAM_SYNC)
        assert {i.microbatch for i in b.instrs[:last] if i.phase == Phase.FORWARD} == {0}
        assert b.instrs[-1].name == "optimizer"  # nothing after the Adam step
        assert a.instrs[-1].phase == Phase.PARAM_SYNC  # without overlap they follow it


def test_model_chunks_gather_a_chunk_ahead() -> None:
    """Interleaved: the first two chunks' gathers at the start, chunk c + 1's
    dispatched when chunk c first runs, each waited for before its first forward."""
    bucket = 2**20
    model = tiny()
    cfg, train, lay = setup(8, pp=2, zero=1, virtual_stages=2, grad_bucket_bytes=bucket,
                            overlap_param_gather=True)  # fmt: skip
    cfg4, train4, lay4 = setup(8, pp=2, zero=1, virtual_stages=4, grad_bucket_bytes=bucket,
                               overlap_param_gather=True)  # fmt: skip
    for (c, t, layout), chunks in (((cfg, train, lay), 2), ((cfg4, train4, lay4), 4)):
        for stage, prog in enumerate(build_programs(model, c, t, layout)):
            _, sizes = grad_buckets(model, layout, stage, bucket)
            sync = [i for i in prog.instrs if i.phase == Phase.PARAM_SYNC]
            gathers = [i for i in sync if i.kind != Kind.WAIT_ASYNC]
            assert len(gathers) == chunks  # one per chunk: a communicator runs them in turn
            assert sum(g.nbytes for g in gathers) == float(sum(sizes))
            assert [i.kind for i in sync[:2]] == [Kind.COLLECTIVE, Kind.ASYNC_COLLECTIVE]
            assert [i.kind for i in sync].count(Kind.WAIT_ASYNC) == chunks - 1


def test_without_zero_or_dp_nothing_changes() -> None:
    model = tiny()
    for par in ({"zero": 0, "pp": 2}, {"zero": 1, "pp": 2, "dp": 1}):
        base, train, lay = setup(2 if par.get("dp") == 1 else 8, **par)
        over, _, _ = setup(2 if par.get("dp") == 1 else 8, overlap_param_gather=True, **par)
        a = build_programs(model, base, train, lay)
        b = build_programs(model, over, train, lay)
        assert [p.instrs for p in a] == [p.instrs for p in b]
