"""Published serving measurements, each run as its source ran it, against the model.

    python -m clustersim.serve.references [--wire]

The Neuron rows (Transformers-NeuronX's static batches on inf2 and trn1, NxD
Inference with vLLM on Trn2) and the H100 rows of the project's inference
references: the instance, TP, prompt and output lengths, batch or concurrency (a
closed loop of that many clients, one replica), weight dtype and engine rules.
The Transformers-NeuronX rows at batch 1 are ``calibration`` rows: their TPOT (a
decode iteration at batch 1 is the weights' read and two small all-reduces a layer
inside one compiled program) is what the Neuron runtime's collective launch is fitted
on, with the measured collectives and the Trainium step rows
(:mod:`clustersim.calibration.launch`). Nothing else is fitted to them, and the
others are never read by a fit. ``--wire`` times the tensor-parallel all-reduces
without the communication runtime's fixed costs (their wire time alone): a
diagnostic of where the error lies, not a setting.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from clustersim.scenario import load_scenario
from clustersim.serve.run import serve

__all__ = [
    "ROWS",
    "THROUGHPUT_ROWS",
    "Row",
    "ThroughputRow",
    "predict",
    "predict_throughput",
    "throughput_scenario_text",
    "throughput_table",
    "validation_table",
]


@dataclass(frozen=True)
class Row:
    id: str
    instance: str
    model: str
    tp: int
    serving: str  # the engine's keys, YAML flow mapping entries
    concurrency: int
    input_tokens: int
    output_tokens: int
    ttft_ms: float
    tpot_ms: float
    role: str = "hold-out"
    """``calibration``: its batch-1 TPOT enters the fit of the Neuron runtime's launch
    (:mod:`clustersim.calibration.launch`); ``hold-out``: never read by a fit."""


CAL = "calibration"
NEURON_BATCH_1 = "engine: neuron, max_num_seqs: 1"
TNX = "batching: static"
"""Transformers-NeuronX as the Neuron SDK's tables ran it: continuous batching off."""
INT8 = "weight_dtype: int8, precision: fp16"
ROWS: tuple[Row, ...] = (
    Row("S1", "inf2.48xlarge", "llama3-8b", 24,
        f"{NEURON_BATCH_1}, {TNX}, {INT8}, max_num_batched_tokens: 128",
        1, 128, 3968, 25.0, 6.42, CAL),
    Row("S2", "inf2.48xlarge", "llama3-8b", 24,
        f"engine: neuron, max_num_seqs: 8, {TNX}, {INT8}, max_num_batched_tokens: 128",
        8, 128, 3968, 66.0, 10.45),
    Row("S3", "inf2.48xlarge", "llama3-70b", 24,
        f"{NEURON_BATCH_1}, {TNX}, max_num_batched_tokens: 128",
        1, 128, 1024, 80.0, 32.47, CAL),
    Row("S4", "trn1.32xlarge", "llama3-8b", 32,
        f"{NEURON_BATCH_1}, {TNX}, {INT8}, max_num_batched_tokens: 128",
        1, 128, 3968, 14.75, 5.86, CAL),
    Row("S5", "trn1.32xlarge", "llama3-70b", 32,
        f"{NEURON_BATCH_1}, {TNX}, max_num_batched_tokens: 128",
        1, 128, 1024, 53.2, 24.48, CAL),
    Row("S6", "trn1.32xlarge", "llama3-70b", 32,
        f"engine: neuron, max_num_seqs: 4, {TNX}, max_num_batched_tokens: 128",
        4, 128, 1024, 129.9, 28.38),
    Row("S7", "trn2.48xlarge", "llama3-70b", 64,
        f"{NEURON_BATCH_1}, max_num_batched_tokens: 10000", 1, 10000, 1500, 814.2, 19.6),
    Row("S11", "p5.48xlarge", "llama3-70b", 4,
        "engine: vllm, precision: fp8, weight_dtype: fp8, max_num_seqs: 8",
        8, 1024, 1024, 96.3, 12.11),
    Row("S12", "p5.48xlarge", "llama3-8b", 1, "engine: trtllm, max_num_seqs: 64",
        64, 1024, 128, 176.9, 20.05),
)  # fmt: skip


@dataclass(frozen=True)
class ThroughputRow:
    """A published throughput at maximum load: every one of ``requests`` requests sent
    at once (a closed loop with as many clients and no ramp, as ``trtllm-bench
    throughput`` sends its dataset), output tokens per second over the whole run."""

    id: str
    instance: str
    model: str
    tp: int
    serving: str  # the engine's keys, YAML flow mapping entries
    requests: int
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float


TRTLLM_BENCH = (
    "engine: trtllm, precision: fp8, weight_dtype: fp8, kv_dtype: fp8, "
    "max_num_seqs: 2048, max_num_batched_tokens: 8192"
)
"""TensorRT-LLM's engine defaults as ``trtllm-bench`` builds them: FP8 weights, compute
and KV cache (the checkpoints the perf overview names are FP8), ``max_num_tokens``
8192 (``BuildConfig``'s default; aiconfigurator-core 0.12.0,
``sdk/backends/trtllm_backend.py``, ``TRTLLM_DEFAULT_MAX_NUM_TOKENS``) and a batch
limit of 2,048 that the KV cache binds first (under the capacity scheduler's
no-eviction reservation of prompt and output: below 256 sequences on S9's two H100s,
between 512 and 1,024 on S10's one; any limit from 1,024 up gives the same rates)."""
BENCH_REQUESTS = 1500
"""The requests a throughput row sends: the perf overview does not record its dataset's
size. At maximum load the output rate is the steady state's once the KV-bound batch is
full; the count sets only how much of the run its ramp-up and drain take (S9 and S10
move by under 0.3% between 1,500 and 6,000 requests)."""
THROUGHPUT_ROWS: tuple[ThroughputRow, ...] = (
    ThroughputRow("S9", "p5.48xlarge", "llama3.3-70b", 2, TRTLLM_BENCH,
                  BENCH_REQUESTS, 1000, 1000, 4205.0),
    ThroughputRow("S10", "p5.48xlarge", "llama3.1-8b", 1, TRTLLM_BENCH,
                  BENCH_REQUESTS, 1000, 1000, 15220.0),
)  # fmt: skip


def throughput_scenario_text(row: ThroughputRow) -> str:
    return (
        f"name: {row.id}\ncluster: {{instance: {row.instance}}}\nmodel: {row.model}\n"
        f"parallelism: {{tp: {row.tp}}}\n"
        f"serving: {{{row.serving}, replicas: 1, requests: {row.requests}, "
        f"arrival: {{kind: closed, concurrency: {row.requests}, ramp_s: 0}}, "
        f"input_tokens: {row.input_tokens}, output_tokens: {row.output_tokens}}}\n"
    )


def predict_throughput(row: ThroughputRow) -> float:
    """Predicted output tokens per second of ``row`` over its whole run."""
    s = serve(load_scenario(throughput_scenario_text(row))).summary
    return float(s["output_tokens_per_s"])


def scenario_text(row: Row) -> str:
    return (
        f"name: {row.id}\ncluster: {{instance: {row.instance}}}\nmodel: {row.model}\n"
        f"parallelism: {{tp: {row.tp}}}\n"
        f"serving: {{{row.serving}, replicas: 1, requests: {4 * row.concurrency}, "
        f"arrival: {{kind: closed, concurrency: {row.concurrency}}}, "
        f"input_tokens: {row.input_tokens}, output_tokens: {row.output_tokens}}}\n"
    )


def predict(
    row: Row, *, wire_only: bool = False, sets: Sequence[str] = (), stack_fit: bool = True
) -> tuple[float, float]:
    """Predicted p50 TTFT and TPOT of ``row``, in milliseconds (``sets``: ``KEY=VALUE``
    overrides, as ``--set``; ``stack_fit=False``: the catalog's constants, not the
    stack's fit, as a fit reads them)."""
    res = load_scenario(scenario_text(row), list(sets), stack_fit=stack_fit)
    s = serve(res, collective_overheads=not wire_only).summary
    return s["ttft_s"]["p50"] * 1e3, s["tpot_s"]["p50"] * 1e3


def _engine(row: Row | ThroughputRow) -> str:
    return row.serving.split(",")[0].removeprefix("engine:").strip()


def validation_table() -> str:
    """Every row predicted against its publication, and TPOT with the collectives at
    wire time only (where the error lies), as a Markdown table: what the docs quote."""
    out = [
        "| row | setup | TTFT pred. | TTFT pub. | err | TPOT pred. | TPOT pub. | err "
        "| TPOT, wire only |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        ttft, tpot = predict(row)
        setup = (
            f"{row.instance}, {row.model}, TP{row.tp}, concurrency {row.concurrency}, "
            f"{row.input_tokens}/{row.output_tokens}, {_engine(row)}"
        )
        wire = "(TP1: no collectives)"
        if row.tp > 1:
            w = predict(row, wire_only=True)[1]
            wire = f"{w:.1f} ms ({w / row.tpot_ms - 1:+.0%})"
        out.append(
            f"| {row.id} | {setup} | {ttft:.1f} ms | {row.ttft_ms:g} ms "
            f"| {ttft / row.ttft_ms - 1:+.0%} | {tpot:.2f} ms | {row.tpot_ms:g} ms "
            f"| {tpot / row.tpot_ms - 1:+.0%} | {wire} |"
        )
    return "\n".join(out)


def throughput_table() -> str:
    """Every throughput row predicted against its publication (a Markdown table)."""
    out = [
        "| row | setup | output tok/s pred. | pub. | err |",
        "|---|---|---|---|---|",
    ]
    for row in THROUGHPUT_ROWS:
        tok_s = predict_throughput(row)
        setup = (
            f"{row.instance}, {row.model}, TP{row.tp}, {row.requests:,} requests at once, "
            f"{row.input_tokens}/{row.output_tokens}, {_engine(row)}"
        )
        out.append(
            f"| {row.id} | {setup} | {tok_s:,.0f} | {row.output_tokens_per_s:,.0f} "
            f"| {tok_s / row.output_tokens_per_s - 1:+.0%} |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m clustersim.serve.references")
    parser.add_argument("--wire", action="store_true", help="collectives at wire time only")
    args = parser.parse_args()
    print("| row | TTFT pred. | TTFT pub. | err | TPOT pred. | TPOT pub. | err |")
    print("|---|---|---|---|---|---|---|")
    for row in ROWS:
        ttft, tpot = predict(row, wire_only=args.wire)
        print(
            f"| {row.id} | {ttft:.1f} ms | {row.ttft_ms:g} ms | {ttft / row.ttft_ms - 1:+.0%} "
            f"| {tpot:.2f} ms | {row.tpot_ms:g} ms | {tpot / row.tpot_ms - 1:+.0%} |"
        )


if __name__ == "__main__":
    main()
