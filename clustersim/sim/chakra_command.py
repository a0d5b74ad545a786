"""The commands of trace workloads: ``export chakra``, and the table ``run`` prints for a
trace workload's summary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustersim.errors import ScenarioError
from clustersim.scenario import Resolved
from clustersim.sim.chakra_export import export_chakra, slug

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["export_command", "trace_table"]


def export_command(
    res: Resolved,
    out: Path,
    prefix: str | None,
    *,
    ranks: list[int] | None = None,
    compress: bool = False,
) -> str:
    """Plan ``res``, export it (:func:`export_chakra`) and say what was written."""
    from clustersim.sim.run import compile_programs, plan

    if res.scenario.workload is not None:
        raise ScenarioError("workload", "chakra", "the scenario is a trace already")
    pl = plan(res)
    compiled = compile_programs(pl)
    name = prefix or slug(res.scenario.name)
    done = export_chakra(pl, compiled, out, name, ranks=ranks, compress=compress)
    return (
        f"wrote {len(done.files)} traces to {out}/{name}.{{rank}}.et"
        f"{'.gz' if compress else ''}: {done.nodes:,} nodes, "
        f"{done.bytes / 2**20:,.1f} MiB; process groups in {done.groups}"
    )


def trace_table(s: dict[str, Any], out: Path | None = None) -> Table:
    """The summary of a trace workload: no model, so no tokens, MFU or memory. Without
    ``out`` (the result directory) the wall time and directory rows are left out: what
    the docs quote, the same for every run of the trace."""
    from rich.table import Table

    w, step, cost = s["workload"], s["step_time_s"], s["cost"]
    title = f"{s['scenario']}: {s['chips']} x {s['chip']} ({s['instances']} x {s['instance']})"
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    t.add_column("note")
    how = "replicated" if w["replicate"] else f"{w['files']} files"
    t.add_row("workload", f"chakra, {s['ranks']} ranks", f"{w['chakra']} ({how}, {w['compute']})")
    t.add_row("step time", f"{step * 1e3:.6g} ms", f"{w['nodes_per_step']:,} nodes per step")
    for part, secs in s["breakdown_s"].items():
        t.add_row(
            f"  {part.replace('_', ' ')}", f"{secs * 1e3:.6g} ms", f"{secs / step:.1%} of step"
        )
    t.add_row("cost", f"${cost['usd_per_step']:.6g} /step", f"${cost['usd_per_hour']:,.2f}/h")
    if out is not None:
        events = f"{s['events']:,} events, {s['events_per_s']:,.0f}/s"
        t.add_row("simulated in", f"{s['wall_s']:.2f} s", events)
        t.add_row("written to", str(out), "")
    return t
