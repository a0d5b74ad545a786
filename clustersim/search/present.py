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
    rows = result.top(top).to_dict(orient="records")
    note = overlap_note(result, rows)
    if note:
        table.caption = f"~ estimate (not simulated); {note}"
    for row in rows:
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


def overlap_note(result: SearchResult, rows: list[dict[Any, Any]]) -> str:
    """Which of the listed layouts the best cannot be told apart from: their 90% step-time
    intervals (from the chip family's leave-one-out calibration residuals) overlap the best's."""
    from clustersim import catalog
    from clustersim.catalog.fits import interval, overlaps

    if len(rows) < 2:
        return ""
    chip = catalog.instance(result.instance).chip

    def band(row: dict[Any, Any]) -> tuple[float, float]:
        sim = bool(row["simulated"]) and not row["sim_error"]
        step = float(row["sim_step_time_s" if sim else "est_step_time_s"])
        low, high, _ = interval(chip, step)
        return low, high

    best = band(rows[0])
    close = [str(r["rank"]) for r in rows[1:] if overlaps(best, band(r))]
    width = (best[1] - best[0]) / (best[0] + best[1])
    if not close:
        return f"step intervals ±{width:.0%}: the best's overlaps none of the others listed"
    return f"step intervals ±{width:.0%}: the best's overlaps #{', #'.join(close)}"
