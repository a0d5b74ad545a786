"""Hardware comparison from a study's results: $ and kWh per million tokens by pricing mode.

A pricing mode changes the dollars per hour, not the step, so one simulation per
point serves every mode: each point's $/M tokens under on-demand, reserved,
capacity-block and owned (TCO) pricing is its cluster's price per hour in that
mode (``cost.usd_per_hour`` from the catalog) over its simulated tokens per second.

Point names say what they are: ``<hardware>-<group>[-<group>...]``, e.g.
``trn2-chips64`` or ``h100-chips64-usd440`` (a point in two comparisons). Within
each group, every hardware is compared with a reference (``h100`` by default):
"x% better price-performance" means the reference's $/M tokens over the
hardware's, minus one. ``intervals_overlap`` says whether the two $/M tokens
intervals (from each chip family's leave-one-out calibration residuals and its
reference noise, ``uncertainty`` in summary.json) overlap: then the verdict is
within what the model can resolve.

``python -m clustersim.search.hardware STUDY_DIR [--out DIR] [--reference NAME]``
writes ``hardware.csv`` and ``hardware.png`` and prints the table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustersim import catalog
from clustersim.catalog.fits import interval, overlaps
from clustersim.cost import PRICING_MODES, usd_per_hour, usd_per_million_tokens
from clustersim.errors import ClusterSimError, ScenarioError
from clustersim.scenario.models import CostCfg

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["claim_table", "comparison_frame", "draw", "main"]

MODE_LABELS = {
    "on_demand": "on-demand",
    "reserved": "reserved",
    "capacity_block": "capacity block",
    "owned": "owned (TCO)",
}


def comparison_frame(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (group, hardware): throughput, $/M tokens per pricing mode, kWh/M tokens."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    ok = results[results["status"] == "ok"] if "status" in results else results
    for rec in ok.to_dict(orient="records"):
        name = str(rec["scenario"])
        hardware, *groups = name.split("-")
        inst = catalog.instance(str(rec["instance"]))
        chip = catalog.chip(str(rec["chip"]))
        count = int(rec["instances"])
        tps = float(rec["tokens_per_s"])
        base: dict[str, Any] = {
            "hardware": hardware,
            "instance": inst.name,
            "instances": count,
            "chips": int(rec["chips"]),
            "step_time_s": float(rec["step_time_s"]),
            "mfu": float(rec["mfu"]),
            "tokens_per_s": tps,
            "kwh_per_million_tokens": float(rec["energy.kwh_per_million_tokens"]),
            "power_kw": float(rec["energy.power_kw"]),
        }
        if "time_to_train_h" in rec:
            base["time_to_train_h"] = float(rec["time_to_train_h"])
        low, high, _ = interval(chip.name, base["step_time_s"])
        base["step_low_s"], base["step_high_s"] = low, high
        for mode in PRICING_MODES:
            hour = usd_per_hour(inst, count, CostCfg(pricing=mode), chip)
            base[f"usd_per_hour.{mode}"] = hour
            base[f"usd_per_million_tokens.{mode}"] = usd_per_million_tokens(hour, tps)
        for group in groups or ["all"]:
            rows.append({"group": group, **base})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    # Groups in order of first appearance, hardware in the study's order within each.
    group_order = {g: i for i, g in enumerate(dict.fromkeys(frame["group"]))}
    hw_order = {h: i for i, h in enumerate(dict.fromkeys(frame["hardware"]))}
    keys = [
        (group_order[g], hw_order[h])
        for g, h in zip(frame["group"], frame["hardware"], strict=True)
    ]
    order = sorted(range(len(frame)), key=keys.__getitem__)
    return frame.iloc[order].reset_index(drop=True)


def claim_table(frame: pd.DataFrame, reference: str = "h100") -> pd.DataFrame:
    """Price-performance of each hardware against ``reference``, per group and pricing mode:
    ``reference $/M tokens / hardware $/M tokens - 1`` (0.35 reads "35% better")."""
    import pandas as pd

    out: list[dict[str, Any]] = []
    for group, part in frame.groupby("group", sort=False):
        ref = part[part["hardware"] == reference]
        if ref.empty:
            continue
        for rec in part.to_dict(orient="records"):
            row: dict[str, Any] = {"group": group, "hardware": rec["hardware"]}
            for mode in PRICING_MODES:
                key = f"usd_per_million_tokens.{mode}"
                row[mode] = float(ref[key].iloc[0]) / rec[key] - 1.0
            row["energy"] = (
                float(ref["kwh_per_million_tokens"].iloc[0]) / rec["kwh_per_million_tokens"] - 1.0
            )
            if "step_low_s" in rec:
                # $/M tokens scales with the step time: the intervals of the two prices are
                # the step intervals scaled alike, so they overlap when those ratios meet.
                r_ref = float(ref["usd_per_million_tokens.on_demand"].iloc[0])
                r_rec = float(rec["usd_per_million_tokens.on_demand"])
                s_ref = float(ref["step_time_s"].iloc[0])
                a = (r_rec * rec["step_low_s"] / rec["step_time_s"],
                     r_rec * rec["step_high_s"] / rec["step_time_s"])  # fmt: skip
                b = (r_ref * float(ref["step_low_s"].iloc[0]) / s_ref,
                     r_ref * float(ref["step_high_s"].iloc[0]) / s_ref)  # fmt: skip
                row["intervals_overlap"] = overlaps(a, b)
            out.append(row)
    return pd.DataFrame(out)


def draw(frame: pd.DataFrame, path: Path, reference: str = "h100") -> None:
    """$/M tokens per pricing mode for each group, and kWh/M tokens, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from clustersim.trace.io import atomic_write

    groups = list(dict.fromkeys(frame["group"]))
    fig, axes = plt.subplots(1, len(groups) + 1, figsize=(5.2 * (len(groups) + 1), 4.2))
    width = 0.8 / len(PRICING_MODES)
    for ax, group in zip(axes, groups, strict=False):
        part = frame[frame["group"] == group]
        x = np.arange(len(part))
        for i, mode in enumerate(PRICING_MODES):
            ax.bar(
                x + (i - 1.5) * width,
                part[f"usd_per_million_tokens.{mode}"],
                width,
                label=MODE_LABELS[mode],
            )
        labels = [f"{h}\n{c} chips" for h, c in zip(part["hardware"], part["chips"], strict=True)]
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylabel("$ per million tokens")
        ax.set_title(_group_title(group, part))
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    ax = axes[-1]
    x = np.arange(len(groups))
    hardware = list(dict.fromkeys(frame["hardware"]))
    bar = 0.8 / max(len(hardware), 1)
    for i, hw in enumerate(hardware):
        vals = [
            _one(frame[(frame["group"] == g) & (frame["hardware"] == hw)], "kwh_per_million_tokens")
            for g in groups
        ]
        ax.bar(x + (i - (len(hardware) - 1) / 2) * bar, vals, bar, label=hw)
    ax.set_xticks(x, [_group_title(g, frame[frame["group"] == g]) for g in groups], fontsize=8)
    ax.set_ylabel("kWh per million tokens (facility, PUE included)")
    ax.set_title("energy")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.25)
    ax.legend(fontsize=8, ncol=3, loc="upper center")
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"same model and tokens on each hardware; reference {reference}", fontsize=10)
    fig.tight_layout()

    def save(tmp: Path) -> None:
        fig.savefig(tmp, format="png", dpi=110)

    try:
        atomic_write(path, save)
    finally:
        plt.close(fig)


def _one(part: pd.DataFrame, key: str) -> float:
    return float(part[key].iloc[0]) if len(part) else float("nan")


def _group_title(group: str, part: pd.DataFrame) -> str:
    chips = sorted(set(part["chips"]))
    if len(chips) == 1:
        return f"{group}: {chips[0]} chips each"
    hours = part["usd_per_hour.on_demand"]
    return f"{group}: ${hours.min():.0f}-{hours.max():.0f}/h on demand"


def main(argv: Sequence[str] | None = None) -> int:
    import pandas as pd

    p = argparse.ArgumentParser(prog="python -m clustersim.search.hardware")
    p.add_argument("study", type=Path, help="study directory of `clustersim sweep`")
    p.add_argument("--out", type=Path, help="output directory (default: the study directory)")
    p.add_argument("--reference", default="h100", help="hardware compared against (h100)")
    args = p.parse_args(argv)
    try:
        results = args.study / "results.parquet"
        if not results.is_file():
            raise ScenarioError("study", str(args.study), "no results.parquet: run the sweep first")
        frame = comparison_frame(pd.read_parquet(results))
        out = args.out or args.study
        out.mkdir(parents=True, exist_ok=True)
        from clustersim.trace.io import atomic_write_text

        atomic_write_text(out / "hardware.csv", frame.to_csv(index=False))
        draw(frame, out / "hardware.png", args.reference)
    except ClusterSimError as exc:
        print(f"clustersim: error: {exc}", file=sys.stderr)
        return exc.exit_code
    cols = ["group", "hardware", "chips", "step_time_s", "mfu", "kwh_per_million_tokens"]
    cols += [f"usd_per_million_tokens.{m}" for m in PRICING_MODES]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(frame[cols].round(3).to_string(index=False))
        print()
        print(f"price-performance against {args.reference} (ref $/M / hw $/M - 1):")
        print(claim_table(frame, args.reference).round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
