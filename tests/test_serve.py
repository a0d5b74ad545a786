"""Inference serving: closed forms of the iteration model and the request simulation."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy
from serve_helpers import Fixed

from clustersim import catalog
from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.hardware.chip import ChipModel
from clustersim.hardware.decode_kernels import decode_table
from clustersim.hardware.kernels import gemm_table
from clustersim.network.runtimes import runtime_of
from clustersim.scenario import load_scenario
from clustersim.serve.collectives import TpAllReduce, in_program_protocol
from clustersim.serve.decode_attention import DecodeAttention
from clustersim.serve.iteration import (
    GPU_SMALL_KERNELS,
    OPS_PER_LAYER,
    IterationModel,
    kv_bytes_per_token,
)
from clustersim.serve.run import budget_warning, serve, serving_of
from clustersim.serve.sched import BLOCK_TOKENS, bucket
from clustersim.serve.sim import ServeSim
from clustersim.serve.speculative import SpeculativeCost, expected_tokens_per_step

KIB = 1024


def scenario(extra: str = "", **serving: object) -> str:
    keys = {"arrival": "{kind: poisson, rate_per_s: 20}", "requests": 200, **serving}
    body = "".join(f"  {k}: {v}\n" for k, v in keys.items())
    return (
        "name: serve-test\ncluster: {instance: trn2.48xlarge}\nmodel: llama3-8b\n"
        f"parallelism: {{tp: 8}}\n{extra}serving:\n{body}"
    )


# -- KV cache arithmetic -------------------------------------------------------------


def test_kv_bytes_per_token_matches_the_references() -> None:
    """2 x layers x KV heads x head dim x bytes: 320 KiB (Llama-3-70B), 128 KiB (8B)."""
    assert kv_bytes_per_token(catalog.model("llama3-70b"), "bf16") == 320 * KIB
    assert kv_bytes_per_token(catalog.model("llama3-8b"), "bf16") == 128 * KIB
    assert kv_bytes_per_token(catalog.model("llama3-8b"), "fp8", tp=8) == 128 * KIB / 2 / 8
    # above the 8 KV heads each rank holds one head, replicated
    assert kv_bytes_per_token(catalog.model("llama3-70b"), "bf16", tp=64) == 320 * KIB / 8
    with pytest.raises(ScenarioError, match=r"parallelism\.tp"):
        kv_bytes_per_token(catalog.model("llama3-8b"), "bf16", tp=12)


def test_kv_capacity_is_hbm_left_beside_the_weights() -> None:
    res = load_scenario(scenario(requests=1))
    result = serve(res)
    s = result.summary
    hbm = res.chip.hbm_bytes / res.ranks_per_chip * 0.9
    per_token = 128 * KIB / 8
    weights = s["weights_gib_per_rank"] * 2**30
    expected = int((hbm - weights) // (BLOCK_TOKENS * per_token)) * BLOCK_TOKENS
    assert s["kv_cache_tokens_per_replica"] == expected


# -- iteration time ------------------------------------------------------------------


@pytest.mark.parametrize(("instance", "tp"), [("trn2.48xlarge", 8), ("trn1.32xlarge", 8)])
def test_batch_one_decode_is_the_hbm_roofline_plus_fixed_costs(instance: str, tp: int) -> None:
    """Batch-1 decode reads every weight and the cached KV once: (weights + KV) over the
    rank's sustained HBM bandwidth, plus the op overheads, 2 all-reduces and the decode
    attention's instructions per layer, plus one program launch per iteration
    (Trainium: one pipelined program)."""
    inst = catalog.instance(instance)
    spec = catalog.chip(inst.chip)
    lnc = spec.lnc_default
    chip = ChipModel(spec, lnc)
    model = catalog.model("llama3-8b")
    ar_s, context, launch_s = 7e-6, 1000, 2e-4
    it = IterationModel(model, chip, tp, allreduce_s=lambda _n: ar_s, launch_s=launch_s)
    hbm_Bps = spec.hbm_bw_Bps * spec.calibration.hbm_efficiency * lnc / spec.cores
    h, hd = model.hidden, model.head_dim
    q, kv = model.heads * hd // tp, model.kv_heads * hd // tp
    layer_params = h * (q + 2 * kv) + q * h + 3 * h * model.ffn_hidden // tp
    layer_kv = (context + 1) * 2 * kv * 2
    lm_head = h * model.vocab // tp * 2
    roofline = (model.layers * (2 * layer_params + layer_kv) + lm_head) / hbm_Bps
    overhead = spec.calibration.op_overhead_s
    fixed = model.layers * (OPS_PER_LAYER * overhead + 2 * ar_s * (tp > 1)) + overhead + launch_s
    group = model.heads // model.kv_heads
    attention = DecodeAttention(spec, lnc, model.kv_heads // tp, group)(1, context + 1)
    expected = roofline + fixed + model.layers * attention
    assert it.iteration_s((), 1, context) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("tp", [1, 4])
def test_gpu_decode_is_its_measured_kernels_in_sequence(tp: int) -> None:
    """On a GPU with measured kernel tables a decode layer is its four measured GEMMs
    (their weight reads inside), the measured decode attention kernel (its KV reads and
    launch inside), the other small kernels' overheads and 2 all-reduces, one after
    another; the LM head is measured."""
    spec = catalog.chip("h100")
    model = catalog.model("llama3-8b")
    table, decode = gemm_table("h100"), decode_table("h100")
    assert table is not None and decode is not None
    ar_s, context, batch = 9e-6, 3000, 8
    it = IterationModel(model, ChipModel(spec, 1), tp, allreduce_s=lambda _n: ar_s)
    h, hd = model.hidden, model.head_dim
    q, kv = model.heads * hd // tp, model.kv_heads * hd // tp
    ffn = model.ffn_hidden // tp
    gemms = sum(table.time_s(batch, k, n, "bf16") for k, n in
                ((h, q + 2 * kv), (q, h), (h, 2 * ffn), (ffn, h)))  # fmt: skip
    heads, kv_heads = model.heads // tp, model.kv_heads // tp
    layout = ("trtllm", "bf16", hd, heads, kv_heads)
    attention = decode.time_s(layout, batch, (context + batch) / batch)
    assert attention is not None
    overhead = spec.calibration.op_overhead_s
    layer = gemms + attention + (GPU_SMALL_KERNELS - 1) * overhead + 2 * ar_s * (tp > 1)
    lm_head = table.time_s(batch, h, model.vocab // tp, "bf16") + overhead
    expected = model.layers * layer + lm_head
    assert it.iteration_s((), batch, context) == pytest.approx(expected, rel=1e-12)
    # the measured kernel costs more than its KV cache read at the sustained HBM rate
    kv_read = (context + batch) * 2 * kv * 2 / (spec.hbm_bw_Bps * spec.calibration.hbm_efficiency)
    assert attention > kv_read
    # and the measured GEMMs are slower than the HBM roofline of their weights at small m
    weights = 2 * sum(k * n for k, n in it.shapes.gemms)
    assert gemms > weights / (spec.hbm_bw_Bps * spec.calibration.hbm_efficiency)


def test_prefill_grows_with_the_prompt_and_decode_with_the_batch() -> None:
    chip = ChipModel(catalog.chip("h100"), 1)
    it = IterationModel(catalog.model("llama3-8b"), chip, 1)
    assert it.iteration_s([(4096, 0)]) > 2 * it.iteration_s([(1024, 0)])
    assert it.iteration_s((), 256, 256 * 1000) > it.iteration_s((), 1, 1000)


# -- the request simulation ----------------------------------------------------------


def test_md1_mean_wait_matches_pollaczek_khinchine() -> None:
    """Poisson arrivals, batch 1, a fixed service time D: M/D/1's mean wait in queue is
    rho / (2 mu (1 - rho))."""
    service, rho = 0.01, 0.7
    rate = rho / service
    sim = ServeSim(
        [Fixed(service)], engine="vllm", max_num_seqs=1, max_num_batched_tokens=1024,
        kv_blocks=10_000, requests=60_000, input_tokens=100, output_tokens=1,
        arrival=("poisson", rate), seed=3,
    )  # fmt: skip
    reqs = sim.run()
    wait = sum(r.scheduled - r.arrival for r in reqs) / len(reqs)
    mu = 1 / service
    assert wait == pytest.approx(rho / (2 * mu * (1 - rho)), rel=0.03)
    assert all(r.finish - r.scheduled == pytest.approx(service) for r in reqs)


@pytest.mark.parametrize("engine", ["vllm", "neuron"])
def test_requests_and_tokens_are_conserved_under_kv_pressure(engine: str) -> None:
    blocks = 64 if engine == "vllm" else 4 * 15  # neuron: 4 slots of 15 blocks
    sim = ServeSim(
        [Fixed(0.01), Fixed(0.02)], engine=engine, max_num_seqs=4 if engine == "neuron" else 64,
        max_num_batched_tokens=100, kv_blocks=blocks, requests=300, input_tokens=130,
        output_tokens=100, arrival=("poisson", 50.0), seed=1,
    )  # fmt: skip
    reqs = sim.run()
    assert len(reqs) == 300
    assert all(r.generated == 100 and r.finish >= r.first_token >= r.arrival for r in reqs)
    assert sum(sum(1 for r in reqs if r.replica == i) for i in (0, 1)) == 300
    for rep in sim.replicas:
        assert rep.used_blocks == 0 and not rep.running and not rep.waiting
        assert rep.peak_blocks <= blocks
    preempted = sum(rep.preemptions for rep in sim.replicas)
    assert preempted > 0 if engine == "vllm" else preempted == 0


def test_neuron_decodes_stall_while_a_prompt_is_prefilled() -> None:
    """Two requests at once, a 300-token prompt in segments of 100: the second's three
    prefill iterations come after the first's first token and delay its second."""
    sim = ServeSim(
        [Fixed(1.0)], engine="neuron", max_num_seqs=2, max_num_batched_tokens=100,
        kv_blocks=2 * 25, requests=2, input_tokens=300, output_tokens=3,
        arrival=("closed", 2), seed=0,
    )  # fmt: skip
    first, second = sim.run()
    assert first.first_token == 3.0  # three segments of 100
    assert second.first_token == 6.0  # three more, while the first stalls
    assert first.finish == 8.0 and second.finish == 8.0  # then two decode iterations


def test_closed_loop_keeps_concurrency_requests_in_flight() -> None:
    sim = ServeSim(
        [Fixed(0.5)], engine="vllm", max_num_seqs=8, max_num_batched_tokens=10_000,
        kv_blocks=10_000, requests=12, input_tokens=10, output_tokens=2,
        arrival=("closed", 4), seed=0,
    )  # fmt: skip
    reqs = sim.run()
    assert [r.arrival for r in reqs] == [0.0] * 4 + [1.0] * 4 + [2.0] * 4


# -- scenario checks and the command -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (scenario("training: {seq_len: 8, global_batch_size: 8}\n"), "training"),
        (scenario(arrival="{kind: poisson, rate_per_s: 0}"), "serving.arrival.rate_per_s"),
        (scenario(arrival="{kind: poisson, rate_per_s: .inf}"), "serving.arrival.rate_per_s"),
        (scenario(slo="{ttft_s: 0}"), "serving.slo.ttft_s"),
        (scenario(max_num_seqs=0), "serving.max_num_seqs"),
        (scenario(replicas=9), "serving.replicas"),
        (
            scenario(disaggregation="{prefill_replicas: 3, decode_replicas: 6}"),
            "serving.disaggregation",
        ),
        (
            scenario(replicas=2, disaggregation="{prefill_replicas: 1, decode_replicas: 1}"),
            "serving",
        ),
        (
            scenario(disaggregation="{prefill_replicas: 0, decode_replicas: 1}"),
            "serving.disaggregation.prefill_replicas",
        ),
        (scenario(input_tokens=2_000_000), "model"),
        (scenario(engine="neuron", max_num_seqs=1_000_000), "serving.max_num_seqs"),
        (
            scenario()
            .replace(
                "model: llama3-8b",
                "model: {name: m, layers: 2, hidden: 768, heads: 48, kv_heads: 8, "
                "ffn_hidden: 1536, vocab: 1200, head_dim: 16}",
            )
            .replace("tp: 8", "tp: 12"),
            "parallelism.tp",
        ),
    ],
)
def test_bad_serving_input_names_the_key(text: str, key: str) -> None:
    with pytest.raises(ScenarioError) as info:
        serve(load_scenario(text))
    assert info.value.path == key


def test_a_model_that_does_not_fit_names_the_sizes() -> None:
    text = scenario().replace("llama3-8b", "llama3-70b").replace("tp: 8", "tp: 1")
    sizes = r"weights 131 GiB \+ KV of one 1152-token request 360 MiB > 21.6 GiB"
    with pytest.raises(ScenarioError, match=sizes):
        serve(load_scenario(text))


def test_serve_command_writes_summary_and_requests(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(scenario(), "utf-8")
    runs = []
    for name in ("a", "b"):
        assert main(["serve", str(path), "--out", str(tmp_path / name), "--quiet"]) == 0
        summary = json.loads((tmp_path / name / "summary.json").read_text("utf-8"))
        summary.pop("wall_s")
        runs.append(summary)
    assert runs[0] == runs[1]  # deterministic for a seed
    s = runs[0]
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(s[key]) == {"mean", "p50", "p90", "p99"}
    for key in (
        "output_tokens_per_s", "requests_per_s", "goodput_requests_per_s",
        "usd_per_million_output_tokens", "usd_per_million_input_tokens",
        "kv_cache_peak_fraction", "preemptions",
    ):  # fmt: skip
        assert key in s
    frame = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    assert len(frame) == 200 and set(frame["replica"]) <= set(range(8))
    assert main(["run", str(path), "--out", str(tmp_path / "r")]) == 2


def test_lognormal_lengths_are_drawn_per_request_within_their_bounds() -> None:
    lengths = "{kind: lognormal, median: 200, sigma: 1.0, max: 1000}"
    text = scenario(input_tokens=lengths, output_tokens=lengths, requests=400)
    frames = [serve(load_scenario(text)).requests for _ in range(2)]
    pd.testing.assert_frame_equal(frames[0], frames[1])  # one seed, one run
    frame = frames[0]
    assert frame["input_tokens"].between(1, 1000).all()
    assert frame["input_tokens"].nunique() > 100
    assert frame["input_tokens"].median() == pytest.approx(200, rel=0.15)
    assert not frame["input_tokens"].equals(frame["output_tokens"])  # separate streams
    bad = scenario(input_tokens="{kind: lognormal, median: 200, sigma: 1.0, max: 100}")
    with pytest.raises(ScenarioError) as info:
        load_scenario(bad)
    assert info.value.path.startswith("serving.input_tokens")


def test_published_rows_run_and_wire_time_is_a_lower_bound() -> None:
    """The validation rows run; without the runtime's fixed costs TPOT only falls."""
    from clustersim.serve.references import ROWS, predict

    row = next(r for r in ROWS if r.id == "S5")
    ttft, tpot = predict(row)
    wire_ttft, wire_tpot = predict(row, wire_only=True)
    assert 0 < wire_tpot < tpot and 0 < wire_ttft < ttft


def test_check_of_a_serving_scenario_runs_every_check(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(scenario(), "utf-8")
    assert main(["check", str(path)]) == 0
    path.write_text(scenario(max_num_seqs=0), "utf-8")
    assert main(["check", str(path)]) == 2


@pytest.mark.parametrize(
    "command", [["run"], ["search", "--chips", "16"], ["reliability"], ["export", "chakra"]]
)
def test_training_commands_refuse_a_serving_scenario(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(scenario(), "utf-8")
    assert main([*command, str(path), "--out", str(tmp_path / "out")]) == 2
    assert "serving: a serving scenario runs with `clustersim serve`" in capsys.readouterr().err


def test_neuron_collectives_inside_a_program_pay_no_launch_and_post_in_parallel() -> None:
    """In a compiled serving program a Neuron all-reduce pays no launch of its own (the
    iteration pays one) and posts a mesh round's messages on the rank's DMA engines
    together: ``floor(16 x lnc / message_engines)`` at once, so a TP64 mesh round of
    63 messages costs ceil(63 / lanes) postings instead of 63."""
    res = load_scenario(scenario().replace("tp: 8", "tp: 64"))
    spec = res.chip
    proto = in_program_protocol(spec, res.lnc)
    assert proto.launch_s == 0.0
    lanes = int(16 * res.lnc // spec.collectives.message_engines)
    assert proto.message_lanes == lanes
    ar = TpAllReduce(res, 64)
    assert ar.launch_s == spec.collectives.launch_s
    training = TpAllReduce(res, 64)
    training.runtime = runtime_of(spec, res.instance)  # host-launched, serial posting
    nbytes = 16 * KIB  # one decode token's activations
    saved = (63 - math.ceil(63 / lanes)) * spec.collectives.message_s
    # the mesh all-reduce: two rounds, each posting fewer messages one after another
    assert training(nbytes) - ar(nbytes) == pytest.approx(
        spec.collectives.launch_s + 2 * saved, rel=1e-6
    )


def test_neuron_buckets_are_powers_of_two_up_to_the_compiled_length() -> None:
    assert [bucket(n, 10_000) for n in (1, 128, 129, 1000, 5000, 9000, 10_000)] == [
        128, 128, 256, 1024, 8192, 10_000, 10_000,
    ]  # fmt: skip
    assert bucket(300, 200) == 300  # longer than every bucket: runs as it is


class Recorder(Fixed):
    """A fixed iteration that records what each iteration computed."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.calls: list[tuple[list[tuple[int, int]], int, int, int | None]] = []

    def iteration_s(
        self,
        chunks: Sequence[tuple[int, int]] = (),
        decodes: int = 0,
        decode_context: int = 0,
        *,
        padded_decodes: int | None = None,
    ) -> float:
        self.calls.append((list(chunks), decodes, decode_context, padded_decodes))
        return self.seconds


def test_neuron_iterations_compute_their_compiled_buckets() -> None:
    """A 300-token prompt runs in the 512 bucket; decode attends over the padded batch of
    max_num_seqs rows at the longest live sequence's bucket."""
    cost = Recorder(0.01)
    sim = ServeSim(
        [cost], engine="neuron", max_num_seqs=4, max_num_batched_tokens=2048,
        kv_blocks=4 * 40, requests=1, input_tokens=300, output_tokens=3,
        arrival=("closed", 1), slot_tokens=640,
    )  # fmt: skip
    sim.run()
    assert cost.calls[0] == ([(512, 0)], 0, 0, None)
    # decodes at 300 and 301 cached tokens: the 512 bucket, 4 padded rows
    assert cost.calls[1:] == [([], 1, 4 * 512, 4), ([], 1, 4 * 512, 4)]


def test_trtllm_schedules_a_context_whole_where_vllm_chunks_it() -> None:
    """With a 1000-token budget and one sequence decoding, vLLM fills the budget with a
    999-token chunk of the next prompt; TensorRT-LLM (no chunked context by default)
    waits for an iteration the whole prompt fits."""
    firsts = {}
    for engine in ("vllm", "trtllm"):
        cost = Recorder(0.01)
        sim = ServeSim(
            [cost], engine=engine, max_num_seqs=8, max_num_batched_tokens=1000,
            kv_blocks=10_000, requests=2, input_tokens=[500, 1000], output_tokens=[50, 5],
            arrival=("poisson", 1000.0), seed=0,
        )  # fmt: skip
        reqs = sim.run()
        assert all(r.generated == r.output_tokens for r in reqs)
        firsts[engine] = [c for call in cost.calls for c in call[0] if c[0] > 500]
    assert firsts["vllm"][0] == (999, 0)
    assert firsts["trtllm"] == [(1000, 0)]


def test_a_trtllm_budget_with_no_room_for_a_prompt_is_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prompt of the whole budget never joins a running batch (the test above), so
    prompts would run one batch at a time: the run says so and how to change it."""

    def warning(**keys: object) -> str | None:
        return budget_warning(serving_of(load_scenario(scenario("", **keys))))

    tight = {"engine": "trtllm", "max_num_seqs": 4, "input_tokens": 8192}
    assert warning(**tight) == (
        "serving.max_num_batched_tokens: 8192 leaves no room for a prompt of 8,192 tokens "
        "beside 3 decodes; TensorRT-LLM schedules a prompt whole, so it waits until the "
        "running batch drains (set it to at least 8,195 to admit prompts into a running batch)"
    )
    assert warning(**tight, max_num_batched_tokens=8195) is None
    assert warning(**(tight | {"engine": "vllm"})) is None  # chunked prefill fills the budget
    assert warning(**(tight | {"max_num_seqs": 1})) is None  # nothing else runs beside it
    path = tmp_path / "s.yaml"
    path.write_text(scenario("", **tight, requests=4))
    assert main(["serve", str(path), "--out", str(tmp_path / "out")]) == 0
    assert "warning: serving.max_num_batched_tokens: 8192" in capsys.readouterr().err


def test_gpu_tp_allreduce_is_the_engines_measured_kernel_inside_a_node() -> None:
    """A replica inside one NVLink node all-reduces with its engine's own kernel, as
    measured (vLLM's custom all-reduce, TensorRT-LLM's); across nodes, or past the
    largest size measured, NCCL's model over the fabric times it."""
    from clustersim.hardware.kernels import allreduce_table

    def replica(engine: str, tp: int, count: int = 1) -> TpAllReduce:
        text = (
            f"name: ar\ncluster: {{instance: p5.48xlarge, count: {count}}}\nmodel: llama3-70b\n"
            f"parallelism: {{tp: {tp}}}\nserving: {{engine: {engine}, "
            "arrival: {kind: poisson, rate_per_s: 5}}\n"
        )
        return TpAllReduce(load_scenario(text), tp, engine=engine)

    decode = 4 * 8192 * 2.0  # four sequences' activations, BF16
    for engine, framework in (("vllm", "vllm"), ("trtllm", None)):
        table = allreduce_table("h100", framework)
        assert table is not None
        ar = replica(engine, 4)
        assert ar.measured is table and ar.covers(decode)
        assert ar(decode) == table.time_s(4, decode)
        assert ar(decode) < ar.simulated_s(decode)  # under NCCL's protocol latencies
        past = ar.measured_max_bytes * 2.0
        assert not ar.covers(past) and ar(past) == ar.simulated_s(past)
    # vLLM's custom all-reduce takes messages up to 8 MiB; NCCL the larger ones
    assert replica("vllm", 4).measured_max_bytes == 8 * 2**20
    assert replica("trtllm", 4).measured_max_bytes == allreduce_table("h100").max_bytes  # type: ignore[union-attr]
    across = replica("vllm", 16, count=2)
    assert across.measured is None and across(decode) == across.simulated_s(decode)
    neuron = TpAllReduce(load_scenario(scenario()), 8, engine="neuron")
    assert neuron.measured is None


# -- disaggregated prefill and decode ------------------------------------------------


class DelayedKv:
    """A KV transfer that takes ``seconds`` whatever it moves."""

    def __init__(self, env: simpy.Environment, seconds: float) -> None:
        self.env, self.seconds = env, seconds
        self.moves: list[tuple[int, int, int]] = []

    def kv(self, source: int, target: int, tokens: int) -> simpy.Event:
        self.moves.append((source, target, tokens))
        return self.env.timeout(self.seconds)


@pytest.mark.parametrize("engine", ["vllm", "neuron"])
def test_disaggregated_requests_prefill_on_one_side_and_decode_on_the_other(engine: str) -> None:
    """Every request is prefilled on a prefill replica, moved once, and decoded on a
    decode replica; its TTFT is the prefill iteration plus the transfer, and each of its
    other tokens one decode iteration (a fixed iteration time, one request at a time)."""
    transfers: list[DelayedKv] = []

    def make(env: simpy.Environment) -> DelayedKv:
        transfers.append(DelayedKv(env, 0.004))
        return transfers[-1]

    sim = ServeSim(
        [Fixed(0.01)] * 5, engine=engine, max_num_seqs=4, max_num_batched_tokens=512,
        kv_blocks=4 * 40, requests=40, input_tokens=300, output_tokens=20,
        arrival=("closed", 1), slot_tokens=640, prefill_replicas=2, kv_transfer=make,
    )  # fmt: skip
    reqs = sim.run()
    assert all(r.generated == 20 for r in reqs)
    assert {r.prefill_replica for r in reqs} <= {0, 1}
    assert {r.replica for r in reqs} <= {2, 3, 4}
    assert [m[2] for m in transfers[0].moves] == [300] * 40
    for r in reqs:
        assert r.first_token - r.arrival == pytest.approx(0.01 + 0.004)
        assert r.kv_transfer_s == pytest.approx(0.004)
        assert r.finish - r.first_token == pytest.approx(19 * 0.01)


def test_disaggregated_ttft_adds_the_kv_transfer_over_the_fabric() -> None:
    """One request at a time: the disaggregated TTFT is the colocated one plus the KV's
    time on the fabric, and the bytes moved are the prompt's KV on every rank."""
    base = scenario(
        engine="neuron", max_num_seqs=1, max_num_batched_tokens=2048, requests=3,
        arrival="{kind: closed, concurrency: 1}", input_tokens=2000, output_tokens=4,
    ).replace("llama3-8b", "llama3-70b")  # fmt: skip
    plain = serve(load_scenario(base.replace("requests: 3", "requests: 3\n  replicas: 2")))
    split = serve(
        load_scenario(
            base.replace(
                "requests: 3",
                "requests: 3\n  disaggregation: {prefill_replicas: 1, decode_replicas: 1}",
            )
        )
    )
    moved = split.requests["kv_transfer_s"]
    assert (moved > 0).all()
    ttft = split.requests["ttft_s"] - plain.requests["ttft_s"]
    assert ttft.to_numpy() == pytest.approx(moved.to_numpy(), rel=1e-9)
    dis = split.summary["disaggregation"]
    per_token = 2 * 80 * 1 * 128 * 2  # llama3-70b at tp 8: one KV head a rank, bf16
    assert dis["kv_bytes_moved"] == pytest.approx(3 * 2000 * per_token * 8)


# -- speculative decoding ------------------------------------------------------------


def test_speculative_steps_emit_the_expected_accepted_length() -> None:
    """k draft tokens each accepted with probability a: a step emits (1 - a^(k+1)) / (1 - a)
    tokens on average (Leviathan et al. 2023); the simulated steps agree within 1.5%, and
    every request still ends with exactly its output tokens."""
    k, a = 4, 0.7
    sim = ServeSim(
        [Fixed(0.01)], engine="vllm", max_num_seqs=64, max_num_batched_tokens=4096,
        kv_blocks=100_000, requests=200, input_tokens=50, output_tokens=400,
        arrival=("closed", 16), speculative=(k, a), seed=5,
    )  # fmt: skip
    reqs = sim.run()
    assert all(r.generated == 400 for r in reqs)
    rep = sim.replicas[0]
    # a request's last step may be cut short by its end: about 1 token in 400, well
    # inside the tolerance
    full = rep.decode_emitted / rep.decode_steps
    expected = expected_tokens_per_step(k, a)
    assert expected == pytest.approx((1 - a**5) / (1 - a))
    assert full == pytest.approx(expected, rel=0.015)
    assert expected_tokens_per_step(3, 1.0) == 4.0


def test_a_speculative_step_is_k_draft_steps_and_one_verification_of_k_plus_1() -> None:
    target, draft = Recorder(0.02), Recorder(0.003)
    cost = SpeculativeCost(target, draft, 3)
    assert cost.iteration_s((), 2, 500, padded_decodes=4) == pytest.approx(0.02 + 4 * 0.003)
    assert target.calls == [([], 8, 500, 16)]
    assert draft.calls == [([], 0, 0, None), ([], 2, 500, 4)]


def test_a_speculative_scenario_reports_its_steps() -> None:
    text = scenario(
        speculative="{draft_model: llama3.2-1b, tokens: 5, acceptance: 0.75}", requests=40
    )
    s = serve(load_scenario(text)).summary
    spec = s["speculative"]
    assert spec["expected_tokens_per_step"] == pytest.approx((1 - 0.75**6) / 0.25)
    assert 1.0 <= spec["tokens_per_step"] <= 6.0
    plain = serve(load_scenario(scenario(requests=40))).summary
    # the draft's weights and KV take room from the target's cache
    assert s["kv_cache_tokens_per_replica"] < plain["kv_cache_tokens_per_replica"]
    with pytest.raises(ScenarioError) as info:
        serve(load_scenario(scenario(speculative="{draft_model: nope, tokens: 2, acceptance: 1}")))
    assert info.value.path == "serving.speculative.draft_model"


@pytest.mark.parametrize("engine", ["vllm", "neuron"])
def test_decode_runs_in_one_timeout_give_the_step_by_step_result(engine: str) -> None:
    """Collapsing decode iterations where nothing can change into one timeout (cut short
    by an arrival) gives every request the times the step-by-step run gives."""
    chip = ChipModel(catalog.chip("trn2"), 2)
    cost = IterationModel(catalog.model("llama3-8b"), chip, 8, allreduce_s=lambda n: 2e-5)
    frames, iterations = [], []
    for collapse in (False, True):
        sim = ServeSim(
            [cost] * 2, engine=engine, max_num_seqs=8, max_num_batched_tokens=512,
            kv_blocks=8 * 40 if engine == "neuron" else 300, requests=300,
            input_tokens=[100 + 37 * (i % 9) for i in range(300)],
            output_tokens=[20 + 13 * (i % 7) for i in range(300)],
            arrival=("poisson", 30.0), seed=2, slot_tokens=640, collapse=collapse,
        )  # fmt: skip
        reqs = sim.run()
        frames.append([(r.replica, r.first_token, r.finish, r.generated) for r in reqs])
        iterations.append(sum(r.iterations for r in sim.replicas))
    assert iterations[0] == iterations[1]
    step, run = frames
    assert [f[0] for f in run] == [f[0] for f in step]
    assert [f[3] for f in run] == [f[3] for f in step]
    assert np.allclose([f[1:3] for f in run], [f[1:3] for f in step], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("serve-*.yaml"))
)
def test_every_shipped_serving_scenario_runs(path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        main(["serve", str(path), "--out", str(out), "--quiet", "--set", "serving.requests=60"])
        == 0
    )
    s = json.loads((out / "summary.json").read_text("utf-8"))
    assert s["requests_finished"] == 60


def test_static_batches_prefill_together_and_wait_for_their_longest() -> None:
    """Continuous batching off: 4 of 8 waiting requests are prefilled in one iteration,
    decode together, and the other 4 start only when the longest of the first is done."""
    cost = Recorder(0.01)
    sim = ServeSim(
        [cost], engine="neuron", max_num_seqs=4, max_num_batched_tokens=256, kv_blocks=4 * 40,
        requests=8, input_tokens=200, output_tokens=[3, 9, 5, 4, 2, 2, 2, 2],
        arrival=("closed", 8), slot_tokens=640, static=True,
    )  # fmt: skip
    reqs = sim.run()
    first, second = reqs[:4], reqs[4:]
    assert cost.calls[0][0] == [(256, 0)] * 4  # one prefill iteration, 200 in its bucket
    assert len({r.first_token for r in first}) == 1
    assert max(r.finish for r in first) == pytest.approx(first[0].first_token + 8 * 0.01)
    assert all(r.scheduled == pytest.approx(max(f.finish for f in first)) for r in second)
    assert all(r.generated == r.output_tokens for r in reqs)


def test_trtllm_reserves_each_request_whole_and_never_preempts() -> None:
    """Under the same KV pressure vLLM's rules preempt and recompute, while TensorRT-LLM's
    GUARANTEED_NO_EVICT admits a request only with its prompt and output reserved: no
    preemption, and the cache never holds more than it has."""
    runs = {}
    for engine in ("vllm", "trtllm"):
        sim = ServeSim(
            [Fixed(0.01)], engine=engine, max_num_seqs=64, max_num_batched_tokens=2048,
            kv_blocks=100, requests=60, input_tokens=300, output_tokens=200,
            arrival=("closed", 30),
        )  # fmt: skip
        reqs = sim.run()
        rep = sim.replicas[0]
        assert all(r.generated == 200 for r in reqs)
        assert rep.peak_blocks <= rep.kv_blocks and rep.used_blocks == 0
        runs[engine] = rep.preemptions
    assert runs["vllm"] > 0
    assert runs["trtllm"] == 0
