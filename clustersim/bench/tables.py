"""The bench's figures as rich tables: the machine, one table per section, the targets.

Sections with one case are printed as two columns (figure, value), so they stay
readable in 80 columns; the scaling table has a row per chip count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from clustersim.bench.summary import SECTIONS

__all__ = ["bench_tables", "machine_table", "targets_table"]

GIB = 2.0**30
_STYLE = {"ok": "green", "met": "green", "missed": "red", "not run": "dim", "timeout": "yellow"}


def _secs(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f} s" if isinstance(value, int | float) else "-"


def _bytes(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / 2**20:.0f} MiB"


def _count(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, int | float) else "-"


def _status(case: Mapping[str, Any]) -> str:
    status = str(case["status"])
    shown = "over memory" if status == "memory" else status
    return f"[{_STYLE.get(status, 'red')}]{shown}[/]"


def _note(case: Mapping[str, Any]) -> str:
    parts = [str(case["error"])] if case["status"] != "ok" and case.get("error") else []
    if case.get("phase"):
        parts.append(f"stopped while {case['phase']}")
    if case.get("where"):
        parts.append(f"in {case['where']}")
    return "; ".join(parts)


def _pairs(title: str) -> Table:
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("figure", style="bold", no_wrap=True)
    t.add_column("value")
    return t


def machine_table(machine: Mapping[str, Any]) -> Table:
    t = _pairs("machine")
    mem = machine.get("memory_bytes")
    cores = f"{machine['cores']} logical ({machine['cores_usable']} usable by this process)"
    t.add_row("CPU", str(machine["cpu"]))
    t.add_row("cores", cores)
    if load := machine.get("load_average"):
        t.add_row("load average", " ".join(f"{x:.2f}" for x in load) + "  (1, 5, 15 min, at start)")
    t.add_row("memory", _bytes(mem) if mem else "unknown")
    t.add_row("Python", f"{machine['python']} ({machine['implementation']})")
    t.add_row("platform", str(machine["platform"]))
    versions = f"clustersim {machine['clustersim']}, SimPy {machine['simpy']}"
    t.add_row("software", f"{versions}, NumPy {machine['numpy']}")
    return t


def _case_rows(t: Table, case: Mapping[str, Any]) -> None:
    """The rows every case has: status, wall, process time, peak memory, error."""
    t.add_row("status", _status(case))
    if case["status"] == "ok":
        t.add_row("wall", f"{_secs(case['wall_s'])}  (the case itself, imports excluded)")
    else:
        t.add_row("wall", f"{_secs(case['wall_s'])}  (until stopped)")
    t.add_row("process", f"{_secs(case['process_s'])}  (interpreter start to exit)")
    peak = _bytes(case["peak_rss_bytes"])
    t.add_row("peak RSS", peak if case["status"] == "ok" else f"{peak} when stopped")
    if note := _note(case):
        t.add_row("note", note)


def _step_table(title: str, case: Mapping[str, Any]) -> Table:
    t = _pairs(title)
    _case_rows(t, case)
    f = case["figures"]
    if f:
        t.add_row("scenario", f"{f['scenario']} ({f['fidelity']})")
        cluster = f"{f['chips']:,} chips, {f['ranks']:,} ranks, {f['simulated_ranks']:,} simulated"
        t.add_row("cluster", cluster)
        t.add_row("layout", f"{f['layout']}, global batch {f['global_batch_size']:,}")
        t.add_row("step time", _secs(f["step_time_s"], 3) + " simulated")
        events = f"{_count(f['events'])} ops + transfers, {_count(f['simpy_events'])} SimPy"
        t.add_row("events", events)
        t.add_row("sim wall", f"{_secs(f['sim_wall_s'])}  (simulate(): plan, topology, run)")
    return t


def _rate_table(cases: Mapping[str, Mapping[str, Any]], rate: Mapping[str, Any]) -> Table:
    t = Table(title="a. event rate: bare SimPy vs clustersim detailed", title_justify="left")
    t.add_column("", style="bold", no_wrap=True)
    t.add_column("bare SimPy", justify="right")
    t.add_column("clustersim detailed", justify="right")
    t.add_column("ratio", justify="right")
    bare, det = cases.get("simpy"), cases.get("ultraserver")
    fb = bare["figures"] if bare else {}
    fd = det["figures"] if det else {}

    def ratio(value: Any) -> str:
        return f"{value:.3f}" if value is not None else "-"

    t.add_row("status", _status(bare) if bare else "not run", _status(det) if det else "not run")
    procs = f"{fb.get('processes', '-')} processes" if fb else "-"
    t.add_row("workload", procs, str(fd.get("scenario", "-")))
    t.add_row("events", _count(fb.get("events")), _count(fd.get("events")))
    t.add_row("  counted as", "timeout(1)", "ops + transfers")
    t.add_row("wall", _secs(fb.get("loop_wall_s"), 3), _secs(fd.get("sim_wall_s")))
    t.add_row("  measured over", "env.run()", "simulate()")
    t.add_row(
        "events/s",
        _count(fb.get("events_per_s")),
        _count(fd.get("events_per_s")),
        ratio(rate["ratio"]),
    )
    t.add_row("SimPy events", _count(fb.get("simpy_events")), _count(fd.get("simpy_events")))
    t.add_row(
        "SimPy events/s",
        _count(rate["bare_simpy_scheduled_per_s"]),
        _count(fd.get("simpy_events_per_s")),
        ratio(rate["simpy_level_ratio"]),
    )
    t.add_row(
        "peak RSS",
        _bytes(bare["peak_rss_bytes"]) if bare else "-",
        _bytes(det["peak_rss_bytes"]) if det else "-",
    )
    return t


def _collective_table(case: Mapping[str, Any]) -> Table:
    t = _pairs("e. ring all-reduce, 1 GiB over 1,024 ranks (64 x trn2.48xlarge)")
    _case_rows(t, case)
    f = case["figures"]
    if f:
        t.add_row("ranks", f"{f['ranks']:,}, algorithm {f['algorithm']}")
        t.add_row("simulated time", _secs(f["collective_time_s"], 4))
        t.add_row("busbw", f"{f['busbw_GBps']:.1f} GB/s")
    return t


def _chakra_table(name: str, case: Mapping[str, Any]) -> Table:
    f = case["figures"]
    if name == "chakra-load":
        t = _pairs("i. Chakra: one rank's trace of 200,000 nodes loaded")
        _case_rows(t, case)
        if f:
            t.add_row("trace", f"{f['nodes']:,} nodes, {_bytes(f['file_bytes'])}")
            t.add_row("load", f"{_secs(f['load_wall_s'])} wall, {_secs(f['load_cpu_s'])} CPU "
                      "(decode, check, compile)")  # fmt: skip
        return t
    t = _pairs("i. Chakra: Llama-3-8B step on one trn2.48xlarge exported, imported and run")
    _case_rows(t, case)
    if f:
        t.add_row("traces", f"{f['ranks']} ranks, {f['nodes']:,} nodes, {_bytes(f['trace_bytes'])}")
        t.add_row("export", _secs(f["export_wall_s"]))
        t.add_row("import and run", f"{_secs(f['import_wall_s'])}, {_count(f['events'])} events")
        built, err = _secs(f["built_step_time_s"], 4), f"{f['round_trip_error']:+.4%}"
        t.add_row("step time", f"{_secs(f['step_time_s'], 4)} imported, {built} built ({err})")
    return t


def _serve_table(title: str, case: Mapping[str, Any]) -> Table:
    t = _pairs(title)
    _case_rows(t, case)
    f = case["figures"]
    if f:
        t.add_row("scenario", f"{f['scenario']}: {f['replicas']} replicas on "
                  f"{f['instances']} x {f['instance']}")  # fmt: skip
        t.add_row("requests", f"{f['requests']:,} over {_secs(f['simulated_s'])} simulated")
        t.add_row("iterations", _count(f["iterations"]))
        t.add_row(
            "latency p50",
            f"TTFT {f['ttft_p50_s'] * 1e3:,.1f} ms, TPOT {f['tpot_p50_s'] * 1e3:,.2f} ms",
        )
        t.add_row("sim wall", f"{_secs(f['sim_wall_s'])}  (serve(): iteration model, requests)")
    return t


def _serve_search_table(case: Mapping[str, Any]) -> Table:
    t = _pairs("h. serving: capacity search, Llama-3-70B over five instance families")
    _case_rows(t, case)
    f = case["figures"]
    if f:
        t.add_row("search", f"{f['scenario']} at {f['rate_per_s']:g} requests/s: "
                  f"{f['layouts']} layouts, {f['layouts_skipped']} refused, "
                  f"{f['simulated']} candidates simulated")  # fmt: skip
        usd = f["pick_usd_per_million_output_tokens"]
        t.add_row("pick", f"{f['pick']}, ${usd:,.2f}/M output tokens" if f["pick"] else "none")
        t.add_row("search wall", _secs(f["search_wall_s"]))
    return t


def _scaling_table(cases: Mapping[str, Mapping[str, Any]], rows: list[dict[str, Any]]) -> Table:
    t = Table(title="f. folded wall time against chips (x4 per row)", title_justify="left")
    for header in ("chips", "status", "wall", "x prev", "peak RSS", "step time"):
        t.add_column(header, justify="left" if header == "status" else "right", no_wrap=True)
    t.add_column("note")
    for row in rows:
        case = cases[row["case"]]
        ratio = row["vs_previous"]
        t.add_row(
            f"{row['chips']:,}", _status(case), _secs(row["wall_s"]),
            f"{ratio:.2f}x" if ratio is not None else "-", _bytes(row["peak_rss_bytes"]),
            _secs(row["step_time_s"], 3), _note(case),
        )  # fmt: skip
    return t


def targets_table(targets: Sequence[Mapping[str, Any]]) -> Table:
    t = Table(title="summary: targets of the issue", title_justify="left")
    for header in ("what", "target", "figure", "status"):
        t.add_column(header, justify="right" if header in ("target", "figure") else "left")
    t.add_column("note")
    for tg in targets:
        style = _STYLE.get(str(tg["status"]), "red")
        t.add_row(
            str(tg["what"]), str(tg["target"]), str(tg["figure"]),
            f"[{style}]{tg['status']}[/]", str(tg["note"]),
        )  # fmt: skip
    return t


def bench_tables(result: Mapping[str, Any]) -> list[Table]:
    """The tables of a ``run_bench`` result, in print order; sections not run are left out."""
    cases: Mapping[str, Mapping[str, Any]] = result["cases"]
    out = [machine_table(result["machine"])]
    if any(n in cases for n in SECTIONS["a"]):
        out.append(_rate_table(cases, result["event_rate"]))
    titles = {
        "ultraserver": "b. Trn2 UltraServer (64 chips) Llama-3-70B step, detailed",
        "fold-16k": "c. Llama-3-405B on 16,384 Trn2 chips (1,024 x trn2.48xlarge), folded",
        "fold-1m": "d. one step on 1,048,576 Trn2 chips (65,536 x trn2.48xlarge), folded",
        "fattree-16k": "g. Llama-3-405B on 16,384 Trn2 chips, fat tree 2:1 at the top, folded",
        "fattree-1m": "g. one step on 1,048,576 Trn2 chips, fat tree 2:1 at the top, folded",
    }
    for name, title in titles.items():
        if name in cases:
            out.append(_step_table(title, cases[name]))
    if "collective" in cases:
        out.append(_collective_table(cases["collective"]))
    if result["scaling"]:
        out.append(_scaling_table(cases, result["scaling"]))
    serving = {
        "serve-trn2": "h. serving: 10,000 Poisson requests on one trn2.48xlarge (8 TP8 replicas)",
        "serve-ultraserver": "h. serving: one simulated hour at 50 requests/s on a Trn2 "
        "UltraServer (32 TP8 replicas)",
    }
    for name, title in serving.items():
        if name in cases:
            out.append(_serve_table(title, cases[name]))
    for name in ("chakra-load", "chakra-8b"):
        if name in cases:
            out.append(_chakra_table(name, cases[name]))
    if "serve-search" in cases:
        out.append(_serve_search_table(cases["serve-search"]))
    out.append(targets_table(result["targets"]))
    return out
