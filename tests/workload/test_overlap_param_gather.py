"""Megatron's distributed optimizer: the ZeRO-1 parameter all-gather under the forward."""

from __future__ import annotations

from clustersim.workload import build_programs
from clustersim.workload.program import Kind, Phase
from clustersim.workload.transformer import grad_buckets

from .helpers import setup, tiny


def test_param_gathers_move_to_the_start_with_the_first_bucket_blocking() -> None:
    bucket = 2**20
    model = tiny()
    plain_cfg, train, lay = setup(8, pp=2, zero=1, grad_bucket_bytes=bucket)
    over_cfg, _, _ = setup(8, pp=2, zero=1, grad_bucket_bytes=bucket, overlap_param_gather=True)
    plain = build_programs(model, plain_cfg, train, lay)
    over = build_programs(model, over_cfg, train, lay)
    for stage, (a, b) in enumerate(zip(plain, over, strict=True)):
        _, sizes = grad_buckets(model, lay, stage, bucket)
        gathers = [i for i in b.instrs if i.phase == Phase.PARAM_SYNC]
        assert len(gathers) == len(sizes) > 1
        # the same bytes as the gathers after the optimizer, in forward (reversed) order
        assert [g.nbytes for g in gathers] == [float(s) for s in reversed(sizes)]
        assert b.instrs[: len(gathers)] == gathers  # first in the program
        assert gathers[0].kind == Kind.COLLECTIVE
        assert {g.kind for g in gathers[1:]} == {Kind.ASYNC_COLLECTIVE}
        assert b.instrs[-1].name == "optimizer"  # nothing after the Adam step
        assert a.instrs[-1].phase == Phase.PARAM_SYNC  # without overlap they follow it
        waits = [i for i in b.instrs if i.kind == Kind.WAIT_ASYNC]
        assert len(waits) == 1 and b.instrs.index(waits[0]) > len(gathers)


def test_without_zero_or_dp_nothing_changes() -> None:
    model = tiny()
    for par in ({"zero": 0, "pp": 2}, {"zero": 1, "pp": 2, "dp": 1}):
        base, train, lay = setup(2 if par.get("dp") == 1 else 8, **par)
        over, _, _ = setup(2 if par.get("dp") == 1 else 8, overlap_param_gather=True, **par)
        a = build_programs(model, base, train, lay)
        b = build_programs(model, over, train, lay)
        assert [p.instrs for p in a] == [p.instrs for p in b]
