"""Figures of the model pages (chip models, mixture of experts) that the chip models,
the NKI kernel tilings and whole-model steps produce.

- The quick start under the roofline and the engine chip models: the summary of each,
  and where their compute differs, class of op by class of op, from each run's trace.
- The NKI matmul tutorial's four kernels, predicted from the catalog's engine facts
  alone (:mod:`clustersim.hardware.kernel_tiling`), against the tutorial's times.
- The Mixtral-8x7B UltraServer example under expert-popularity skew, against the dense
  model of equal active parameters, and with its all-to-alls overlapped.
- DualPipe against 1F1B and interleaved schedules on a small MoE model (:data:`DUALPIPE`).
- The search's estimate of the DeepSeek-V3 example's layout, and what shares of the
  G15 reference's (Qwen3-30B-A3B on 16 H100) simulated step its bubble and optimizer take.

Each entry of :data:`FIGURES` is ``(name, pattern, compute, noise, what, pages)``, a
figure of ``python -m clustersim.docs`` (a block where ``pattern`` is empty). Each run
is simulated once per process and shared by the figures that quote it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from clustersim.catalog.schema import Calibration

__all__ = [
    "DUALPIPE",
    "FIGURES",
    "MOE",
    "MOE_ROWS",
    "chip_model_ops",
    "chip_models",
    "deepseek_estimate",
    "dualpipe",
    "g15_nvlink",
    "g15_share",
    "moe_overlap",
    "moe_skew",
    "nki_matmul",
]

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
QUICKSTART = "trn2-llama3-8b"


@functools.cache
def _chip_model_run(
    model: str, scenario: str = QUICKSTART
) -> tuple[dict[str, Any], pd.DataFrame, Calibration]:
    """A shipped scenario under ``chip_model: model``: its summary, its trace (the ops of
    rank 0 in the first step) and its resolved chip calibration; once per process."""
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate
    from clustersim.sim.result import Result

    res = load_scenario(SCENARIOS / f"{scenario}.yaml", [f"chip_model={model}"])
    result = simulate(res, record=True)
    assert isinstance(result, Result)
    trace = result.trace_frame()
    trace = trace[(trace["rank"] == 0) & (trace["step"] == trace["step"].min())]
    return result.summary, trace, res.chip.calibration


def chip_models(ctx: object = None, scenario: str = QUICKSTART) -> str:
    """The quick start simulated with the roofline and the engine chip models: step,
    compute, exposed communication, interference, MFU and the engines' busy fractions
    (a Markdown table), and the difference of the steps."""
    del ctx
    roof, eng = (_chip_model_run(m, scenario)[0] for m in ("roofline", "engines"))

    def row(name: str, cell: Callable[[dict[str, Any]], str]) -> str:
        return f"| {name} | {cell(roof)} | {cell(eng)} |"

    def part(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda s: f"{s['breakdown_s'][key]:.3f} s"

    busy = eng.get("engine_busy") or {}
    shown = ", ".join(f"{k} {v:.0%}" for k, v in busy.items() if v > 0)
    step = eng["step_time_s"] / roof["step_time_s"] - 1
    comm = eng["breakdown_s"]["exposed_comm"] / roof["breakdown_s"]["exposed_comm"] - 1
    return "\n".join(
        [
            "| | roofline | engines |",
            "|---|---|---|",
            row("step time", lambda s: f"{s['step_time_s']:.3f} s"),
            row("compute", part("compute")),
            row("exposed comm", part("exposed_comm")),
            row("interference", lambda s: f"{s['breakdown_s']['interference'] * 1e6:.0f} µs"),
            row("MFU", lambda s: f"{s['mfu']:.1%}"),
            f"| engine_busy | | {shown} |",
            "",
            f"The engine model's step is {step:+.1%} against the roofline's, its exposed "
            f"communication {comm:+.1%}.",
        ]
    )


_OP_CLASSES = (
    ("attention", "attention core (QK^T, softmax, PV and their backward)"),
    ("linear", "linears (QKV, output, MLP, LM head; forward and both gradients)"),
    ("other", "element-wise ops, norms, RoPE, embedding, loss and optimizer"),
)


def _op_class(op: str, resource: str) -> str:
    if op.startswith("attn.core"):
        return "attention"
    return "linear" if resource == "tensor" else "other"


def _op_seconds(trace: pd.DataFrame) -> tuple[dict[str, float], str]:
    """Seconds of rank 0's compute ops in one step by class (collectives and waits left
    out), and the resource that holds most of the attention core's time."""
    ops = trace[~trace["resource"].astype(str).str.contains(":") & (trace["resource"] != "wait")]
    seconds = ops["end_s"] - ops["start_s"]
    classes = [_op_class(str(o), str(r)) for o, r in zip(ops["op"], ops["resource"], strict=True)]
    by_class = seconds.groupby(classes).sum()
    attention = seconds[[c == "attention" for c in classes]]
    bound = attention.groupby(ops["resource"].astype(str)[attention.index]).sum().idxmax()
    return {k: float(by_class.get(k, 0.0)) for k, _ in _OP_CLASSES}, str(bound)


def chip_model_ops(ctx: object = None, scenario: str = QUICKSTART) -> str:
    """Rank 0's compute in one step of the quick start under each chip model, by class
    of op (a Markdown table), and what prices the attention core in each."""
    del ctx
    _, roof_trace, cal = _chip_model_run("roofline", scenario)
    a, a_bound = _op_seconds(roof_trace)
    b, b_bound = _op_seconds(_chip_model_run("engines", scenario)[1])
    out = [
        "| ops of rank 0 in one step | roofline | engines | difference |",
        "|---|---:|---:|---:|",
    ]
    for key, label in _OP_CLASSES:
        out.append(f"| {label} | {a[key]:.3f} s | {b[key]:.3f} s | {b[key] - a[key]:+.3f} s |")
    ta, tb = sum(a.values()), sum(b.values())
    out.append(f"| all compute ops | {ta:.3f} s | {tb:.3f} s | {tb - ta:+.3f} s |")
    share = (b["attention"] - a["attention"]) / (tb - ta)
    out += [
        "",
        f"The attention core is {share:.0%} of the difference. The roofline prices its "
        f"matmuls at the family's fitted `attention_efficiency` "
        f"({cal.attention_efficiency:.3f} of the Tensor peak) and runs QK^T, softmax and PV "
        f"one after another ({a_bound.capitalize()} holds most of the core's time); the "
        f"engine model runs them at `tensor_efficiency` ({cal.tensor_efficiency:.2f}) and "
        f"streams them into each other chunk by chunk, so that {b_bound.capitalize()} (the "
        f"PSUM copies and the softmax) holds most of it.",
    ]
    return "\n".join(out)


_NKI_LABELS = {
    "tiled": "tiled (both tiles loaded per instruction)",
    "hoist_load": "hoist the A loads",
    "block_free_dimension": "block the free dimensions (2 x 2 tiles)",
    "fully_optimized": "fully blocked (16 x 2 x 8 tiles, B loaded once)",
}


def nki_matmul(ctx: object = None) -> str:
    """Each NKI matmul tutorial kernel's time predicted from the Trn1 catalog's engine
    facts (its tiling simulated on one core's engines) against the tutorial's (a
    Markdown table)."""
    del ctx
    from clustersim import catalog
    from clustersim.hardware.kernel_tiling import (
        NKI_MATMUL_MEASURED_MS,
        NKI_MATMUL_TUTORIAL,
        matmul_kernel,
    )
    from clustersim.sim.engines_exec import run_segment

    spec = catalog.chip("trn1")
    hbm_core_Bps = spec.hbm_bw_Bps * spec.calibration.hbm_efficiency / spec.cores
    out = ["| kernel | predicted | measured |", "|---|---|---|"]
    for name, measured in NKI_MATMUL_MEASURED_MS.items():
        kernel = matmul_kernel(spec, (4096, 8192, 8192), NKI_MATMUL_TUTORIAL[name], "bf16")
        run = run_segment([kernel.op], hbm_core_Bps, spec.core.sbuf_bytes)
        out.append(f"| {_NKI_LABELS[name]} | {run.total_s * 1e3:.2f} ms | {measured:.2f} ms |")
    return "\n".join(out)


MOE = "trn2-ultraserver-mixtral-8x7b"
MOE_ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("0 (balanced)", ("moe.skew=0",)),
    ("0.5", ("moe.skew=0.5",)),
    ("1.0", ("moe.skew=1.0",)),
    ("1.0, full recompute", ("moe.skew=1.0", "parallelism.recompute=full")),
    (
        "dense model of equal active parameters (FFN 28,672, no experts)",
        ("model.moe=null", "model.ffn_hidden=28672", "parallelism.ep=1"),
    ),
)
"""The MoE page's skew table: a label and the ``--set`` values on :data:`MOE`, each
simulated folded."""

_NEEDS = re.compile(r"needs ([0-9.]+) GiB per chip but the chip has ([0-9.]+) GiB")


@functools.cache
def _moe(sets: tuple[str, ...]) -> dict[str, Any] | str:
    """:data:`MOE` with ``sets``, simulated folded: its summary, or why it does not fit."""
    from clustersim.errors import ScenarioError
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    try:
        res = load_scenario(SCENARIOS / f"{MOE}.yaml", list(sets))
        return simulate(res, record=False, fidelity="folded").summary
    except ScenarioError as err:
        m = _NEEDS.search(str(err))
        if m is None:
            raise
        return f"does not fit ({m.group(1)} GiB of {m.group(2)} GiB per chip)"


def _params() -> tuple[float, float]:
    """:data:`MOE`'s model's parameters, all and those a token uses."""
    from clustersim.scenario import load_scenario
    from clustersim.workload.memory import non_embedding_param_count, param_count

    model = load_scenario(SCENARIOS / f"{MOE}.yaml").model
    idle = non_embedding_param_count(model) - non_embedding_param_count(model, active=True)
    total = param_count(model)
    return float(total), float(total - idle)


def moe_skew(ctx: object = None) -> str:
    """Each of :data:`MOE_ROWS`: step, MFU, $/M tokens and HBM per chip (a Markdown
    table), and what skew and the experts cost per token."""
    del ctx
    out = [
        "| `moe.skew` (Zipf exponent) | step | MFU | $/M tokens | HBM per chip |",
        "|---|---|---|---|---|",
    ]
    for label, sets in MOE_ROWS:
        s = _moe(sets)
        if isinstance(s, str):
            out.append(f"| {label} | {s} | | | |")
            continue
        out.append(
            f"| {label} | {s['step_time_s']:.2f} s | {s['mfu']:.1%} | "
            f"{s['cost']['usd_per_million_tokens']:.3f} | "
            f"{s['memory_gib_per_chip']['total']:.1f} GiB |"
        )

    def usd(i: int) -> float:
        s = _moe(MOE_ROWS[i][1])
        assert not isinstance(s, str), s
        return float(s["cost"]["usd_per_million_tokens"])

    total, active = _params()
    out += [
        "",
        f"Skew 0.5 costs {usd(1) / usd(0) - 1:.0%} more per token than balanced routing. "
        f"Balanced, the MoE step costs {usd(0) / usd(4) - 1:.1%} more per token than a dense "
        f"model with the same {active / 1e9:.1f}B active parameters, for "
        f"{total / active:.1f}x the parameters ({total / 1e9:.1f}B).",
    ]
    return "\n".join(out)


def moe_overlap(ctx: object = None) -> str:
    """:data:`MOE`'s step without and with ``parallelism.overlap_moe_a2a``."""
    del ctx
    steps = []
    for sets in (("moe.skew=0",), ("moe.skew=0", "parallelism.overlap_moe_a2a=true")):
        s = _moe(sets)
        assert not isinstance(s, str), s
        steps.append(s["step_time_s"])
    return f"{steps[0]:.2f} s to {steps[1]:.2f} s"


DUALPIPE = """
name: dualpipe-example
seed: 1
cluster: {instance: p5.48xlarge, count: 1}
model:
  name: tiny-moe
  layers: 8
  hidden: 1024
  heads: 8
  kv_heads: 8
  ffn_hidden: 2048
  vocab: 8192
  moe: {experts: 16, top_k: 2, expert_ffn_hidden: 1024}
parallelism: {tp: 1, pp: 4, ep: 2, zero: 1}
training: {seq_len: 2048, global_batch_size: 32}
moe: {balanced: true}
output: {trace: false, html: false}
"""
"""The MoE page's DualPipe example: a small MoE model (8 layers, hidden 1,024, 16
experts, top-2) on 4 stages of one p5.48xlarge, as ``tests/workload/test_dualpipe.py``
runs it."""
_SCHEDULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("1F1B", ()),
    ("interleaved, 2 chunks", ("parallelism.virtual_stages=2",)),
    (
        "interleaved, 2 chunks, overlapped all-to-alls",
        ("parallelism.virtual_stages=2", "parallelism.overlap_moe_a2a=true"),
    ),
    ("DualPipe", ("parallelism.schedule=dualpipe",)),
)


def dualpipe(ctx: object = None) -> str:
    """:data:`DUALPIPE`'s step and activations per chip under 1F1B, two interleaved chunks
    (without and with overlapped all-to-alls) and DualPipe (a Markdown table)."""
    del ctx
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    out = ["| schedule | step | activations per chip |", "|---|---|---|"]
    for label, sets in _SCHEDULES:
        s = simulate(load_scenario(DUALPIPE, list(sets)), record=False).summary
        acts = s["memory_gib_per_chip"]["activations"] * 1024
        out.append(f"| {label} | {s['step_time_s'] * 1e3:.1f} ms | {acts:.0f} MiB |")
    return "\n".join(out)


def deepseek_estimate(ctx: object = None) -> str:
    """The search's step estimate of the DeepSeek-V3 example's own layout."""
    del ctx
    from clustersim.scenario import load_scenario
    from clustersim.search.estimate import estimate_resolved

    res = load_scenario(SCENARIOS / "trn2-ultracluster-deepseek-v3.yaml")
    return f"{estimate_resolved(res).step_time_s:.2f} s"


G15 = "bridge-qwen3-30b-a3b"
"""The MoE page's Qwen3-30B-A3B reference row (G15), simulated as ``validate`` runs it."""


@functools.cache
def _g15() -> dict[str, Any]:
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate
    from clustersim.validation.rows import references
    from clustersim.validation.training import scenario_text

    ref = next(r for r in references().training if r.name == G15)
    return simulate(load_scenario(scenario_text(ref)), record=False).summary


def g15_share(part: str) -> Callable[[object], str]:
    """The share of G15's simulated step that its ``breakdown_s[part]`` takes."""

    def compute(ctx: object = None) -> str:
        del ctx
        s = _g15()
        return f"{s['breakdown_s'][part] / s['step_time_s']:.1%}"

    return compute


def g15_nvlink(ctx: object = None) -> str:
    """The rate of one of p5.48xlarge's NVLink paths, at the H100's link efficiency."""
    del ctx
    from clustersim import catalog

    bps = catalog.instance("p5.48xlarge").fabric.link_bw_Bps
    return f"{bps * catalog.chip('h100').calibration.link_efficiency / 1e9:.0f} GB/s"


_CHIPS = ("docs/explanation/chips.md",)
_MOE = ("docs/explanation/moe.md",)
FIGURES: tuple[tuple[str, str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    ("chip-models", "", chip_models, 0.0,
     "the quick start with the roofline and the engine chip models", _CHIPS),
    ("chip-models-ops", "", chip_model_ops, 0.0,
     "the quick start's compute ops under each chip model, by class of op", _CHIPS),
    ("nki-matmul", "", nki_matmul, 0.0,
     "the NKI matmul tutorial's kernels predicted from the engine facts", _CHIPS),
    ("moe-skew", "", moe_skew, 0.0,
     "the Mixtral-8x7B UltraServer example under skew and the dense model", _MOE),
    ("moe-overlap", r"UltraServer example it takes the step from (\d+\.\d+ s to \d+\.\d+ s)",
     moe_overlap, 0.0, "the same example with its all-to-alls overlapped", _MOE),
    ("dualpipe", "", dualpipe, 0.0,
     "DualPipe against 1F1B and interleaved chunks on a small MoE model", _MOE),
    ("deepseek-estimate", r"The estimate of its layout today is\n([0-9.]+ s) a step",
     deepseek_estimate, 0.0, "the search's estimate of the DeepSeek-V3 example's step", _MOE),
    ("g15-nvlink", r"over NVLink at (\d+ GB/s)", g15_nvlink, 0.0,
     "the NVLink rate G15's all-to-alls see", _MOE),
    ("g15-bubble", r"leave a bubble\nof ([0-9.]+%) of the simulated step", g15_share("bubble"),
     0.0, "the bubble's share of G15's simulated step", _MOE),
    ("g15-optimizer", r"the optimizer takes ([0-9.]+%) of it", g15_share("optimizer"), 0.0,
     "the optimizer's share of G15's simulated step", _MOE),
)  # fmt: skip
