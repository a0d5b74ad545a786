"""Where the commands print: a console that fits a terminal, and plain text for pipes.

Also the table ``clustersim run`` prints of a summary (:func:`summary_table`), which
the docs quote as plain text (:func:`table_text`).

On a terminal, rich tables fit its width. Anywhere else (a pipe, a file) the
console is as wide as the content, so a table takes the width of its columns and
no row is wrapped: ``clustersim run ... | grep MFU`` sees whole rows. Data (YAML,
JSON) never goes through rich, whose wrapping at the console's width would break
it: JSON is printed as ``json.dumps`` writes it, and :func:`print_yaml` writes YAML
with every value on one line, whatever the terminal.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["PIPE_WIDTH", "console", "print_yaml", "summary_table", "table_text"]

PIPE_WIDTH = 100_000
"""Columns of the console when not on a terminal: wider than any table's content."""


def console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr): the terminal's width on a terminal,
    the content's width anywhere else."""
    from rich.console import Console

    con = Console(stderr=stderr)
    if con.is_terminal:
        return con
    return Console(stderr=stderr, width=PIPE_WIDTH)


def print_yaml(data: Any) -> None:
    """``data`` as YAML on stdout, each value on one line (no folding at 80 columns)."""
    import yaml

    sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1 << 30))


def summary_table(s: dict[str, Any], out: str | None = None) -> Table:
    """What `clustersim run` prints of a summary: a table of metric, value and note.
    Without ``out`` (the result directory) the wall time and directory rows are left out:
    what the docs quote, the same for every run of the scenario."""
    from rich.table import Table

    lay, mem, cost, step = s["layout"], s["memory_gib_per_chip"], s["cost"], s["step_time_s"]
    title = f"{s['scenario']}: {s['chips']} x {s['chip']} ({s['instances']} x {s['instance']})"
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    t.add_column("note")
    layout = (
        f"tp {lay['tp']} pp {lay['pp']} dp {lay['dp']} cp {lay['cp']}, "
        f"{lay['microbatches']} microbatches, {lay['schedule']}, recompute {lay['recompute']}"
    )
    t.add_row("model", s["model"], layout)
    software = s.get("software") or {}
    if software.get("stack"):
        t.add_row("software", str(software["stack"]), str(software.get("note", "")))
    unc = s.get("uncertainty")
    pm = ""
    if unc is not None:  # the interval's half-width, as a share of the point
        low, high = unc["step_time_s"]
        pm = f" ±{(high - low) / (2 * step):.0%}"
    t.add_row("step time", f"{step:.3f} s{pm}", f"{s['tokens_per_step']:,} tokens per step")
    t.add_row(
        "throughput", f"{s['tokens_per_s']:,.0f} tok/s{pm}", f"{s['sequences_per_s']:.2f} seq/s"
    )
    if unc is not None:
        low, high = unc["step_time_s"]
        t.add_row("interval", f"{low:.3f} .. {high:.3f} s", unc["basis"])
    t.add_row("MFU", f"{s['mfu']:.1%}", f"HFU {s['hfu']:.1%} (counts recompute)")
    for part, secs in s["breakdown_s"].items():
        t.add_row(f"  {part.replace('_', ' ')}", f"{secs:.3f} s", f"{secs / step:.1%} of step")
    parts = ", ".join(f"{k} {mem[k]:.1f}" for k in ("weights", "grads", "optimizer", "activations"))
    t.add_row(
        "memory per chip", f"{mem['total']:.1f} GiB", f"of {mem['capacity']:.0f} GiB: {parts}"
    )
    per_m = f"${cost['usd_per_million_tokens']:.3f} /M tok"
    t.add_row("cost", per_m, f"${cost['usd_per_hour']:,.2f}/h {cost['pricing']}")
    if "reliability" in s:
        rel = s["reliability"]
        lost = f"{rel['interruptions']:.0f} interruptions, ETTR {rel['ettr']:.1%}"
        t.add_row("goodput", f"{rel['goodput']:.2%}", lost)
        useful = rel["cost"]["usd_per_million_useful_tokens"]
        shown = f"${useful:.3f} /M tok" if useful is not None else "no useful work"
        t.add_row("useful cost", shown, "after failures and checkpoints")
        how = rel.get("degraded_step")
        if how is not None:  # continue_degraded without a given degraded step time
            note = f"derived: {how['method']} ({how['slowdown']:.3f}x)"
            t.add_row("degraded step", f"{how['step_time_s']:.3f} s", note)
    if out is not None:
        events = f"{s['events']:,} events, {s['events_per_s']:,.0f}/s"
        t.add_row("simulated in", f"{s['wall_s']:.2f} s", events)
        t.add_row("written to", out, "")
    return t


def table_text(table: Table, width: int = 200) -> str:
    """A rich table as plain text without its box, lines stripped: as quoted in the docs."""
    import io

    from rich import box
    from rich.console import Console

    table.box = box.SIMPLE_HEAD if table.show_header else None
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, soft_wrap=False).print(table)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines() if line.strip())
