"""End-to-end training rows: simulate a published run's layout, compare step times.

The published step time is derived from the published figure (``Published.basis``):

- ``megatron_tflops``: Megatron-LM's own FLOP count per iteration (arXiv
  2104.04473, eq. 3), ``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))``, which counts
  the full recompute, over ``tflops_per_gpu x GPUs``;
- ``sequences_per_s``: the global batch over the published sequences per second;
- ``tokens_per_s_per_device``: the tokens of a step over the published tokens per
  second per device times the devices;
- ``mfu``: the simulator's model FLOPs per step (the PaLM formula of its MFU)
  over ``mfu x dense peak x chips``.

The published MFU shown beside is the simulator's model FLOPs over the
published step time and the peak, so both MFU columns use one definition.
"""

from __future__ import annotations

import time
from functools import cache
from importlib import resources

from clustersim.scenario import Resolved, load_scenario
from clustersim.sim import Result, simulate
from clustersim.validation.rows import Published, Row, TrainingRef, references

__all__ = [
    "megatron_flops_per_step",
    "published_step_s",
    "reference_stacks",
    "run_training",
    "scenario_text",
]


def scenario_text(ref: TrainingRef) -> str:
    """The YAML text of the reference's scenario, shipped in ``references/``."""
    files = resources.files("clustersim.validation").joinpath("references")
    return files.joinpath(ref.scenario).read_text("utf-8")


def megatron_flops_per_step(res: Resolved) -> float:
    """``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` (l: layers) for the scenario."""
    m, tr = res.model, res.scenario.training
    b, s, n, h, v = tr.global_batch_size, tr.seq_len, m.layers, m.hidden, m.vocab
    return 96.0 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))


def published_step_s(pub: Published, res: Resolved, model_flops: float, peak: float) -> float:
    """The published step time in seconds; ``peak`` is the dense peak of all chips."""
    if pub.basis == "megatron_tflops":
        assert pub.tflops_per_gpu is not None
        return megatron_flops_per_step(res) / (pub.tflops_per_gpu * 1e12 * res.chips)
    if pub.basis == "sequences_per_s":
        assert pub.sequences_per_s is not None
        return res.scenario.training.global_batch_size / pub.sequences_per_s
    if pub.basis == "tokens_per_s_per_device":
        assert pub.tokens_per_s_per_device is not None
        tr = res.scenario.training
        return tr.global_batch_size * tr.seq_len / (pub.tokens_per_s_per_device * res.chips)
    assert pub.mfu is not None
    return model_flops / (pub.mfu * peak)


@cache
def reference_stacks() -> dict[str, str]:
    """Each training row's software stack, as its scenario names it (or its chip's default)."""
    out = {}
    for ref in references().training:
        stack = load_scenario(scenario_text(ref), stack_fit=False).software.stack
        if stack is None:
            raise ValueError(f"reference {ref.name}: its chip has no software stack")
        out[ref.name] = stack
    return out


def run_training(ref: TrainingRef) -> Row:
    """Simulate the reference's scenario (one step) as any scenario runs, with its
    software stack's fit, and compare with the publication."""
    t0 = time.perf_counter()
    res = load_scenario(scenario_text(ref))
    fitted = dict(res.software.constants)
    result = simulate(res, record=False)
    assert isinstance(result, Result)  # a reference is a built workload, never a trace
    s = result.summary
    peak = result.plan.chip.peak_flops(res.scenario.training.precision) * res.chips
    model_flops = float(s["model_flops_per_step"])
    pub_s = published_step_s(ref.published, res, model_flops, peak)
    predicted_s = float(s["step_time_s"])
    extra = {
        "chips": res.chips,
        "calibration": fitted,
        "id": ref.id,
        "stack": res.software.stack,
        "fit": res.software.fit,
        "fidelity": s["fidelity"],
        "breakdown_s": s["breakdown_s"],
        "tflops_per_gpu_predicted": (
            megatron_flops_per_step(res) / predicted_s / res.chips / 1e12
            if ref.published.basis == "megatron_tflops"
            else model_flops / predicted_s / res.chips / 1e12
        ),
    }
    if ref.published.tflops_per_gpu is not None:
        extra["tflops_per_gpu_published"] = ref.published.tflops_per_gpu
    if ref.published.sequences_per_s is not None:
        extra["sequences_per_s_published"] = ref.published.sequences_per_s
        extra["sequences_per_s_predicted"] = float(s["sequences_per_s"])
    if ref.published.mfu is not None:
        extra["mfu_reported"] = ref.published.mfu
    if ref.published.tokens_per_s_per_device is not None:
        extra["tokens_per_s_per_device_published"] = ref.published.tokens_per_s_per_device
        extra["tokens_per_s_per_device_predicted"] = float(s["tokens_per_s"]) / res.chips
    breakdown = s["breakdown_s"]
    if s.get("uncertainty"):
        extra["uncertainty"] = list(s["uncertainty"]["step_time_s"])
    return Row(
        name=ref.name,
        kind="training",
        metric="step time",
        unit="s",
        published=pub_s,
        predicted=predicted_s,
        tolerance=ref.tolerance,
        source=ref.source,
        role=ref.role,
        status=ref.status,
        gap=ref.gap,
        bubble_s=float(breakdown["bubble"]),
        exposed_comm_s=float(breakdown["exposed_comm"]),
        mfu_published=model_flops / (pub_s * peak),
        mfu_predicted=float(s["mfu"]),
        note=ref.note,
        wall_s=time.perf_counter() - t0,
        extra=extra,
    )
