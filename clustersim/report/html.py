"""``report.html``: one self-contained page per run (or per comparison), built with Jinja2.

Figures are embedded as base64 data URIs and the styles are inline, so the page
opens offline and can be mailed as one file. Autoescaping is on: text from a
scenario (its name, its description) is shown as text, never run as markup.
"""

from __future__ import annotations

import base64
import math
import platform
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from clustersim._version import __version__
from clustersim.report.data import RunData, comm_table
from clustersim.report.figures import Rendered
from clustersim.report.injections import injection_table, step_table

__all__ = ["render_comparison", "render_report", "template_env", "versions"]

_PACKAGES = ("numpy", "pandas", "simpy", "matplotlib", "jinja2", "pyarrow")


def template_env() -> Environment:
    """The Jinja2 environment of every report page: autoescaped, strict."""
    return Environment(
        loader=PackageLoader("clustersim.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def versions() -> list[tuple[str, str]]:
    """Versions of clustersim, Python and the libraries that shape the results."""
    out = [("clustersim", __version__), ("python", platform.python_version())]
    for pkg in _PACKAGES:
        try:
            out.append((pkg, metadata.version(pkg)))
        except metadata.PackageNotFoundError:
            out.append((pkg, "not installed"))
    return out


def _uri(fig: Rendered) -> dict[str, str]:
    data = base64.b64encode(fig.png).decode("ascii")
    return {
        "name": fig.name,
        "title": fig.title,
        "caption": fig.caption,
        "uri": f"data:image/png;base64,{data}",
    }


def _seconds(value: float) -> str:
    """A duration with a unit that keeps it readable (s, ms or µs)."""
    v = abs(value)
    if v == 0.0:
        return "0 s"
    if v >= 1.0:
        return f"{value:.3f} s"
    if v >= 1e-3:
        return f"{value * 1e3:.3f} ms"
    return f"{value * 1e6:.2f} µs"


def _flatten(prefix: str, value: Any) -> list[tuple[str, str]]:
    if isinstance(value, Mapping):
        out: list[tuple[str, str]] = []
        for k, v in value.items():
            out += _flatten(f"{prefix}.{k}" if prefix else str(k), v)
        return out
    if isinstance(value, float):
        return [(prefix, f"{value:.6g}")]
    return [(prefix, str(value))]


def _workload_text(w: Mapping[str, Any]) -> str:
    """What a trace workload ran: its prefix, files and compute mode."""
    files = "replicated" if w.get("replicate") else f"{w.get('files', '?')} files"
    return f"Chakra traces {w.get('chakra', '?')} ({files}, compute {w.get('compute', '?')})"


def _layout_text(s: Mapping[str, Any]) -> str:
    lay = s["layout"]
    if lay is None:  # a trace workload: no layout, the traces say what runs
        w = s.get("workload")
        return _workload_text(w) if isinstance(w, Mapping) else "no layout"
    text = f"tp {lay['tp']} pp {lay['pp']} dp {lay['dp']} cp {lay['cp']}"
    if "microbatches" in lay:
        text += f", {lay['microbatches']} microbatches"
    if "schedule" in lay:
        text += f", {lay['schedule']}"
    if "recompute" in lay:
        text += f", recompute {lay['recompute']}"
    return text


def _cluster_text(s: Mapping[str, Any]) -> str:
    return (
        f"{s.get('instances', '?')} x {s.get('instance', '?')}: "
        f"{s['chips']} x {s.get('chip', 'chip')}, {s['ranks']} ranks"
    )


def _trace_cards(s: Mapping[str, Any]) -> list[dict[str, str]]:
    """The cards of a trace workload: no tokens, FLOPs or memory model."""
    step = float(s["step_time_s"])
    w, cost = s["workload"], s.get("cost") or {}
    exposed = float(s["breakdown_s"].get("exposed_comm", 0.0))
    cards = [
        {"label": "step time", "value": _seconds(step),
         "note": f"{w.get('nodes_per_step', 0):,} nodes per step"},
        {"label": "exposed comm", "value": f"{exposed / step:.1%}" if step else "n/a",
         "note": f"{w.get('process_groups', 0):,} process groups"},
        {"label": "ranks", "value": f"{s['ranks']:,}", "note": f"{s['chips']:,} chips"},
    ]  # fmt: skip
    if cost:
        per_hour = float(cost.get("usd_per_hour") or 0.0)
        cards.append(
            {
                "label": "$ per step",
                "value": f"${float(cost.get('usd_per_step') or 0.0):.4g}",
                "note": f"${per_hour:,.2f}/h {cost.get('pricing', '')}",
            }
        )
    return cards


def _cards(s: Mapping[str, Any]) -> list[dict[str, str]]:
    if s.get("workload") is not None:
        return _trace_cards(s)
    step = float(s["step_time_s"])
    mem = s.get("memory_gib_per_chip", {})
    cost = s.get("cost", {})
    cards = [
        {"label": "step time", "value": _seconds(step),
         "note": f"{s.get('tokens_per_step', 0):,} tokens per step"},
        {"label": "throughput", "value": f"{s.get('tokens_per_s', 0.0):,.0f} tok/s",
         "note": f"{s.get('sequences_per_s', 0.0):.2f} sequences/s"},
        {"label": "MFU", "value": f"{s.get('mfu', 0.0):.1%}", "note": "PaLM model FLOPs"},
        {"label": "HFU", "value": f"{s.get('hfu', 0.0):.1%}", "note": "counts recompute"},
    ]  # fmt: skip
    if cost:
        cards.append(
            {
                "label": "$ per million tokens",
                "value": f"${cost.get('usd_per_million_tokens', 0.0):.3f}",
                "note": f"${cost.get('usd_per_hour', 0.0):,.2f}/h {cost.get('pricing', '')}",
            }
        )
    if mem:
        cards.append(
            {
                "label": "memory per chip",
                "value": f"{mem.get('total', 0.0):.1f} GiB",
                "note": f"of {mem.get('capacity', 0.0):.0f} GiB HBM",
            }
        )
    return cards


def _change(rel: float | None) -> str:
    return "" if rel is None else f"{rel:+.1%}"


def _injections(s: Mapping[str, Any]) -> dict[str, Any]:
    """The rows of the "Injected failures" section: none without injections."""
    injections = [
        {
            "index": str(r.index),
            "at": (
                _seconds(r.applied_s)
                if r.applied_s is not None
                else f"not reached (at {_seconds(r.at_s)}, after the run)"
            ),
            "step": "" if r.step is None else str(r.step),
            "what": r.label,
            "effect": r.effect,
            "rerouted": "" if r.detected_s is None else _seconds(r.detected_s),
        }
        for r in injection_table(s)
    ]
    steps = [
        {
            "step": str(r.step),
            "time": _seconds(r.time_s),
            "vs_previous": _change(r.vs_previous),
            "vs_healthy": _change(r.vs_healthy),
            "injections": ", ".join(f"#{i}" for i in r.injections),
        }
        for r in step_table(s)
    ]
    # A comparison with healthy steps needs steps that finished before the first injection.
    vs_healthy = any(row["vs_healthy"] for row in steps)
    return {"injections": injections, "steps": steps, "steps_vs_healthy": vs_healthy}


def render_report(
    data: RunData,
    figures: Sequence[Rendered],
    *,
    files: Sequence[str] = (),
    trace_note: str = "",
) -> str:
    """The HTML page of one run."""
    s = data.summary
    step = data.step_time_s
    parts = {k: float(v) for k, v in s["breakdown_s"].items()}
    cost = s.get("cost", {})
    table = comm_table(data)
    comm = [
        {
            "op": row["op"],
            "phase": row["phase"],
            "resource": row["resource"],
            "calls": f"{row['calls']:,.4g}",
            "mbytes": f"{row['mbytes']:,.3g}",
            "time": _seconds(float(row["time_s"])),
            "exposed": _seconds(float(row["exposed_s"])),
            "bubble": _seconds(float(row["bubble_s"])),
            "exposed_pct": float(row["exposed_pct"]),
        }
        for row in table.to_dict("records")
    ]
    trace = data.is_trace
    run_facts = [
        ("scenario", data.name),
        ("cluster", _cluster_text(s)),
        ("workload" if trace else "model", _layout_text(s) if trace else str(s.get("model", ""))),
        *([] if trace else [("layout", _layout_text(s))]),
        ("fidelity", str(s.get("fidelity", ""))),
        ("seed", str(s.get("seed", ""))),
        ("events", f"{s.get('events', 0):,}"),
        ("simulated in", _seconds(float(s.get("wall_s", 0.0)))),
        ("simulated with", f"clustersim {s.get('clustersim_version', '?')}"),
    ]
    context = {
        "clustersim_version": __version__,
        "name": data.name,
        "description": str(data.resolved.get("description", "") or ""),
        "cluster": _cluster_text(s),
        "trace": trace,
        "model": "" if trace else str(s.get("model", "")),
        "layout": _layout_text(s),
        "exposed_pct": 100.0 * parts.get("exposed_comm", 0.0) / step,
        "exposed_time": _seconds(parts.get("exposed_comm", 0.0)),
        "bubble_pct": 100.0 * parts.get("bubble", 0.0) / step,
        "step_time": _seconds(step),
        "usd_per_mtok": float(cost.get("usd_per_million_tokens") or 0.0),
        "usd_per_step": float(cost.get("usd_per_step") or 0.0),
        "usd_per_hour": float(cost.get("usd_per_hour") or 0.0),
        "pricing": str(cost.get("pricing", "")),
        "tokens_per_s": f"{s.get('tokens_per_s') or 0.0:,.0f}",
        "cards": _cards(s),
        "breakdown": [
            {"key": k, "part": k.replace("_", " "), "seconds": _seconds(v), "pct": 100.0 * v / step}
            for k, v in parts.items()
        ],
        "comm": comm,
        "figures": [_uri(f) for f in figures],
        "reliability": _flatten("", s["reliability"]) if s.get("reliability") else [],
        **_injections(s),
        "run_facts": run_facts,
        "trace_note": trace_note,
        "files": list(files),
        "resolved_yaml": data.resolved_yaml,
        "versions": versions(),
    }
    return template_env().get_template("report.html.j2").render(context)


def _band(s: Mapping[str, Any]) -> str:
    unc = s.get("uncertainty")
    if not unc:
        return "n/a"
    low, high = unc["step_time_s"]
    return f"{_seconds(float(low))} .. {_seconds(float(high))}"


def _overlap_cells(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """For each run, whether its step-time interval overlaps the fastest run's: where it
    does, the calibration cannot tell the two apart."""
    fastest = min(summaries, key=lambda s: float(s["step_time_s"]))
    ref = fastest.get("uncertainty")
    cells = []
    for s in summaries:
        unc = s.get("uncertainty")
        if s is fastest:
            cells.append("(fastest)")
        elif not unc or not ref:
            cells.append("n/a")
        else:
            (a_low, a_high), (b_low, b_high) = unc["step_time_s"], ref["step_time_s"]
            hit = a_low <= b_high and b_low <= a_high
            cells.append("yes: not resolved" if hit else "no")
    return cells


def render_comparison(runs: Sequence[RunData], figures: Sequence[Rendered]) -> str:
    """The HTML page comparing several runs side by side."""
    summaries = [r.summary for r in runs]

    def row(label: str, values: Sequence[str]) -> dict[str, Any]:
        return {"label": label, "cells": list(values)}

    def cost(s: Mapping[str, Any], key: str) -> float:
        value = (s.get("cost") or {}).get(key)
        return float("nan") if value is None else float(value)

    rows = [
        row("cluster", [_cluster_text(s) for s in summaries]),
        row("model", [str(s.get("model", "")) for s in summaries]),
        row("layout", [_layout_text(s) for s in summaries]),
        row("step time", [_seconds(float(s["step_time_s"])) for s in summaries]),
        row("90% interval", [_band(s) for s in summaries]),
        row("interval overlaps the fastest's", _overlap_cells(summaries)),
        row("tokens / s", [f"{s.get('tokens_per_s') or 0.0:,.0f}" for s in summaries]),
        row("MFU", [f"{s.get('mfu') or 0.0:.1%}" for s in summaries]),
        row("HFU", [f"{s.get('hfu') or 0.0:.1%}" for s in summaries]),
    ]
    for part in summaries[0]["breakdown_s"]:
        rows.append(
            row(
                f"{part.replace('_', ' ')} (% of step)",
                [
                    f"{100.0 * s['breakdown_s'].get(part, 0.0) / s['step_time_s']:.1f}%"
                    for s in summaries
                ],
            )
        )
    rows += [
        row("$ / hour", [f"${cost(s, 'usd_per_hour'):,.2f}" for s in summaries]),
        row("$ / million tokens", [f"${cost(s, 'usd_per_million_tokens'):.3f}" for s in summaries]),
        row(
            "memory per chip",
            [
                f"{s.get('memory_gib_per_chip', {}).get('total', 0.0):.1f} of "
                f"{s.get('memory_gib_per_chip', {}).get('capacity', 0.0):.0f} GiB"
                for s in summaries
            ],
        ),
        row("fidelity", [str(s.get("fidelity", "")) for s in summaries]),
    ]
    per_tok = [cost(s, "usd_per_million_tokens") for s in summaries]
    valid = [(v, r.label) for v, r in zip(per_tok, runs, strict=True) if not math.isnan(v)]
    context = {
        "clustersim_version": __version__,
        "runs": [
            {
                "label": r.label,
                "source": str(r.source or ""),
                "step_time": _seconds(r.step_time_s),
                "exposed_pct": 100.0
                * r.summary["breakdown_s"].get("exposed_comm", 0.0)
                / r.step_time_s,
                "usd_per_mtok": cost(r.summary, "usd_per_million_tokens"),
            }
            for r in runs
        ],
        "cheapest": min(valid)[1] if len(valid) > 1 else "",
        "rows": rows,
        "figures": [_uri(f) for f in figures],
        "versions": versions(),
    }
    return template_env().get_template("comparison.html.j2").render(context)
