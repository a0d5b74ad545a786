"""Figures the documentation quotes that read a ``clustersim validate`` run or the
shipped calibration: the end-to-end rows by role and their known gaps, the shipped
fits and each family's interval, holdout coverage, the measured collectives against
the simulator, the published MoE rows, and the Megatron-Bridge FSDP
row's recipe as modelled.

Each function takes what ``python -m clustersim.docs`` computes its figures from (its
``Context``: here only the validation rows) and returns the figure's text.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "Rows",
    "calibration_fits",
    "family_intervals",
    "fsdp_recipes",
    "holdout_inside",
    "known_gaps",
    "measured_table",
    "moe_rows",
    "role_stat",
    "validation_table",
]

ROOT = Path(__file__).resolve().parent.parent


class Rows(Protocol):
    """What these figures read: the rows of a ``clustersim validate --json`` run."""

    def validation_rows(self) -> list[dict[str, Any]]: ...


_ORDER = {"calibration": 0, "holdout": 1}


def validation_table(ctx: Rows) -> str:
    """The end-to-end rows by role (calibration, holdout; known gaps last in each)."""
    rows = [r for r in ctx.validation_rows() if r["kind"] == "training"]
    rows.sort(key=lambda r: (_ORDER.get(r["role"], 2), r["status"] == "known_gap"))
    out = [
        "| row | role | chips | published | predicted | error | bubble | exposed comm | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rid = r["extra"].get("id")
        name = f"{r['name']} ({rid})" if rid else r["name"]
        pred = r["predicted"]
        status = "known gap" if r["status"] == "known_gap" else "ok"
        out.append(
            f"| {name} | {r['role']} | {r['extra']['chips']:,} | {r['published']:.2f} s | "
            f"{pred:.2f} s | {pred / r['published'] - 1:+.1%} | {r['bubble_s'] / pred:.0%} | "
            f"{r['exposed_comm_s'] / pred:.0%} | {status} |"
        )
    return "\n".join(out)


def known_gaps(ctx: Rows) -> str:
    """The end-to-end rows marked as known gaps, by role: shown, never in the means."""
    rows = [r for r in ctx.validation_rows() if r["kind"] == "training"]
    rows = [r for r in rows if r["status"] == "known_gap"]
    rows.sort(key=lambda r: _ORDER.get(r["role"], 2))
    out = ["| row | role | chips | published | predicted | error |", "|---|---|---|---|---|---|"]
    for r in rows:
        rid = r["extra"].get("id")
        name = f"{r['name']} ({rid})" if rid else r["name"]
        pred = r["predicted"]
        out.append(
            f"| {name} | {r['role']} | {r['extra']['chips']:,} | {r['published']:.2f} s | "
            f"{pred:.2f} s | {pred / r['published'] - 1:+.1%} |"
        )
    return "\n".join(out)


MOE_ROWS = {
    "bridge-deepseek-v3": (
        "DeepSeek-V3, FP8, TP2/PP8/VP4/EP64",
        "the recipe settings come from Megatron-Bridge 0.2.0rc6 and 0.6.2, not from the 25.09 "
        "release itself (0.6.2 is later, but its H100 recipe has this layout)",
    ),
    "bridge-qwen3-30b-a3b": (
        "Qwen3-30B-A3B, FP8 current scaling, TP1/PP2/VP24/EP8",
        "the host side: Python launches of hundreds of small kernels per layer and "
        "microbatch, and the all-to-all dispatcher's device-to-host copy of the token "
        "counts in every MoE layer's forward",
    ),
}
"""The published MoE rows the MoE page shows: what each ran and what the model lacks."""


def moe_rows(ctx: Rows) -> str:
    """The published MoE rows of a validate run (:data:`MOE_ROWS`): role, steps, error."""
    rows = {r["name"]: r for r in ctx.validation_rows() if r["name"] in MOE_ROWS}
    out = [
        "| row | run | role | chips | published | simulated | error | what is missing |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (run, missing) in MOE_ROWS.items():
        r = rows[name]
        rid = r["extra"].get("id")
        role = r["role"] + (", known gap" if r["status"] == "known_gap" else "")
        pred = r["predicted"]
        out.append(
            f"| {name} ({rid}) | {run} | {role} | {r['extra']['chips']:,} | "
            f"{r['published']:.2f} s | {pred:.2f} s | {pred / r['published'] - 1:+.1%} | "
            f"{missing} |"
        )
    return "\n".join(out)


def calibration_fits(ctx: Rows) -> str:
    """The shipped fits (``catalog/calibration.yaml``): each constant, before and after."""
    from clustersim.catalog.fits import calibration
    from clustersim.validation.rows import references

    ids = {r.name: r.id for r in references().training}
    out = [
        "| fit | constant | from | to | fitted on | rms log error |",
        "|---|---|---|---|---|---|",
    ]
    for key, fit in sorted(calibration().fits.items()):
        rows = ", ".join(f"{n} ({ids[n]})" if ids.get(n) else n for n in fit.rows)
        for i, (name, value) in enumerate(sorted(fit.constants.items())):
            before = fit.previous.get(name)
            shown = f"{before:.4g}" if before is not None else "n.g."
            first = i == 0
            out.append(
                f"| {key if first else ''} | {name} | {shown} | {value:.4f} | "
                f"{rows if first else 'the same'} | {f'{fit.rms:.3f}' if first else ''} |"
            )
    return "\n".join(out)


def family_intervals(ctx: Rows) -> str:
    """Each calibrated family's 90% interval and its two parts (``catalog.fits``)."""
    import math

    from clustersim.catalog.fits import calibration, half_width, model_spread, residual_basis

    cal = calibration()
    out = [
        "| family | rows left out | rms in sample | rms left out | model | reference noise "
        "| 90% interval |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, fam in cal.families.items():
        loo = residual_basis(name, cal)
        inside = [r for k, f in sorted(cal.fits.items()) if k.startswith(f"{name}/")
                  for r in f.residuals.values()]  # fmt: skip
        model, what = model_spread(name, cal)
        noise = fam.reference_noise.spread
        floored = " (pooled floor)" if "floored" in what else ""
        if len(loo) < 2:
            counts = "none (declared default)"
            rms_in = rms_out = "-"
        else:
            counts = f"{len(loo)}"
            rms_in = f"{math.sqrt(sum(r * r for r in inside) / len(inside)):.1%}"
            rms_out = f"{math.sqrt(sum(e * e for e in loo) / len(loo)):.1%}"
        half = half_width(model, noise)
        out.append(
            f"| {name} | {counts} | {rms_in} | {rms_out} | ±{math.expm1(model):.1%}{floored} | "
            f"±{noise:.1%} | -{-math.expm1(-half):.1%} / +{math.expm1(half):.1%} |"
        )
    return "\n".join(out)


def holdout_inside(ctx: Rows) -> str:
    """How many holdout rows' published steps lie inside their 90% intervals."""
    from clustersim.validation.command import holdout_coverage
    from clustersim.validation.rows import Row

    rows = [
        Row(**{k: v for k, v in r.items() if k in Row.__dataclass_fields__})
        for r in ctx.validation_rows()
    ]
    cover = holdout_coverage(rows)
    return f"{cover['inside']} of the {cover['rows']}" if cover else "none of the 0"


def measured_table(reference: str) -> Callable[[Rows], str]:
    """The measured-collective rows of ``reference`` by size: measured against simulated
    (a time for the small-message floor, busbw otherwise), the error in time, and what ran."""

    def compute(ctx: Rows) -> str:
        from clustersim.units import format_bytes

        rows = [
            r
            for r in ctx.validation_rows()
            if r["kind"] == "collective" and r["name"].startswith(f"{reference}@")
        ]
        rows.sort(key=lambda r: r["extra"]["size_bytes"])
        out = [
            "| size | measured | simulated | error (time) | algorithm |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            x = r["extra"]
            if " time (" in r["metric"]:
                shown = [f"{t * 1e6:.1f} us" for t in (r["published"], r["predicted"])]
            else:
                keys = ("busbw_published_GBps", "busbw_predicted_GBps")
                shown = [f"{x[k]:.2f} GB/s" for k in keys]
            ran = r["metric"].rsplit("(", 1)[-1].rstrip(")")
            protocol = x.get("protocol")
            if protocol and protocol != "neuron":
                ran = f"{ran}, {protocol}"
            out.append(
                f"| {format_bytes(x['size_bytes'])} | {shown[0]} | {shown[1]} | "
                f"{r['predicted'] / r['published'] - 1:+.1%} | {ran} |"
            )
        return "\n".join(out)

    return compute


def role_stat(role: str, key: str) -> Callable[[Rows], str]:
    def compute(ctx: Rows) -> str:
        from clustersim.validation import role_errors
        from clustersim.validation.rows import Row

        rows = [
            Row(**{k: v for k, v in r.items() if k in Row.__dataclass_fields__})
            for r in ctx.validation_rows()
        ]
        stats = role_errors(rows)[role]
        if key == "rows":
            return f"{stats['rows']:.0f}"
        return f"{stats[key]:.1%}"

    return compute


FSDP_ROW = ("bridge-llama3-8b-fsdp", "mbridge-llama3-8b-fsdp")
"""The Megatron-Bridge FSDP reference row and the shipped scenario of the same job."""
FSDP_RECIPES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "FP8 delayed scaling, every layer FP8",
        ("training.fp8.scaling=delayed", "training.fp8.bf16_layers=0"),
    ),
    ("current scaling (an amax pass per cast)", ("training.fp8.bf16_layers=0",)),
    ("and the first and last layer in BF16 (the recipe's)", ()),
    ("the recipe with ZeRO-1 in place of FSDP", ("parallelism.zero=1",)),
)
"""The recipe as modelled, step by step: a label and the ``--set`` values on the shipped
scenario (FP8 current scaling with one BF16 layer at each end, FSDP)."""


def fsdp_recipes(ctx: Rows) -> str:
    """The shipped Megatron-Bridge FSDP scenario under each of :data:`FSDP_RECIPES`
    against the reference row's published step (a Markdown table)."""
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    row_name, scenario = FSDP_ROW
    (row,) = [r for r in ctx.validation_rows() if r["name"] == row_name]
    published = float(row["published"])
    out = [
        f"| recipe as modelled | simulated step | against {published:.2f} s published |",
        "|---|---|---|",
    ]
    for label, sets in FSDP_RECIPES:
        res = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml", list(sets))
        step = float(simulate(res, record=False).summary["step_time_s"])
        out.append(f"| {label} | {step:.2f} s | {step / published - 1:+.1%} |")
    return "\n".join(out)
