"""Mixture-of-experts serving: the routed experts' closed forms and measured kernels."""

from __future__ import annotations

import numpy as np
import pytest

from clustersim import catalog
from clustersim.errors import ScenarioError
from clustersim.hardware.chip import ChipModel
from clustersim.hardware.moe_kernels import moe_table
from clustersim.scenario import load_scenario
from clustersim.serve.iteration import OPS_PER_LAYER, IterationModel
from clustersim.serve.moe import experts_of
from clustersim.serve.run import iteration_model, serve, serving_of


def scenario(model: str, instance: str, tp: int, ep: int, engine: str, **serving: object) -> str:
    keys = {"arrival": "{kind: closed, concurrency: 4}", "requests": 16, "max_num_seqs": 4}
    body = "".join(f"  {k}: {v}\n" for k, v in {**keys, **serving}.items())
    return (
        f"name: moe-serve\ncluster: {{instance: {instance}}}\nmodel: {model}\n"
        f"parallelism: {{tp: {tp}, ep: {ep}}}\nserving:\n  engine: {engine}\n{body}"
    )


def test_active_experts_and_pairs_follow_uniform_routing() -> None:
    """An expert is idle with probability (1 - k/E)^T; a rank holds E/ep of them."""
    e = experts_of(catalog.model("qwen3-235b-a22b"), tp=8, ep=4, weight_bytes=1)
    assert e is not None
    assert (e.local, e.moe_tp) == (32, 2)
    assert e.active(1) == pytest.approx(32 * 8 / 128, rel=1e-12)
    assert e.active(64) == pytest.approx(32 * (1 - (1 - 8 / 128) ** 64), rel=1e-12)
    assert e.active(100_000) == pytest.approx(32, rel=1e-9)
    assert e.pairs(3) == 6  # 3 x 8 / 4
    # gate and up fused, then down, each expert's width split moe_tp ways
    assert e.gemms == ((4096, 2 * 768), (768, 4096))
    assert e.bytes_per_rank == 32 * 3 * 4096 * 768


def test_moe_weights_per_rank_are_attention_router_and_local_experts() -> None:
    model = catalog.model("mixtral-8x7b")
    assert model.moe is not None
    tp, ep = 8, 4
    it = IterationModel(model, ChipModel(catalog.chip("trn2"), 2), tp, ep=ep)
    h, hd = model.hidden, model.head_dim
    q, kv = model.heads * hd // tp, model.kv_heads * hd // tp
    attention = h * (q + 2 * kv) + q * h + h * model.moe.experts
    experts = model.moe.experts // ep * 3 * h * model.moe.expert_ffn_hidden // (tp // ep)
    lm_head = h * model.vocab // tp
    expected = 2 * (model.layers * (attention + experts) + 2 * lm_head)
    assert it.weight_bytes_per_rank == expected
    # about the model's 46.7 B parameters over 8 ranks in BF16
    assert it.weight_bytes_per_rank * tp / 2 == pytest.approx(46.7e9, rel=0.02)


def test_trainium_batch_one_moe_decode_reads_top_k_experts_once() -> None:
    """At batch 1 a token touches top_k experts: a rank streams the attention and router
    weights and k/ep experts' shards on average, on the HBM roofline plus fixed costs
    and the decode attention's instructions."""
    spec = catalog.chip("trn2")
    chip = ChipModel(spec, 2)
    model = catalog.model("mixtral-8x7b")
    assert model.moe is not None
    tp, ep, ar_s, context = 8, 8, 6e-6, 500
    it = IterationModel(model, chip, tp, ep=ep, allreduce_s=lambda _n: ar_s)
    e = it.experts
    assert e is not None
    hbm_Bps = spec.hbm_bw_Bps * spec.calibration.hbm_efficiency * 2 / spec.cores
    h, hd = model.hidden, model.head_dim
    q, kv = model.heads * hd // tp, max(model.kv_heads // tp, 1) * hd
    attention = 2 * (h * (q + 2 * kv) + q * h + h * model.moe.experts)
    experts = e.local * model.moe.top_k / model.moe.experts * e.expert_bytes
    layer_kv = (context + 1) * 2 * kv * 2
    lm_head = 2 * h * model.vocab // tp
    roofline = (model.layers * (attention + experts + layer_kv) + lm_head) / hbm_Bps
    overhead = spec.calibration.op_overhead_s
    fixed = model.layers * (OPS_PER_LAYER * overhead + 2 * ar_s) + overhead
    assert it.decode_attention is not None  # its instructions, beside the reads
    attention = model.layers * it.decode_attention(1, context + 1)
    assert it.iteration_s((), 1, context) == pytest.approx(roofline + fixed + attention, rel=1e-12)


def test_measured_moe_table_is_exact_at_its_points_and_extrapolates_as_documented() -> None:
    table = moe_table("h100")
    assert table is not None
    key = (4096, 1536, 8, 128, 1, 4)  # Qwen3-235B-A22B, TP 4 as EP 4
    lane = table.lane("trtllm", "fp8", key)
    assert lane == ("trtllm", "fp8")
    assert "power_law_1.01" in table.source(*lane)
    t64, t128 = table.time_s("trtllm", "fp8", key, 64), table.time_s("trtllm", "fp8", key, 128)
    assert t64 is not None and t128 is not None
    mid = table.time_s("trtllm", "fp8", key, 90)
    assert mid is not None and min(t64, t128) <= mid <= max(t64, t128)
    # floor below the first point, linear in tokens past the last
    assert table.time_s("trtllm", "fp8", key, 0) == 0.0
    edge = table.time_s("trtllm", "fp8", key, 16384)
    assert edge is not None
    assert table.time_s("trtllm", "fp8", key, 32768) == pytest.approx(2 * edge, rel=1e-12)
    # an unmeasured layout is None (the caller prices the experts from the GEMM tables)
    assert table.lane("trtllm", "fp8", (4096, 1536, 8, 128, 3, 1)) is None
    # decode's few tokens run near the HBM rate of the experts they touch, never above it
    spec = catalog.chip("h100")
    e = experts_of(catalog.model("qwen3-235b-a22b"), tp=4, ep=4, weight_bytes=1)
    assert e is not None
    for tokens in (8, 32, 128):
        t = table.time_s("trtllm", "fp8", key, tokens)
        assert t is not None
        assert t > e.active(tokens) * e.expert_bytes / spec.hbm_bw_Bps


def test_gpu_moe_layers_run_the_engines_measured_kernel() -> None:
    res = load_scenario(
        scenario(
            "qwen3-235b-a22b", "p5.48xlarge", 4, 4, "trtllm", precision="fp8", weight_dtype="fp8"
        )
    )
    it = iteration_model(res, serving_of(res))
    table = moe_table("h100")
    assert it.moe_table is table and it.experts is not None
    for rows in (1, 8, 96):
        expected = table.time_s("trtllm", "fp8", it.experts.key, rows) if table else None
        assert it._experts_s(rows) == (expected, 0.0)
    # a layout the table lacks falls back to the GEMM table and the experts' HBM reads
    res = load_scenario(
        scenario(
            "qwen3-235b-a22b", "p5.48xlarge", 8, 2, "trtllm", precision="fp8", weight_dtype="fp8"
        )
    )
    wide = iteration_model(res, serving_of(res))
    assert wide.experts is not None and wide.experts.key[4:] == (4, 2)
    t, streamed = wide._experts_s(8)
    assert streamed == 0.0 and t > 0


def test_moe_serving_runs_end_to_end_and_batches_cheaper_per_token() -> None:
    """More sequences in a decode step share the expert weights they touch: the step
    grows far less than the batch."""
    res = load_scenario(scenario("mixtral-8x7b", "trn2.48xlarge", 16, 8, "neuron"))
    summary = serve(res).summary
    assert summary["requests_finished"] == 16
    it = iteration_model(res, serving_of(res))
    one, many = it.iteration_s((), 1, 1000), it.iteration_s((), 32, 32000)
    assert one < many < 4 * one


@pytest.mark.parametrize(
    ("model", "tp", "ep", "match"),
    [
        ("mixtral-8x7b", 8, 3, "must divide tp 8"),
        ("qwen3-30b-a3b", 8, 16, "must divide tp 8"),
        ("llama3-8b", 8, 2, "has no experts"),
        ("mixtral-8x7b", 24, 1, "must divide the experts' width"),
    ],
)
def test_bad_expert_layouts_name_parallelism_ep(model: str, tp: int, ep: int, match: str) -> None:
    with pytest.raises(ScenarioError, match=match) as info:
        experts_of(catalog.model(model), tp, ep, 2)
    assert info.value.path == "parallelism.ep"


def test_pipeline_parallel_serving_is_refused_with_its_value() -> None:
    text = scenario("mixtral-8x7b", "trn2.48xlarge", 8, 1, "neuron").replace(
        "ep: 1", "ep: 1, pp: 2"
    )
    with pytest.raises(ScenarioError, match=r"\(got 2\)") as info:
        serve(load_scenario(text))
    assert info.value.path == "parallelism.pp"


def test_the_moe_table_files_load_for_every_gpu() -> None:
    for chip in ("a100", "h100", "h200", "b200", "gb200"):
        table = moe_table(chip)
        assert table is not None
        assert table.lane("vllm", "bf16", (4096, 14336, 2, 8, 1, 1)) is not None  # Mixtral-8x7B
    assert moe_table("trn2") is None
    assert np.isfinite(moe_table("h100").time_s("vllm", "bf16", (4096, 14336, 2, 8, 1, 1), 7))  # type: ignore[union-attr]


# -- attention data parallelism ---------------------------------------------------------


def test_attention_dp_spreads_the_experts_and_gathers_every_groups_tokens() -> None:
    """Two groups of TP 2 share EP 4: a rank holds a quarter of the experts whole, its
    experts take both groups' tokens, and each MoE layer pays one exchange of the
    gathered buffer (both groups' tokens' hidden states, BF16)."""
    model = catalog.model("qwen3-235b-a22b")
    assert model.moe is not None
    chip = ChipModel(catalog.chip("h100"), 1)
    seen: list[float] = []

    def exchange(nbytes: float) -> float:
        seen.append(nbytes)
        return 1e-4

    kw = {"precision": "fp8", "weight_dtype": "fp8", "ep": 4}
    dp = IterationModel(model, chip, 2, attention_dp=2, dp_gather_s=exchange, **kw)  # type: ignore[arg-type]
    free = IterationModel(model, chip, 2, attention_dp=2, **kw)  # type: ignore[arg-type]
    assert dp.experts is not None and (dp.experts.local, dp.experts.moe_tp) == (32, 1)
    rows, context = 8, 8 * 1024
    moe_layers = model.layers - model.moe.dense_layers
    assert dp.iteration_s((), rows, context) == pytest.approx(
        free.iteration_s((), rows, context) + moe_layers * 1e-4, rel=1e-12
    )
    assert set(seen) == {2.0 * rows * model.hidden * 2}
    # the experts see both groups' rows: the same as one group of twice the batch
    assert dp._experts_s(2 * rows) == free._experts_s(2 * rows)


def test_attention_dp_runs_a_scheduler_per_group(tmp_path: object) -> None:
    text = scenario(
        "qwen3-235b-a22b", "p5.48xlarge", 2, 8, "vllm", attention_dp=4, precision="fp8",
        weight_dtype="fp8", kv_dtype="fp8",
    )  # fmt: skip
    res = load_scenario(text, [])
    model = iteration_model(res, serving_of(res))
    assert model.attention_dp == 4 and model.experts is not None
    assert model.experts.local == 128 // 8
    summary = serve(res).summary
    assert summary["replicas"] == 4  # one replica of 8 GPUs: four groups of TP 2
    assert summary["tpot_s"]["p50"] > 0


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        (("llama3-8b", "p5.48xlarge", 2, 1, "vllm", 2), "no experts"),
        (("mixtral-8x7b", "trn2.48xlarge", 8, 8, "neuron", 2), "GPUs"),
        (("qwen3-235b-a22b", "p5.48xlarge", 4, 4, "vllm", 4), "more than the cluster.s 8"),
    ],
)
def test_attention_dp_refusals_name_the_key(
    case: tuple[str, str, int, int, str, int], needle: str
) -> None:
    model, instance, tp, ep, engine, adp = case
    res = load_scenario(scenario(model, instance, tp, ep, engine, attention_dp=adp), [])
    with pytest.raises(ScenarioError, match=needle) as err:
        serve(res)
    assert err.value.path == "serving.attention_dp"


def test_dp_exchange_grows_with_its_bytes_and_crosses_nodes_slower() -> None:
    """The all-gather and reduce-scatter across the groups: longer for more bytes, and
    over EFA (groups on two nodes) slower than over NVLink (one node)."""
    from clustersim.serve.collectives import DpGather

    def gather(count: int, tp: int, adp: int) -> DpGather:
        text = scenario("qwen3-235b-a22b", "p5.48xlarge", tp, tp * adp, "vllm")
        text = text.replace("{instance: p5.48xlarge}", f"{{instance: p5.48xlarge, count: {count}}}")
        return DpGather(load_scenario(text, []), tp, adp)

    one_node, two_nodes = gather(1, 2, 4), gather(2, 4, 4)
    small, large = 64 * 4096 * 2.0, 4096 * 4096 * 2.0
    assert 0 < one_node(small) < one_node(large)
    assert one_node(large) < two_nodes(large)
    assert gather(1, 2, 1)(large) == 0.0
