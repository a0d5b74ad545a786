"""Figures of the performance page that the bench's own definitions produce: its cases
with the groups ``--only`` accepts, and the targets it judges them against.

Neither runs a case: they read :data:`clustersim.bench.CASES`,
:data:`clustersim.bench.GROUPS` and the target rows of an empty run, so the page names
exactly the cases and targets that ``clustersim bench`` has. What the cases measure on
a given machine is what ``clustersim bench`` prints there.

Each entry of :data:`FIGURES` is ``(name, pattern, compute, noise, what, pages)``, a
figure of ``python -m clustersim.docs`` (a block where ``pattern`` is empty).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FIGURES", "bench_cases", "bench_targets"]


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


_PERF = ("docs/explanation/performance.md",)
FIGURES: tuple[tuple[str, str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    ("bench-cases", "", bench_cases, 0.0,
     "the cases of `clustersim bench`, their groups and `--quick`", _PERF),
    ("bench-targets", "", bench_targets, 0.0,
     "the targets `clustersim bench` judges its cases against", _PERF),
)  # fmt: skip
