"""The reliability figure: interruptions by cause and where the wall time went, from
the ``reliability`` section of ``summary.json`` (present when failures are configured)."""

from __future__ import annotations

from matplotlib.figure import Figure

from clustersim.report.data import RunData
from clustersim.report.figures import figure, new_figure, short, suptitle

__all__ = ["reliability"]

TIME_COLORS = {
    "useful training": "#55A868",
    "training redone": "#C44E52",
    "checkpoint": "#CCB974",
    "reroute": "#8172B2",
    "detection": "#DD8452",
    "waiting for nodes": "#8C8C8C",
    "restart": "#4C72B0",
}
MAX_CAUSES = 10


@figure(
    "reliability",
    "Reliability over the horizon",
    "Mean interruptions per run by cause (left), and the share of wall time spent training "
    "work that is kept, redoing work lost to failures, checkpointing and recovering (right).",
)
def reliability(data: RunData) -> Figure | None:
    rel = data.summary.get("reliability")
    if not rel:
        return None
    fig = new_figure(11.0, 4.2)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1.0]})
    causes = sorted(rel["interruptions_by_cause"].items(), key=lambda kv: kv[1])
    if len(causes) > MAX_CAUSES:
        rest = sum(n for _, n in causes[: len(causes) - MAX_CAUSES + 1])
        causes = [("other causes", rest), *causes[len(causes) - MAX_CAUSES + 1 :]]
    left.barh([short(c, 32) for c, _ in causes], [n for _, n in causes], color="#C44E52")
    left.set_xlabel("interruptions per run (mean)")
    left.set_title(f"{rel['interruptions']:.0f} interruptions, {rel['seeds']} seeds")
    t = rel["time_s"]
    redone = rel["lost"]["training_s"]
    parts = {
        "useful training": max(t["training"] - redone, 0.0),
        "training redone": redone,
        "checkpoint": t["checkpoint"],
        "reroute": t["reroute"],
        "detection": t["detection"],
        "waiting for nodes": t["waiting_for_nodes"],
        "restart": t["restart"],
    }
    total = sum(parts.values()) or 1.0
    start = 0.0
    for name, secs in parts.items():
        share = secs / total
        right.barh([0], [share], left=[start], color=TIME_COLORS[name], label=name)
        start += share
    right.set_xlim(0, 1)
    right.set_yticks([])
    right.set_xlabel("share of wall time")
    right.set_title(f"goodput {rel['goodput']:.1%}, ETTR {rel['ettr']:.1%}")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, fontsize=8)
    suptitle(fig, data, "failures over the horizon")
    return fig
