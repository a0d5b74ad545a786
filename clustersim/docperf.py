"""Figures of the performance page and the README that ``clustersim bench`` produces:
its cases with the groups ``--only`` accepts and the targets it judges them against
(read from its definitions, no case run), and what the cases measure (one run of the
bench, each case in a fresh process, shared by the figures that quote it; wall times
and memory with a wide noise band, since they follow the machine and its load).

Each entry of :data:`FIGURES` is ``(name, pattern, compute, noise, what, pages)``, a
figure of ``python -m clustersim.docs`` (a block where ``pattern`` is empty).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

__all__ = ["FIGURES", "MEASURED", "bench_cases", "bench_measured", "bench_targets", "readme_speed"]

MEASURED = (
    "simpy", "ultraserver", "fold-16k", "fattree-16k", "fold-1m", "fattree-1m", "a2a-4k",
    "a2a-1024-switch", "a2a-1024-ring", "moe-16k", "moe-128k",
)  # fmt: skip
"""The cases the measured tables quote, run once by :func:`_bench`."""
NOISE = 4.0
"""A wall time or peak memory may differ several-fold with the machine and its load;
only a drift past 5x (a stale figure) counts."""


def bench_cases(ctx: object = None) -> str:
    """Every bench case, what it runs, the groups that hold it and whether ``--quick``
    keeps it (a Markdown table)."""
    del ctx
    from clustersim.bench import CASES, GROUPS, QUICK

    out = ["| case | what it runs | groups | `--quick` |", "|---|---|---|---|"]
    for name, case in CASES.items():
        held = [g for g, members in GROUPS.items() if g != "all" and name in members]
        groups = ", ".join(f"`{g}`" for g in held)
        quick = "yes" if name in QUICK else ""
        out.append(f"| `{name}` | {case.title} | {groups} | {quick} |")
    return "\n".join(out)


def bench_targets(ctx: object = None) -> str:
    """Every target ``clustersim bench`` judges (a Markdown table)."""
    del ctx
    from clustersim.bench import evaluate_targets

    out = ["| what | target |", "|---|---|"]
    out += [f"| {t['what']} | {t['target']} |" for t in evaluate_targets({})]
    return "\n".join(out)


@cache
def _bench() -> dict[str, Any]:
    """One ``clustersim bench --json`` of :data:`MEASURED` (about 100 s on 2 cores)."""
    cmd = [sys.executable, "-m", "clustersim", "bench", "--json", "--only", *MEASURED]
    out = subprocess.run(
        [*cmd, "--timeout", "300", "--max-rss", "7GiB"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _wall(case: str) -> str:
    wall = float(_bench()["cases"][case]["wall_s"])
    return f"{wall:.1f} s" if wall >= 10 else f"{wall:.2f} s"


def _rss(case: str) -> str:
    return f"{_bench()['cases'][case]['peak_rss_bytes'] / 2**20:,.0f} MiB"


def bench_measured(ctx: object = None) -> str:
    """The measured cases against their targets (a Markdown table, one bench run)."""
    del ctx
    targets = {t["key"]: t for t in _bench()["targets"]}
    rows = [
        ("detailed / bare SimPy event rate", ">= 0.5", targets["event_rate_ratio"]["figure"]),
        ("`ultraserver`", "<= 30 s", f"{_wall('ultraserver')}, {_rss('ultraserver')}"),
        ("`fold-16k`", "<= 10 s", f"{_wall('fold-16k')}, {_rss('fold-16k')}"),
        ("`fattree-16k`", "<= 10 s", f"{_wall('fattree-16k')}, {_rss('fattree-16k')}"),
        ("`fold-1m`", "<= 60 s, <= 4 GiB", f"{_wall('fold-1m')}, {_rss('fold-1m')}"),
        ("`fattree-1m`", "<= 20 s, <= 2 GiB", f"{_wall('fattree-1m')}, {_rss('fattree-1m')}"),
        ("`a2a-4k`", "<= 10 s", _wall("a2a-4k")),
        ("`a2a-1024-switch`, whole process", "<= 1 s", _wall("a2a-1024-switch")),
        (
            "`a2a-1024-ring`, whole process",
            "<= 39 s, <= 4 GiB",
            f"{_wall('a2a-1024-ring')}, {_rss('a2a-1024-ring')}",
        ),
        ("`moe-16k`", "<= 30 s", _wall("moe-16k")),
        ("`moe-128k`", "<= 120 s", _wall("moe-128k")),
        ("folded wall, 1M chips against 16K", "< 10x", targets["sublinear"]["figure"]),
    ]
    out = ["| case | target | measured |", "|---|---|---|"]
    out += [f"| {case} | {target} | {value} |" for case, target, value in rows]
    return "\n".join(out)


def readme_speed(ctx: object = None) -> str:
    """The README's speed table (a Markdown table, the same bench run)."""
    del ctx
    rows = [
        ("Llama-3-70B on a Trn2 UltraServer, every rank simulated (256 ranks)", "ultraserver"),
        ("Llama-3-405B on 16,384 Trn2 chips, folded", "fold-16k"),
        ("one step on 1,048,576 Trn2 chips, folded", "fold-1m"),
        ("the same on a fat tree (`fattree-1m`)", "fattree-1m"),
        ("DeepSeek-V3 on 16,384 Trn2 chips, folded", "moe-16k"),
    ]
    out = ["| case | wall | memory |", "|---|---|---|"]
    out += [f"| {what} | {_wall(case)} | {_rss(case)} |" for what, case in rows]
    out.append(
        "| 64 MiB all-to-all over 1,024 chips, one-switch fabric file, whole process "
        f"| {_wall('a2a-1024-switch')} | {_rss('a2a-1024-switch')} |"
    )
    return "\n".join(out)


_PERF = ("docs/explanation/performance.md",)
FIGURES: tuple[tuple[str, str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    ("bench-cases", "", bench_cases, 0.0,
     "the cases of `clustersim bench`, their groups and `--quick`", _PERF),
    ("bench-targets", "", bench_targets, 0.0,
     "the targets `clustersim bench` judges its cases against", _PERF),
    ("bench-measured", "", bench_measured, NOISE,
     "one run of the bench's cases against their targets: wall time and peak memory", _PERF),
    ("readme-speed", "", readme_speed, NOISE,
     "the README's speed table, from the same bench run", ("README.md",)),
)  # fmt: skip
