"""What a tensor-parallel sublayer's backward overlaps, by the stack's rule (workload.tp_comm)."""

from __future__ import annotations

from typing import Any

import pytest

from clustersim.catalog.stacks import stack_fit
from clustersim.scenario import load_scenario
from clustersim.sim import simulate
from clustersim.workload import Kind, build_programs
from clustersim.workload.dims import make_dims
from clustersim.workload.ops import attention_part, mlp_part
from clustersim.workload.program import Phase

from .helpers import setup, tiny

MARK = {Kind.ASYNC_COLLECTIVE: ">", Kind.WAIT_ASYNC: "<"}


def _part(rule: str, part: str = "mlp", sp: bool = True) -> Any:
    par, train, layout = setup(8, tp=4, sequence_parallel=sp, tp_comm_overlap=rule)
    dm = make_dims(tiny(), par, train, layout)
    return mlp_part(dm, "bf16") if part == "mlp" else attention_part(dm, "bf16", "selective")


def _bwd(rule: str, part: str = "mlp", sp: bool = True) -> list[str]:
    """The sublayer's backward as names, async starts as ``>name`` and waits as ``<name``."""
    return [MARK.get(t[0], "") + t[1] for t in _part(rule, part, sp).bwd]


def _fwd(rule: str, part: str = "mlp", sp: bool = True) -> list[str]:
    """The sublayer's forward, marked as ``_bwd``."""
    return [MARK.get(t[0], "") + t[1] for t in _part(rule, part, sp).forward(Phase.FORWARD)]


def test_blocking_keeps_every_tp_collective_in_line() -> None:
    assert _bwd("blocking") == [
        "mlp.residual", "tp.all_gather", "mlp.down.dgrad", "mlp.down.wgrad", "mlp.act",
        "mlp.up.dgrad", "mlp.up.wgrad", "tp.reduce_scatter", "mlp.norm",
    ]  # fmt: skip


def test_backward_runs_the_regather_under_dgrad_and_the_reduce_scatter_under_wgrad() -> None:
    # Megatron-Core's LinearWithGradAccumulationAndAsyncCommunication.backward
    assert _bwd("backward") == [
        "mlp.residual", "tp.all_gather", "mlp.down.dgrad", "mlp.down.wgrad", "mlp.act",
        ">tp.all_gather.input", "mlp.up.dgrad", "<tp.wait.input", ">tp.reduce_scatter",
        "mlp.up.wgrad", "<tp.wait", "mlp.norm",
    ]  # fmt: skip


def test_dataflow_runs_both_weight_gradients_under_the_reduce_scatter() -> None:
    assert _bwd("dataflow", "attn") == [
        "attn.residual", "tp.all_gather", ">tp.all_gather.input", "attn.out.dgrad",
        "attn.core.bwd.qk_dp", "attn.core.bwd.softmax", "attn.core.bwd.dq",
        "attn.core.bwd.dkv", "attn.rope", "attn.qkv.dgrad", "<tp.wait.input",
        ">tp.reduce_scatter", "attn.out.wgrad", "attn.qkv.wgrad", "<tp.wait", "attn.norm",
    ]  # fmt: skip


def test_without_sequence_parallelism_the_all_reduce_overlaps_and_nothing_is_regathered() -> None:
    assert _bwd("backward", sp=False) == [
        "mlp.residual", "mlp.down.dgrad", "mlp.down.wgrad", "mlp.act", "mlp.up.dgrad",
        ">tp.all_reduce", "mlp.up.wgrad", "<tp.wait", "mlp.norm",
    ]  # fmt: skip


def test_userbuffers_runs_every_tp_collective_under_a_gemm() -> None:
    # Transformer Engine's userbuffers: ring-exchange all-gathers, pipelined reduce-scatters
    assert _fwd("userbuffers") == [
        "mlp.norm", ">tp.all_gather.ring", "mlp.up", "<tp.wait.ring", "mlp.act",
        ">tp.reduce_scatter.pipe", "mlp.down", "<tp.wait.pipe", "tp.reduce_scatter",
        "mlp.residual",
    ]  # fmt: skip
    assert _bwd("userbuffers") == [
        "mlp.residual", ">tp.all_gather.grad", "mlp.down.dgrad", "<tp.wait.grad",
        "mlp.down.wgrad", "mlp.act", ">tp.all_gather.input", "mlp.up.dgrad", "<tp.wait.input",
        ">tp.reduce_scatter", "mlp.up.wgrad", "<tp.wait", "mlp.norm",
    ]  # fmt: skip
    # the last chunk's reduce-scatter is left after the GEMM: 1/tp of the bytes
    fwd = _part("userbuffers").forward(Phase.FORWARD)
    whole = next(t for t in _part("blocking").forward(Phase.FORWARD) if t[1] == "tp.reduce_scatter")
    pipe = next(t for t in fwd if t[1] == "tp.reduce_scatter.pipe")
    tail = next(t for t in fwd if t[1] == "tp.reduce_scatter")
    nbytes = [x for x in whole if isinstance(x, float)]
    assert [x for x in pipe if isinstance(x, float)] == [nbytes[0] * 3 / 4]
    assert [x for x in tail if isinstance(x, float)] == [nbytes[0] / 4]
    # without sequence parallelism it is backward's rule
    assert _fwd("userbuffers", sp=False) == _fwd("backward", sp=False)
    assert _bwd("userbuffers", sp=False) == _bwd("backward", sp=False)


@pytest.mark.parametrize("rule", ["blocking", "backward", "dataflow", "userbuffers"])
def test_gradients_are_ready_after_their_weight_gradient(rule: str) -> None:
    par, train, layout = setup(8, tp=4, tp_comm_overlap=rule)
    dm = make_dims(tiny(), par, train, layout)
    for p in (mlp_part(dm, "bf16"), attention_part(dm, "bf16", "selective")):
        for i, pieces in p.ready.items():
            name = p.bwd[i][1]
            assert all(name == f"{piece}.wgrad" or piece.endswith("norm") for piece in pieces)


@pytest.mark.parametrize("rule", ["blocking", "backward", "dataflow", "userbuffers"])
def test_programs_carry_the_same_work_under_every_rule(rule: str) -> None:
    par, train, layout = setup(8, tp=4, tp_comm_overlap=rule)
    progs = build_programs(tiny(), par, train, layout)
    flops = sum(i.work.tensor_flops for p in progs for i in p.instrs if i.work is not None)
    base, _, base_layout = setup(8, tp=4, tp_comm_overlap="blocking")
    ref = build_programs(tiny(), base, train, base_layout)
    assert flops == sum(i.work.tensor_flops for p in ref for i in p.instrs if i.work is not None)
    # Every async TP collective is waited for inside its backward.
    for p in progs:
        started = [i for i in p.instrs if i.kind == Kind.ASYNC_COLLECTIVE and i.group == "tp"]
        waits = [i for i in p.instrs if i.kind == Kind.WAIT_ASYNC and i.group == "tp"]
        assert len(started) == len(waits)
        assert all(i.phase == Phase.BACKWARD for i in started) or rule == "userbuffers"


SCENARIO = """
name: tp-overlap
cluster: {instance: trn1.32xlarge, count: 1}
model: {name: tiny, layers: 4, hidden: 2048, heads: 16, kv_heads: 8, ffn_hidden: 8192,
        vocab: 8192, max_seq_len: 4096}
parallelism: {tp: 8, microbatch_size: 1}
training: {seq_len: 4096, global_batch_size: 8}
output: {trace: false, html: false}
"""


def _step(*sets: str) -> dict[str, Any]:
    return simulate(load_scenario(SCENARIO, list(sets)), record=False).summary


def test_stack_rule_is_the_default_and_the_scenario_key_wins() -> None:
    assert stack_fit("trn1", None).tp_comm_overlap == "dataflow"  # nxd-training
    assert stack_fit("h100", None).tp_comm_overlap == "backward"  # megatron-core
    assert stack_fit("a100", "megatron-lm-sc21").tp_comm_overlap == "blocking"
    assert stack_fit("h100", "nemo-24.07").tp_comm_overlap == "userbuffers"  # its own
    assert stack_fit("h100", "megatron-bridge-25.09").tp_comm_overlap == "userbuffers"  # base's
    res = load_scenario(SCENARIO, [])
    assert res.scenario.parallelism.tp_comm_overlap == "dataflow"
    res = load_scenario(SCENARIO, ["parallelism.tp_comm_overlap=blocking"])
    assert res.scenario.parallelism.tp_comm_overlap == "blocking"


def test_overlap_hides_what_the_weight_gradients_cover_and_no_more() -> None:
    blocking = _step("parallelism.tp_comm_overlap=blocking")
    dataflow = _step("parallelism.tp_comm_overlap=dataflow")
    assert dataflow["breakdown_s"]["compute"] == pytest.approx(blocking["breakdown_s"]["compute"])
    saved = blocking["step_time_s"] - dataflow["step_time_s"]
    # At most the weight-gradient GEMMs' time can hide a collective: half the backward's
    # linear-layer work, a third of the step's GEMMs (forward, dgrad, wgrad).
    assert 0 < saved < blocking["breakdown_s"]["compute"] / 3
    assert dataflow["breakdown_s"]["exposed_comm"] < blocking["breakdown_s"]["exposed_comm"]


def test_userbuffers_hides_forward_collectives_under_their_gemms() -> None:
    backward = _step("parallelism.tp_comm_overlap=backward")
    ub = _step("parallelism.tp_comm_overlap=userbuffers")
    # the chunked GEMMs, tp of them a sequence shard each, run a little below the whole
    # GEMMs' per-shape efficiency (Trainium's tiled kernels)
    compute = ub["breakdown_s"]["compute"], backward["breakdown_s"]["compute"]
    assert compute[1] <= compute[0] == pytest.approx(compute[1], rel=1e-3)
    assert ub["step_time_s"] < backward["step_time_s"]
    assert ub["breakdown_s"]["exposed_comm"] < backward["breakdown_s"]["exposed_comm"]


def _layers_in_order(rule: str, recompute: str, zero: int = 1) -> list[tuple[int, str]]:
    """(layer, phase) of each compute op of microbatch 0's backward on stage 0."""
    par, train, layout = setup(8, tp=4, tp_comm_overlap=rule, recompute=recompute, zero=zero)
    (prog,) = build_programs(tiny(layers=3), par, train, layout)
    ops = [i for i in prog.instrs if i.microbatch == 0 and i.layer >= 0]
    return [(i.layer, i.phase) for i in ops if i.kind == Kind.COMPUTE and i.phase != Phase.FORWARD]


def test_full_recompute_runs_beside_the_next_backward_under_dataflow() -> None:
    """The Neuron compiler orders work by dependencies only: layer l - 1's recomputed
    forward (its saved input) runs beside layer l's backward (workload.overlap)."""
    R, B = Phase.RECOMPUTE, Phase.BACKWARD
    seq = _layers_in_order("dataflow", "full")
    first_bwd = {lay: seq.index((lay, B)) for lay in range(3)}
    last_rec = {lay: max(k for k, x in enumerate(seq) if x == (lay, R)) for lay in range(3)}
    first_rec = {lay: seq.index((lay, R)) for lay in range(3)}
    assert first_rec[2] == 0 and last_rec[2] < first_bwd[2]  # the first one alone
    for lay in (1, 0):  # the others start inside the backward of the layer after them
        assert first_bwd[lay + 1] < first_rec[lay] < last_rec[lay] < first_bwd[lay]
    # in line under the other rules, and under ZeRO-3 (its parameter gathers)
    for rule, zero in (("backward", 1), ("blocking", 1), ("dataflow", 3)):
        seq = _layers_in_order(rule, "full", zero)
        for lay in range(3):
            recs = [k for k, x in enumerate(seq) if x == (lay, R)]
            bwds = [k for k, x in enumerate(seq) if x == (lay, B)]
            assert recs == list(range(recs[0], recs[0] + len(recs))) and recs[-1] + 1 == bwds[0]


def test_recompute_beside_the_backward_hides_its_collectives() -> None:
    beside = _step("parallelism.recompute=full")
    in_line = _step("parallelism.recompute=full", "parallelism.tp_comm_overlap=backward")
    assert beside["breakdown_s"]["compute"] == pytest.approx(in_line["breakdown_s"]["compute"])
    assert beside["breakdown_s"]["exposed_comm"] < in_line["breakdown_s"]["exposed_comm"]
    assert beside["step_time_s"] < in_line["step_time_s"]


def test_recompute_beside_holds_a_second_recomputed_layer() -> None:
    from clustersim.workload.memory import layer_activation_bytes, memory_per_rank

    got = {}
    for rule in ("dataflow", "backward"):
        par, train, layout = setup(8, tp=4, tp_comm_overlap=rule, recompute="full")
        got[rule] = memory_per_rank(tiny(), par, train, layout, 0).activations
    dm = make_dims(tiny(), par, train, layout)
    extra = layer_activation_bytes(dm, "none") - layer_activation_bytes(dm, "full")
    assert got["dataflow"] - got["backward"] == pytest.approx(extra)


def test_userbuffers_chunks_the_gemms_it_overlaps() -> None:
    """A ring exchange runs its GEMM as tp chunks, the pipelined reduce-scatter as
    Transformer Engine's num_splits; the other rules leave GEMMs whole."""
    from clustersim.workload.tp_comm import PIPELINE_SPLITS

    def splits(rule: str) -> dict[str, int]:
        part = _part(rule)
        tpls = [*part.forward(Phase.FORWARD), *part.bwd]
        return {t[1]: t[3].splits for t in tpls if t[3] is not None and t[3].matmul is not None}

    ub = splits("userbuffers")
    assert ub["mlp.up"] == 4 and ub["mlp.down.dgrad"] == 4  # tp = 4
    assert ub["mlp.down"] == PIPELINE_SPLITS
    assert ub["mlp.up.wgrad"] == ub["mlp.down.wgrad"] == ub["mlp.up.dgrad"] == 1
    assert set(splits("backward").values()) == {1}
