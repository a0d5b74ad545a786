"""Choosing cases, and turning case results into the bench's figures and targets.

The targets are those of the performance issue: the detailed engine within half
of bare SimPy's event rate, an UltraServer step in 30 s, 16K chips in 10 s, a
million chips in a minute and 4 GiB, a 1,024-rank all-reduce in a second, and
folded wall time growing well below linearly with the cluster; and those of the
mixture-of-experts issue: a 64 MiB all-to-all over 256 ranks in a second and over
4,096 in 10 s, a folded DeepSeek-V3 step on 16,384 chips in 30 s and on 131,072 in
120 s; and those of the serving issue: 10,000 Poisson requests on 8 TP8 replicas of
one trn2.48xlarge in 10 s, and one simulated hour at 50 requests/s on a Trn2
UltraServer in 60 s; and those of the dense-traffic issue: a 64 MiB all-to-all over
1,024 chips on a one-switch fabric file in a second and on a ring in 39 s and 4 GiB,
whole process through the CLI, and the 1M-chip fat tree in 20 s and 2 GiB; and that of
the Chakra issue: a trace of 200,000 nodes a rank loaded in 10 s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clustersim.bench.cases import (
    ALL_TO_ALL_INSTANCES,
    CASES,
    DENSE_ALL_TO_ALL,
    FAT_TREE_CHIPS,
    FOLD_CHIPS,
    MOE_CHIPS,
    SERVE_CASES,
)
from clustersim.errors import ScenarioError

__all__ = [
    "GROUPS",
    "QUICK",
    "SECTIONS",
    "event_rate",
    "scaling",
    "select_cases",
    "targets",
]

GIB = 2.0**30
QUICK = ("simpy", "ultraserver", "p5-moe", "collective", "a2a-256", "fold-1k", "fold-4k")
"""``--quick``: everything but the folded runs of 16K chips and more and the
4,096-rank all-to-all."""
SECTIONS: dict[str, tuple[str, ...]] = {
    "a": ("simpy", "ultraserver"),
    "b": ("ultraserver",),
    "c": ("fold-16k",),
    "d": ("fold-1m",),
    "e": ("collective",),
    "f": tuple(FOLD_CHIPS),
    "g": tuple(FAT_TREE_CHIPS),
}
"""The issue's sections and the cases each one reports."""
GROUPS: dict[str, tuple[str, ...]] = {
    "event-rate": SECTIONS["a"],
    "gpu": ("p5-moe",),
    "scaling": SECTIONS["f"],
    "fat-tree": SECTIONS["g"],
    "moe": tuple(MOE_CHIPS),
    "all-to-all": (*ALL_TO_ALL_INSTANCES, *DENSE_ALL_TO_ALL),
    "dense-traffic": (*DENSE_ALL_TO_ALL, "fattree-1m", "moe-128k"),
    "serving": (*SERVE_CASES, "serve-search"),
    "chakra": ("chakra-load", "chakra-8b"),
    "all": tuple(CASES),
}
"""Names ``--only`` accepts besides the case names."""

Cases = Mapping[str, Mapping[str, Any]]


def select_cases(only: Sequence[str] | None = None, *, quick: bool = False) -> list[str]:
    """The cases to run, in ``CASES`` order.

    ``only`` holds case names and group names (``event-rate``, ``scaling``, ``all``);
    ``quick`` keeps the groups (and the default of everything) to ``QUICK``, but a
    case named explicitly always runs.
    """
    chosen: set[str] = set()
    for name in only or ["all"]:
        if name in CASES:
            chosen.add(name)
        elif name in GROUPS:
            chosen.update(n for n in GROUPS[name] if not quick or n in QUICK)
        else:
            valid = ", ".join([*CASES, *GROUPS])
            raise ScenarioError("--only", name, f"unknown case; valid: {valid}")
    return [name for name in CASES if name in chosen]


def _ok(cases: Cases, name: str) -> Mapping[str, Any] | None:
    case = cases.get(name)
    return case["figures"] if case is not None and case["status"] == "ok" else None


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b > 0:
        return float(a) / float(b)
    return None


def event_rate(cases: Cases) -> dict[str, Any]:
    """Section a: bare SimPy against clustersim detailed, events per second and their ratio.

    clustersim's rate is its summary's: executed ops and transfers over the run's
    wall time (planning included). The SimPy-level rates count every event the
    kernel scheduled, over the same walls.
    """
    bare, detailed = _ok(cases, "simpy"), _ok(cases, "ultraserver")
    bare_rate = bare["events_per_s"] if bare else None
    bare_simpy = _ratio(bare["simpy_events"], bare["loop_wall_s"]) if bare else None
    rate = detailed["events_per_s"] if detailed else None
    simpy_rate = detailed["simpy_events_per_s"] if detailed else None
    return {
        "bare_simpy_events_per_s": bare_rate,
        "bare_simpy_scheduled_per_s": bare_simpy,
        "clustersim_events_per_s": rate,
        "clustersim_simpy_events_per_s": simpy_rate,
        "ratio": _ratio(rate, bare_rate),
        "simpy_level_ratio": _ratio(simpy_rate, bare_simpy),
    }


def scaling(cases: Cases) -> list[dict[str, Any]]:
    """Section f: one row per folded case that ran, with its wall against the previous row's."""
    rows: list[dict[str, Any]] = []
    previous: float | None = None
    for name, chips in FOLD_CHIPS.items():
        case = cases.get(name)
        if case is None:
            continue
        wall = case["wall_s"] if case["status"] == "ok" else None
        fig = case["figures"]
        rows.append(
            {
                "case": name,
                "chips": chips,
                "status": case["status"],
                "wall_s": case["wall_s"],
                "peak_rss_bytes": case["peak_rss_bytes"],
                "step_time_s": fig.get("step_time_s"),
                "vs_previous": _ratio(wall, previous),
            }
        )
        previous = wall
    return rows


# -- targets --------------------------------------------------------------------------


def _stopped(case: Mapping[str, Any]) -> str:
    if case["status"] in ("timeout", "memory"):
        return str(case["error"])
    return f"failed: {case['error']}"


def _target(
    key: str,
    what: str,
    goal: str,
    *,
    met: bool | None = None,
    value: float | None = None,
    shown: str = "",
    note: str = "",
) -> dict[str, Any]:
    """One target's row. ``met`` None: the case did not run (no ``shown``) or gave no figure."""
    status = "met" if met else "missed"
    if met is None and not shown:
        status = "not run"
    return {
        "key": key,
        "what": what,
        "target": goal,
        "value": value,
        "figure": shown or "-",
        "status": status,
        "note": note,
    }


def _wall_target(
    cases: Cases, key: str, name: str, what: str, limit_s: float, *, process: bool = False
) -> dict[str, Any]:
    """``name``'s wall time against ``limit_s``: the case's own, or (``process``) its child's
    whole life, interpreter start and imports included."""
    case = cases.get(name)
    goal = f"<= {limit_s:g} s"
    if case is None:
        return _target(key, what, goal)
    if case["status"] != "ok":
        return _target(key, what, goal, shown="no result", note=_stopped(case))
    wall = float(case["process_s" if process else "wall_s"])
    return _target(key, what, goal, met=wall <= limit_s, value=wall, shown=f"{wall:.2f} s")


def targets(cases: Cases) -> list[dict[str, Any]]:
    """Each target of the issue: ``met``, ``missed`` or ``not run``, with the figure."""
    out: list[dict[str, Any]] = []
    rate = event_rate(cases)
    what = "detailed / bare SimPy event rate"
    if "simpy" not in cases or "ultraserver" not in cases:
        out.append(_target("event_rate_ratio", what, ">= 0.5"))
    else:
        ratio = rate["ratio"]
        note = ""
        if ratio is None:
            bad = next(n for n in ("simpy", "ultraserver") if cases[n]["status"] != "ok")
            note = f"{bad} {_stopped(cases[bad])}"
        shown = f"{ratio:.3f}" if ratio is not None else "no result"
        met = ratio >= 0.5 if ratio is not None else None
        row = _target("event_rate_ratio", what, ">= 0.5", met=met, value=ratio, shown=shown)
        out.append({**row, "note": note})
    out.append(
        _wall_target(
            cases, "ultraserver_wall", "ultraserver", "UltraServer Llama-3-70B, detailed", 30
        )
    )
    out.append(_wall_target(cases, "fold_16k_wall", "fold-16k", "16,384-chip 405B step", 10))
    out.append(_wall_target(cases, "fold_1m_wall", "fold-1m", "1,048,576-chip step", 60))
    out.append(_rss_1m(cases))
    out.append(
        _wall_target(
            cases, "fattree_16k_wall", "fattree-16k", "16,384-chip 405B step, fat tree 2:1", 10
        )
    )
    out.append(
        _wall_target(cases, "fattree_1m_wall", "fattree-1m", "1,048,576-chip step, fat tree", 20)
    )
    out.append(_rss_1m(cases, "fattree-1m", "fattree_1m_rss", 2))
    out.append(
        _wall_target(cases, "collective_wall", "collective", "1,024-rank ring all-reduce", 1)
    )
    out.append(_wall_target(cases, "a2a_256_wall", "a2a-256", "256-rank all-to-all, 64 MiB", 1))
    out.append(_wall_target(cases, "a2a_4k_wall", "a2a-4k", "4,096-rank all-to-all, 64 MiB", 10))
    what = "1,024-chip all-to-all, 64 MiB, {} fabric file, CLI process"
    out.append(
        _wall_target(
            cases,
            "a2a_1024_switch_process",
            "a2a-1024-switch",
            what.format("switch"),
            1,
            process=True,
        )
    )
    out.append(
        _wall_target(
            cases, "a2a_1024_ring_process", "a2a-1024-ring", what.format("ring"), 39, process=True
        )
    )
    out.append(
        _rss(cases, "a2a-1024-ring", "a2a_1024_ring_rss", 4, "1,024-chip all-to-all peak RSS, ring")
    )
    out.append(_wall_target(cases, "moe_16k_wall", "moe-16k", "16,384-chip DeepSeek-V3 step", 30))
    out.append(
        _wall_target(cases, "moe_128k_wall", "moe-128k", "131,072-chip DeepSeek-V3 step", 120)
    )
    out.append(
        _wall_target(cases, "serve_trn2_wall", "serve-trn2", "10,000 requests, 8 TP8 replicas", 10)
    )
    out.append(
        _wall_target(
            cases,
            "serve_ultraserver_wall",
            "serve-ultraserver",
            "1 simulated hour at 50 requests/s, UltraServer",
            60,
        )
    )
    out.append(_chakra_load(cases))
    out.append(
        _wall_target(
            cases, "serve_search_wall", "serve-search", "capacity search, Llama-3-70B", 120
        )
    )
    out.append(_sublinear(cases))
    return out


def _chakra_load(cases: Cases) -> dict[str, Any]:
    """The load alone (``load_wall_s``), not the writing of the trace the case loads."""
    key, what, goal = "chakra_load_wall", "200,000-node Chakra trace load", "<= 10 s"
    case = cases.get("chakra-load")
    if case is None:
        return _target(key, what, goal)
    if case["status"] != "ok":
        return _target(key, what, goal, shown="no result", note=_stopped(case))
    wall = float(case["figures"]["load_wall_s"])
    return _target(key, what, goal, met=wall <= 10, value=wall, shown=f"{wall:.2f} s")


def _rss_1m(
    cases: Cases, name: str = "fold-1m", key: str = "fold_1m_rss", limit_gib: float = 4
) -> dict[str, Any]:
    return _rss(cases, name, key, limit_gib, f"1,048,576-chip step peak RSS{_on(name)}")


def _rss(cases: Cases, name: str, key: str, limit_gib: float, what: str) -> dict[str, Any]:
    """``name``'s peak resident memory against ``limit_gib``."""
    case = cases.get(name)
    goal = f"<= {limit_gib:g} GiB"
    if case is None:
        return _target(key, what, goal)
    rss = case["peak_rss_bytes"]
    shown = f"{rss / GIB:.2f} GiB" if rss is not None else "unknown"
    if case["status"] != "ok":
        # An unfinished step cannot meet the target, whatever it held when stopped.
        at = f"{shown} when stopped" if rss is not None else "no reading"
        return _target(key, what, goal, shown=at, note=_stopped(case))
    if rss is None:
        return _target(key, what, goal, shown=shown, note="no reading")
    met = rss <= limit_gib * GIB
    return _target(key, what, goal, met=met, value=float(rss), shown=shown)


def _on(name: str) -> str:
    return ", fat tree" if name in FAT_TREE_CHIPS else ""


def _sublinear(cases: Cases) -> dict[str, Any]:
    key, what, goal = "sublinear", "folded wall: 1M chips vs 16K chips", "< 10x"
    small, big = cases.get("fold-16k"), cases.get("fold-1m")
    if small is None or big is None:
        return _target(key, what, goal)
    if small["status"] != "ok":
        return _target(key, what, goal, shown="no result", note=_stopped(small))
    base = float(small["wall_s"])
    if big["status"] != "ok":
        # A lower bound only: the million-chip run was stopped before it finished.
        bound = _ratio(big["wall_s"], base)
        shown = f"> {bound:.1f}x" if bound is not None else "no result"
        return _target(key, what, goal, shown=shown, note=f"1M {_stopped(big)}")
    ratio = _ratio(big["wall_s"], base)
    shown = f"{ratio:.1f}x" if ratio is not None else "no result"
    met = ratio < 10 if ratio is not None else None
    return _target(key, what, goal, met=met, value=ratio, shown=shown)
