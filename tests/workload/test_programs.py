"""Stage programs: FLOPs against the analytic count, pipeline messages, DP buckets."""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

import pytest

from clustersim.catalog.schema import ModelSpec
from clustersim.workload import (
    Kind,
    Phase,
    Program,
    build_programs,
    microbatches,
    rank_param_count,
)

from .helpers import llama3_70b, setup, tiny


def _layer_matmul_params(model: ModelSpec, tp: int) -> int:
    kv = max(model.kv_heads, tp)  # KV heads are replicated when tp exceeds them
    h, d = model.hidden, model.head_dim
    mlp = (3 if model.activation == "swiglu" else 2) * h * model.ffn_hidden
    return h * (model.heads + 2 * kv) * d + model.heads * d * h + mlp


def _expected_flops(model: ModelSpec, tp: int, seq: int, tokens: int, recompute: str) -> float:
    """Hardware FLOPs of one step, counted by hand.

    Linear layers: 6 FLOPs per parameter and token (forward, dgrad, wgrad); the
    LM head uses the vocabulary padded to a multiple of 128*tp. Causal flash
    attention per token and layer: forward QK^T and PV, s*h each (half of 2*s*h);
    backward five matmuls of that size (S recomputed, dP, dQ, dK, dV).
    Recompute adds the attention forward (selective) or the whole layer forward (full).
    """
    L, h = model.layers, model.hidden
    vocab = -(-model.vocab // (128 * tp)) * 128 * tp
    layer_mm = _layer_matmul_params(model, tp)
    per_token = 6.0 * (L * layer_mm + vocab * h) + 7.0 * L * seq * h
    if recompute == "selective":
        per_token += 2.0 * L * seq * h
    if recompute == "full":
        per_token += 2.0 * L * seq * h + 2.0 * L * layer_mm
    return per_token * tokens


def _total_flops(programs: list[Program], ranks_per_stage: int) -> float:
    total = 0.0
    for prog in programs:
        total += sum(i.work.tensor_flops for i in prog.instrs if i.work is not None)
    return total * ranks_per_stage


CONFIGS: list[tuple[int, dict[str, Any]]] = [
    (1, {}),
    (8, {"tp": 2, "pp": 2}),
    (16, {"tp": 4, "cp": 2}),
    (16, {"tp": 4, "pp": 2, "sequence_parallel": False, "recompute": "none"}),
    (8, {"pp": 4, "recompute": "full", "schedule": "gpipe"}),
    (8, {"tp": 2, "cp": 2, "recompute": "full", "microbatch_size": 2}),
    (16, {"tp": 8, "recompute": "none"}),  # tp > kv_heads: KV heads replicated
    # Transformer Engine's ring: cp partial steps, the FLOPs of the unsplit causal core
    (16, {"tp": 4, "cp": 2, "cp_comm_type": "p2p"}),
    (16, {"tp": 2, "cp": 4, "cp_comm_type": "p2p", "recompute": "none"}),
    (8, {"tp": 2, "cp": 2, "recompute": "full", "microbatch_size": 2, "cp_comm_type": "p2p"}),
]


@pytest.mark.parametrize(("ranks", "kw"), CONFIGS)
def test_flops_match_hand_count(ranks: int, kw: dict[str, Any]) -> None:
    model = tiny()
    par, train, lay = setup(ranks, **kw)
    programs = build_programs(model, par, train, lay)
    assert len(programs) == lay.pp
    tokens = train.global_batch_size * train.seq_len
    expected = _expected_flops(model, lay.tp, train.seq_len, tokens, par.recompute)
    assert _total_flops(programs, lay.ranks_per_stage) == pytest.approx(expected, rel=1e-12)


def test_flops_with_padded_vocab_and_gelu() -> None:
    model = tiny(vocab=4000, activation="gelu", norm="layernorm", position="learned")
    par, train, lay = setup(8, tp=4, pp=2, recompute="selective")
    tokens = train.global_batch_size * train.seq_len
    expected = _expected_flops(model, 4, train.seq_len, tokens, "selective")
    programs = build_programs(model, par, train, lay)
    assert _total_flops(programs, lay.ranks_per_stage) == pytest.approx(expected, rel=1e-12)


def _run_pipeline(programs: list[Program]) -> bool:
    """Execute the stages' sends and receives; True if every stage reaches its end.

    Sends never block and a receive waits for its matching send (same pair of
    stages and tag), as in the simulator. Collectives are among ranks of one
    stage, which run the same program, so they cannot deadlock and are skipped.
    """
    pos = [0] * len(programs)
    mailbox: Counter[tuple[int, int, int]] = Counter()
    moved = True
    while moved:
        moved = False
        for k, prog in enumerate(programs):
            while pos[k] < len(prog.instrs):
                ins = prog.instrs[pos[k]]
                if ins.kind == Kind.SEND:
                    mailbox[(k, k + ins.peer, ins.tag)] += 1
                elif ins.kind == Kind.RECV:
                    key = (k + ins.peer, k, ins.tag)
                    if not mailbox[key]:
                        break
                    mailbox[key] -= 1
                pos[k] += 1
                moved = True
    return all(p == len(prog.instrs) for p, prog in zip(pos, programs, strict=True))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_send_recv_tags_match(schedule: str) -> None:
    model = tiny()
    par, train, lay = setup(8, tp=2, pp=4, global_batch_size=8, schedule=schedule)
    assert microbatches(par, train, lay) == 8
    programs = build_programs(model, par, train, lay)
    for k in range(lay.pp - 1):
        lo, hi = programs[k].instrs, programs[k + 1].instrs
        down = [(i.tag, i.nbytes) for i in lo if i.kind == Kind.SEND and i.peer == +1]
        got = [(i.tag, i.nbytes) for i in hi if i.kind == Kind.RECV and i.peer == -1]
        assert down == got
        assert sorted(t for t, _ in down) == [2 * mb for mb in range(8)]
        up = [(i.tag, i.nbytes) for i in hi if i.kind == Kind.SEND and i.peer == -1]
        got_up = [(i.tag, i.nbytes) for i in lo if i.kind == Kind.RECV and i.peer == +1]
        assert up == got_up
        assert sorted(t for t, _ in up) == [2 * mb + 1 for mb in range(8)]
    # Sequence-parallel activation shard: T*h*2/tp bytes.
    assert down[0][1] == 256 * 512 * 2 / 2
    assert not any(i.kind == Kind.RECV for i in programs[0].instrs if i.peer == -1)
    assert not any(i.kind == Kind.SEND for i in programs[-1].instrs if i.peer == +1)
    assert _run_pipeline(programs)


def _peak_live(prog: Program) -> int:
    last_bwd = {i.microbatch: n for n, i in enumerate(prog.instrs) if i.phase == Phase.BACKWARD}
    live: set[int] = set()
    peak = 0
    for n, ins in enumerate(prog.instrs):
        if ins.phase == Phase.FORWARD:
            live.add(ins.microbatch)
            peak = max(peak, len(live))
        if last_bwd.get(ins.microbatch) == n:
            live.discard(ins.microbatch)
    return peak


def test_in_flight_in_programs() -> None:
    model = tiny()
    for schedule, expect in (("1f1b", lambda k: 4 - k), ("gpipe", lambda k: 8)):
        par, train, lay = setup(4, pp=4, global_batch_size=8, schedule=schedule)
        for prog in build_programs(model, par, train, lay):
            assert _peak_live(prog) == expect(prog.stage)


def test_each_microbatch_forward_and_backward_once_per_layer() -> None:
    model = tiny()
    par, train, lay = setup(4, pp=2, global_batch_size=8, recompute="full")
    for prog in build_programs(model, par, train, lay):
        fwd = Counter(
            (i.layer, i.microbatch)
            for i in prog.instrs
            if i.name == "attn.qkv" and i.phase == Phase.FORWARD
        )
        rec = Counter(
            (i.layer, i.microbatch)
            for i in prog.instrs
            if i.name == "attn.qkv" and i.phase == Phase.RECOMPUTE
        )
        bwd = Counter((i.layer, i.microbatch) for i in prog.instrs if i.name == "attn.qkv.wgrad")
        want = {(layer, mb): 1 for layer in prog.layers for mb in range(4)}
        assert fwd == want
        assert rec == want
        assert bwd == want
        assert prog.layers == tuple(range(prog.stage * 4, prog.stage * 4 + 4))


def _tp_colls(prog: Program, phase: str, layer: int) -> list[str]:
    return [
        i.collective
        for i in prog.instrs
        if i.kind == Kind.COLLECTIVE
        and i.group == "tp"
        and i.phase == phase
        and i.layer == layer
        and i.microbatch == 0
    ]


def test_tp_collectives_mirror_in_backward() -> None:
    model = tiny()
    par, train, lay = setup(4, tp=4, recompute="none")
    prog = build_programs(model, par, train, lay)[0]
    assert _tp_colls(prog, Phase.FORWARD, 3) == ["all_gather", "reduce_scatter"] * 2
    assert _tp_colls(prog, Phase.BACKWARD, 3) == ["all_gather", "reduce_scatter"] * 2
    sizes = {i.nbytes for i in prog.instrs if i.group == "tp" and i.layer == 3}
    assert sizes == {256 * 512 * 2}
    par, train, lay = setup(4, tp=4, recompute="none", sequence_parallel=False)
    prog = build_programs(model, par, train, lay)[0]
    assert _tp_colls(prog, Phase.FORWARD, 3) == ["all_reduce"] * 2
    assert _tp_colls(prog, Phase.BACKWARD, 3) == ["all_reduce"] * 2
    par, train, lay = setup(4, recompute="none")
    prog = build_programs(model, par, train, lay)[0]
    assert not [i for i in prog.instrs if i.kind == Kind.COLLECTIVE]


def test_cp_gathers_kv() -> None:
    model = tiny()
    for recompute, bwd_gathers in (("none", 1), ("selective", 0), ("full", 0)):
        par, train, lay = setup(8, tp=2, cp=2, recompute=recompute)
        prog = build_programs(model, par, train, lay)[0]
        colls = [
            (i.phase, i.collective, i.nbytes)
            for i in prog.instrs
            if i.group == "cp" and i.layer == 0 and i.microbatch == 0
        ]
        # cp * T (= s/cp) * (K and V) * local KV heads * head dim * 2 B: the whole sequence
        kv_bytes = 2 * 128 * 2 * (4 // 2) * 64 * 2
        assert (Phase.FORWARD, "all_gather", kv_bytes) in colls
        assert (Phase.BACKWARD, "reduce_scatter", kv_bytes) in colls
        assert colls.count((Phase.BACKWARD, "all_gather", kv_bytes)) == bwd_gathers
        recompute_gathers = colls.count((Phase.RECOMPUTE, "all_gather", kv_bytes))
        assert recompute_gathers == (0 if recompute == "none" else 1)


def test_cp_ranks_reduce_gradients_with_dp() -> None:
    """CP ranks hold the same weights: gradients go over dp x cp (Megatron's group with
    CP), also at dp 1, and ZeRO-1 shards the optimizer over it."""
    from clustersim.workload.dims import optimizer_params

    model = tiny()
    for dp, zero in ((2, 1), (1, 1), (2, 0)):
        par, train, lay = setup(2 * 2 * dp, tp=2, cp=2, dp=dp, zero=zero)
        assert lay.grad_group(zero) == "dp_cp" and lay.grad_size(zero) == 2 * dp
        assert lay.group("dp_cp", 0) == tuple(range(0, 4 * dp, 2))  # tp apart
        prog = build_programs(model, par, train, lay)[0]
        op = "reduce_scatter" if zero else "all_reduce"
        groups = {i.group for i in prog.instrs if i.collective == op and i.phase == Phase.GRAD_SYNC}
        assert "dp_cp" in groups and "dp" not in groups
        full = optimizer_params(model, lay, 0, 0)
        assert optimizer_params(model, lay, 0, zero) == (-(-full // (2 * dp)) if zero else full)
    par, train, lay = setup(8, tp=2, dp=4)
    assert lay.grad_group(1) == "dp"  # without CP, DP alone


# Per-rank parameters of tiny() at tp=1, by piece (see clustersim.workload.dims).
_TINY_PIECES = {
    "mlp.down": 1536 * 512,
    "mlp.up": 512 * 2 * 1536,
    "mlp.norm": 512,
    "attn.out": 512 * 512,
    "attn.qkv": 512 * (8 + 2 * 4) * 64,
    "attn.norm": 512,
    "lm_head": 4096 * 512,
    "final_norm": 512,
    "embed": 4096 * 512,
}
_COMPLETES = {
    ("mlp.down.wgrad", Phase.BACKWARD): "mlp.down",
    ("mlp.up.wgrad", Phase.BACKWARD): "mlp.up",
    ("mlp.norm", Phase.BACKWARD): "mlp.norm",
    ("attn.out.wgrad", Phase.BACKWARD): "attn.out",
    ("attn.qkv.wgrad", Phase.BACKWARD): "attn.qkv",
    ("attn.norm", Phase.BACKWARD): "attn.norm",
    ("lm_head.wgrad", Phase.BACKWARD): "lm_head",
    ("final_norm", Phase.BACKWARD): "final_norm",
    ("embed", Phase.BACKWARD): "embed",
}


def _tiny_buckets(stage: int, *, shared_embedding: bool = False) -> list[float]:
    """Hand count: tiny()'s 1 MiB buckets over pp 2, in gradient order."""
    b = {k: 2.0 * v for k, v in _TINY_PIECES.items()}
    down, up, attn, norm = b["mlp.down"], b["mlp.up"], b["attn.out"] + b["attn.qkv"], b["attn.norm"]
    layer = [up, b["mlp.norm"] + attn]  # after the down projection
    if stage == 1:  # the head, then layers 7..4
        body = [b["lm_head"], b["final_norm"] + down, *layer]
        return body + [norm + down, *layer] * 3 + [norm]
    tail = [norm, b["embed"]] if shared_embedding else [norm + b["embed"]]
    return [down, *layer] + [norm + down, *layer] * 3 + tail


@pytest.mark.parametrize("zero", [0, 1])
def test_dp_buckets(zero: int) -> None:
    model = tiny()
    bucket = 2**20
    par, train, lay = setup(8, pp=2, zero=zero, grad_bucket_bytes=bucket)
    n_mb = microbatches(par, train, lay)
    for prog in build_programs(model, par, train, lay):
        params = rank_param_count(model, lay, prog.stage)
        grads = 2 * params
        buckets = [i for i in prog.instrs if i.kind == Kind.ASYNC_COLLECTIVE]
        assert {i.collective for i in buckets} == {"reduce_scatter" if zero else "all_reduce"}
        assert {(i.group, i.phase) for i in buckets} == {("dp", Phase.GRAD_SYNC)}
        assert sum(i.nbytes for i in buckets) == grads
        # Whole parameters, as Megatron-Core cuts them: a bucket closes after the
        # parameter that brings it to 1 MiB (the LM head and the embedding, 4 MiB, the
        # MLP's up projection, 3 MiB, alone; the 1 KiB attention norm opens the next).
        assert [i.nbytes for i in buckets] == _tiny_buckets(prog.stage)
        # A bucket starts once its gradients are complete, and as soon as they are,
        # during the last microbatch's backward.
        done = started = 0.0
        for ins in prog.instrs:
            if ins.kind == Kind.ASYNC_COLLECTIVE:
                assert ins.microbatch == n_mb - 1
                started += ins.nbytes
                assert started <= done
                continue
            if ins.kind == Kind.COMPUTE:  # every ready bucket was started before this op
                assert done - started < bucket or (done == grads and started == grads)
            if ins.microbatch == n_mb - 1:
                piece = _COMPLETES.get((ins.name, ins.phase))
                if piece is not None:
                    done += 2 * _TINY_PIECES[piece]
        assert started == grads
        # Buckets overlap with backward compute that follows them.
        first = next(n for n, i in enumerate(prog.instrs) if i.kind == Kind.ASYNC_COLLECTIVE)
        assert any(i.phase == Phase.BACKWARD for i in prog.instrs[first:])
        tail = prog.instrs[-(1 + (len(buckets) if zero else 0)) - 1 :]
        assert tail[0].kind == Kind.WAIT_ASYNC
        opt = tail[1]
        assert (opt.name, opt.phase, opt.layer) == ("optimizer", Phase.OPTIMIZER, -1)
        assert opt.work is not None
        shard = math.ceil(params / 4) if zero else params
        assert opt.work.hbm_bytes == 28 * shard
        gathers = [i for i in prog.instrs if i.phase == Phase.PARAM_SYNC]
        if zero:
            assert [i.collective for i in gathers] == ["all_gather"] * len(buckets)
            assert sum(i.nbytes for i in gathers) == grads
        else:
            assert not gathers


def test_no_dp_collectives_with_dp_1() -> None:
    par, train, lay = setup(4, tp=4, zero=1)
    prog = build_programs(tiny(), par, train, lay)[0]
    assert not [i for i in prog.instrs if i.group == "dp" or i.kind == Kind.WAIT_ASYNC]
    assert prog.instrs[-1].name == "optimizer"


def test_instruction_fields() -> None:
    par, train, lay = setup(4, pp=2, global_batch_size=4)
    first, last = build_programs(tiny(), par, train, lay)
    assert first.instrs[0].name == "embed" and first.instrs[0].layer == -1
    names = {i.name for i in last.instrs if i.layer == -1 and i.kind == Kind.COMPUTE}
    assert {"final_norm", "lm_head", "loss", "lm_head.dgrad", "optimizer"} <= names
    for prog in (first, last):
        for ins in prog.instrs:
            if ins.kind == Kind.COMPUTE:
                assert ins.work is not None
            if ins.layer >= 0:
                assert ins.layer in prog.layers
            if ins.phase in (Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE):
                assert 0 <= ins.microbatch < 4


def test_works_are_shared_and_build_is_fast() -> None:
    model = llama3_70b()
    par, train, lay = setup(
        256, tp=8, pp=4, seq_len=8192, global_batch_size=512, recompute="selective"
    )
    assert microbatches(par, train, lay) == 64
    t0 = time.perf_counter()
    programs = build_programs(model, par, train, lay)
    elapsed = time.perf_counter() - t0
    for prog in programs:
        works = {id(i.work) for i in prog.instrs if i.work is not None}
        assert len(works) < 50  # independent of layers and microbatches
    assert elapsed < 2.0  # about 0.2 s on a laptop; generous for slow CI machines
