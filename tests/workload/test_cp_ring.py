"""Context-parallel attention as Transformer Engine's ring runs it (``workload.cp_ring``)."""

from __future__ import annotations

import pytest

from clustersim.scenario import load_scenario
from clustersim.workload import Kind, Phase, build_programs
from clustersim.workload.cp_ring import attention_step, ring_core, ring_steps, shift_bytes
from clustersim.workload.program import Instr

from .helpers import setup, tiny


@pytest.mark.parametrize(("seq", "cp"), [(8192, 2), (8192, 4), (4096, 8), (256, 3 * 2)])
def test_ring_flops_equal_the_causal_count(seq: int, cp: int) -> None:
    """The diagonal step (causal, 2c x 2c) and cp - 1 off-diagonal steps (2c x c or c x 2c)
    do (s/cp) x s/2 scores per head, the unsplit causal core's: 4 b a (s/cp)(s/2) d FLOPs
    forward (QK^T and PV) and 10 b a (s/cp)(s/2) d backward (five matmuls)."""
    b, a, g, d = 2, 8, 2, 64
    seq -= seq % (2 * cp)
    core, bwd = ring_core(b, seq, cp, a, prec="bf16", qk_dim=d, v_dim=d, kv_heads=g)
    fwd = core(Phase.FORWARD)
    scores = b * a * (seq // cp) * (seq / 2)
    assert sum(_flops(t) for t in fwd) == pytest.approx(4 * scores * d, rel=1e-12)
    assert sum(_flops(t) for t in bwd) == pytest.approx(10 * scores * d, rel=1e-12)
    whole = attention_step(
        b, a, seq // cp, seq, causal=True, prec="bf16", qk_dim=d, v_dim=d, kv_heads=g
    )
    assert sum(w.tensor_flops for w in whole.works()) == pytest.approx(14 * scores * d)


def test_ring_steps_balance_the_causal_chunks() -> None:
    # chunks of s / 2cp = 512 rows: the diagonal over both local chunks, then the halves
    assert ring_steps(4096, 4) == [
        (1024, 1024, True),
        (1024, 512, False),
        (512, 1024, False),
        (1024, 512, False),
    ]


def test_ring_transfers_overlap_each_step() -> None:
    """Forward: cp - 1 K and V messages, each started before a step and waited for before
    the next; backward: cp messages (K and V, then K, V, dK and dV, then dK and dV)."""
    b, s, cp, a, g, d = 1, 1024, 4, 8, 2, 64
    core, bwd = ring_core(b, s, cp, a, prec="bf16", qk_dim=d, v_dim=d, kv_heads=g)
    kv = 2.0 * b * (s // cp) * g * 2 * d  # the rank's K and V, bf16
    fwd = core(Phase.FORWARD)
    starts = [t[6] for t in fwd if t[0] == Kind.ASYNC_COLLECTIVE]
    assert starts == [shift_bytes(kv, cp)] * (cp - 1)
    assert shift_bytes(kv, 2) == 2 * kv  # cp = 2: the pairwise exchange, an all-gather
    assert [t[0] for t in fwd].count(Kind.WAIT_ASYNC) == cp - 1
    assert not [t for t in (*fwd, *bwd) if t[0] == Kind.COLLECTIVE]
    sent = [t[6] / shift_bytes(1.0, cp) for t in bwd if t[0] == Kind.ASYNC_COLLECTIVE]
    assert sent == [kv, 2 * kv, 2 * kv, kv]
    # each wait comes after a step's kernels, before the next transfer starts
    kinds = [t[0] for t in bwd]
    for i, k in enumerate(kinds):
        if k == Kind.ASYNC_COLLECTIVE:
            nxt = kinds.index(Kind.WAIT_ASYNC, i)
            assert Kind.COMPUTE in kinds[i:nxt] and Kind.ASYNC_COLLECTIVE not in kinds[i + 1 : nxt]
    merges = [t for t in fwd if t[1] == "attn.core.merge"]
    assert len(merges) == cp and all(t[3] is not None and t[3].matmul is None for t in merges)


def _layer0(instrs: list[Instr]) -> list[Instr]:
    return [i for i in instrs if i.layer == 0 and i.microbatch == 0]


def test_p2p_lowering_in_programs() -> None:
    model = tiny()
    par, train, lay = setup(8, tp=2, cp=2, cp_comm_type="p2p", recompute="selective")
    prog = build_programs(model, par, train, lay)[0]
    mine = _layer0(prog.instrs)
    cp = [(i.kind, i.phase) for i in mine if i.group == "cp"]
    # a forward step and the recompute each exchange K and V once; the backward twice
    assert cp.count((Kind.ASYNC_COLLECTIVE, Phase.FORWARD)) == 1
    assert cp.count((Kind.ASYNC_COLLECTIVE, Phase.RECOMPUTE)) == 1
    assert cp.count((Kind.ASYNC_COLLECTIVE, Phase.BACKWARD)) == 2
    assert not [k for k, _ in cp if k == Kind.COLLECTIVE]
    assert sum(1 for i in mine if i.name == "attn.core.qk" and i.phase == Phase.FORWARD) == 2
    # the default keeps one kernel over K and V all-gathered once
    par, train, lay = setup(8, tp=2, cp=2, recompute="selective")
    prog = build_programs(model, par, train, lay)[0]
    assert [i.kind for i in _layer0(prog.instrs) if i.group == "cp"] == [Kind.COLLECTIVE] * 3


def _flops(tpl: tuple[object, ...]) -> float:
    work = tpl[3]
    return float(getattr(work, "tensor_flops", 0.0) or 0.0)


CP_SCENARIO = """
name: cp-rule
cluster: {instance: p5.48xlarge, count: 1}
model: {name: tiny, layers: 2, hidden: 1024, heads: 8, kv_heads: 8, ffn_hidden: 4096,
        vocab: 8192, max_seq_len: 8192}
parallelism: {tp: 1, cp: 2, microbatch_size: 1}
training: {seq_len: 8192, global_batch_size: 8}
"""


@pytest.mark.parametrize(
    ("stack", "rule"),
    [
        (None, "p2p"),  # megatron-core, the H100 family's default stack
        ("nemo-24.07", "p2p"),  # its base's rule
        ("megatron-bridge-25.09", "p2p"),  # its base's (megatron-bridge-25.11)
        ("torchtitan", "all_gather"),  # PyTorch's allgather rotation
        ("meta-llama3", "all_gather"),  # the Llama 3 paper's all-gather CP
    ],
)
def test_cp_comm_type_is_the_stack_rule_and_the_scenario_key_wins(
    stack: str | None, rule: str
) -> None:
    sets = [] if stack is None else [f"software.stack={stack}"]
    res = load_scenario(CP_SCENARIO, sets)
    assert res.software.cp_comm_type == rule
    assert res.scenario.parallelism.cp_comm_type == rule
    other = "all_gather" if rule == "p2p" else "p2p"
    res = load_scenario(CP_SCENARIO, [*sets, f"parallelism.cp_comm_type={other}"])
    assert res.scenario.parallelism.cp_comm_type == other
    trn1 = load_scenario(CP_SCENARIO.replace("p5.48xlarge", "trn1.32xlarge"), [])
    assert trn1.scenario.parallelism.cp_comm_type == "all_gather"  # nxd-training names none
