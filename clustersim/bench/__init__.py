"""Performance benchmarks: event rate, big-cluster steps, a large collective, scaling.

    result = run_bench(select_cases(["simpy", "collective"]), timeout_s=60)
    result["targets"]   # each target of the issue: met, missed or not run

Every case runs in a fresh child process (``python -m clustersim.bench --case
NAME``), so its wall time and peak memory are its own and a case that crashes,
hangs or runs out of time is reported instead of stopping the bench. The cases
are in ``bench.cases``, the child and its supervision in ``bench.runner``, the
figures and targets in ``bench.summary`` and the tables in ``bench.tables``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from clustersim.bench.cases import CASES, FOLD_CHIPS, fold_scenario
from clustersim.bench.runner import (
    DEFAULT_MAX_RSS_BYTES,
    DEFAULT_TIMEOUT_S,
    machine_info,
    run_case,
    run_cases,
)
from clustersim.bench.summary import GROUPS, QUICK, SECTIONS, event_rate, scaling, select_cases
from clustersim.bench.summary import targets as evaluate_targets
from clustersim.bench.tables import bench_tables

__all__ = [
    "CASES",
    "DEFAULT_MAX_RSS_BYTES",
    "DEFAULT_TIMEOUT_S",
    "FOLD_CHIPS",
    "GROUPS",
    "QUICK",
    "SECTIONS",
    "bench_tables",
    "evaluate_targets",
    "fold_scenario",
    "machine_info",
    "run_bench",
    "run_case",
    "select_cases",
]


def run_bench(
    names: Sequence[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rss_bytes: float = DEFAULT_MAX_RSS_BYTES,
    on_case: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the cases ``names`` one at a time and gather every figure as one JSON-ready dict.

    Keys: ``machine``, ``settings``, ``cases`` (by name, as ``run_case`` returns
    them), ``event_rate`` (section a), ``scaling`` (section f) and ``targets``.
    """
    machine = machine_info()
    cases = run_cases(names, timeout_s=timeout_s, max_rss_bytes=max_rss_bytes, on_case=on_case)
    return {
        "machine": machine,
        "settings": {
            "cases": list(names),
            "timeout_s": timeout_s,
            "max_rss_bytes": max_rss_bytes,
        },
        "cases": cases,
        "event_rate": event_rate(cases),
        "scaling": scaling(cases),
        "targets": evaluate_targets(cases),
    }
