"""What ``clustersim search`` prints: the counts, and the best layouts as a rich table."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from clustersim.search.run import SearchResult

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["counts_line", "search_table"]


def counts_line(result: SearchResult) -> str:
    c = result.counts
    text = (
        f"{result.scenario}: {result.chips} chips ({result.instances} x {result.instance}); "
        f"{c['enumerated']:,} layouts enumerated, {c['valid']:,} valid for the model, "
        f"{c['fit']:,} fit in HBM, {c['simulated']} simulated "
        f"(estimates in {result.estimate_s:.1f} s, search in {result.wall_s:.1f} s)"
    )
    if c.get("simulation_errors"):
        text += f"; {c['simulation_errors']} simulations failed (see sim_error)"
    if not c["fit"]:
        text += (
            "; no layout fits: use more chips or chips with more HBM"
            if c["valid"]
            else "; no layout is valid for the model (see the reason column)"
        )
    return text


def _num(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, fmt)


def search_table(result: SearchResult, top: int) -> Table:
    """The ``top`` best layouts that fit: simulated figures where simulated, else estimates."""
    from rich import box
    from rich.table import Table

    title = f"best layouts by {'step time' if result.objective == 'time' else '$ per M tokens'}"
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
        caption="~ estimate (not simulated)",
        caption_justify="left",
    )
    for name in ("#", "tp", "pp", "dp", "cp", "zero", "shard", "mb"):
        table.add_column(name, justify="right", no_wrap=True)
    for name in ("recomp", "sched"):
        table.add_column(name, no_wrap=True)
    for name in ("step s", "MFU", "GiB/chip", "$/M tok"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in result.top(top).to_dict(orient="records"):
        sim = bool(row["simulated"]) and not row["sim_error"]
        pre, mark = ("sim_", "") if sim else ("est_", "~")
        table.add_row(
            str(row["rank"]),
            str(row["tp"]),
            str(row["pp"]),
            str(row["dp"]),
            str(row["cp"]),
            str(row["zero"]),
            str(row["dp_shard"]),
            str(row["microbatch_size"]),
            _RECOMPUTE.get(str(row["recompute"]), str(row["recompute"])),
            str(row["schedule"]),
            mark + _num(row[f"{pre}step_time_s"], ".3f"),
            mark + _num(100 * row[f"{pre}mfu"], ".1f") + "%",
            _num(row["memory_gib_per_chip"], ".1f"),
            mark + _num(row[f"{pre}usd_per_million_tokens"], ".3f"),
        )
    return table


_RECOMPUTE = {"selective": "sel", "none": "none", "full": "full"}
