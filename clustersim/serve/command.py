"""``clustersim serve``: simulate a serving scenario, write its results, print a table.

The directory gets ``resolved_scenario.yaml``, ``requests.parquet`` (one row per
request), with ``output.trace`` ``iterations.parquet`` (one row per iteration of each
replica) and ``trace.json`` (:mod:`clustersim.trace.serving`), with ``output.html`` the
report (``report.html`` and its figures, written by the ``report`` callback the command
line passes: :mod:`clustersim.report.serving`) and, last, ``summary.json``, each written
atomically (:mod:`clustersim.trace.io`), so a directory with a summary is complete.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from clustersim.scenario import Resolved
from clustersim.serve.run import ServeResult, budget_warning, serve, serving_of
from clustersim.trace import atomic_write_text, write_parquet
from clustersim.trace.serving import write_serving_trace

__all__ = ["ReportWriter", "serve_table", "write_results"]

ReportWriter = Callable[[ServeResult, Path, list[str], str], object]
"""``report(result, out, files, trace_note)``: writes the report of ``result`` into ``out``."""


def write_results(
    res: Resolved, result: ServeResult, out: Path, report: ReportWriter | None = None
) -> None:
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    atomic_write_text(
        out / "resolved_scenario.yaml", yaml.safe_dump(res.as_dict(), sort_keys=False)
    )
    write_parquet(out / "requests.parquet", result.requests)
    files = ["summary.json", "requests.parquet", "resolved_scenario.yaml"]
    note = ""
    iterations = result.iterations
    if iterations is not None and res.scenario.output.trace:
        write_parquet(out / "iterations.parquet", iterations)
        info = write_serving_trace(
            out / "trace.json", iterations,
            failures=(result.summary.get("failures") or {}).get("injections", []),
            other={"scenario": res.scenario.name},
        )  # fmt: skip
        files += ["iterations.parquet", "trace.json"]
        note = (
            f"trace.json (open it in Perfetto, ui.perfetto.dev, or chrome://tracing): one "
            f"track per replica, {info.iterations_shown:,} of {info.iterations_total:,} "
            f"iterations, {info.events:,} events" + (" (capped)." if info.capped else ".")
        )
    if report is not None and res.scenario.output.html:
        report(result, out, files, note)
    text = json.dumps(result.summary, indent=2, sort_keys=False) + "\n"
    atomic_write_text(out / "summary.json", text)


def _ms(stats: dict[str, float | None]) -> str:
    if stats["p50"] is None:
        return "-"
    return f"{stats['p50'] * 1e3:,.1f} ms"


def _tail(stats: dict[str, float | None]) -> str:
    ms = {key: value * 1e3 for key, value in stats.items() if value is not None}
    if len(ms) < len(stats):
        return ""
    return f"mean {ms['mean']:,.1f}, p90 {ms['p90']:,.1f}, p99 {ms['p99']:,.1f} ms"


def _pp(s: dict[str, Any]) -> str:
    return f" x pp {s['pp']}" if s.get("pp", 1) > 1 else ""


def serve_table(s: dict[str, Any], out: str | None = None) -> Table:
    """What ``clustersim serve`` prints of a summary: metric, value and note."""
    title = (
        f"{s['scenario']}: {s['model']} on {s['instances']} x {s['instance']}, "
        f"{s['replicas']} replicas of tp {s['tp']}{_pp(s)} ({s['engine']})"
    )
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    t.add_column("note")
    arrival = s["arrival"]
    rule = {
        "poisson": lambda: f"Poisson arrivals at {arrival['rate_per_s']:g}/s",
        "gamma": lambda: f"gamma arrivals at {arrival['rate_per_s']:g}/s, cv {arrival['cv']:g}",
        "closed": lambda: f"closed loop of {arrival['concurrency']} clients",
        "trace": lambda: f"trace {Path(arrival['file']).name}",
    }[arrival["kind"]]()
    t.add_row("requests", f"{s['requests_finished']:,}", f"of {s['requests']:,}; {rule}")
    for key, name in (("ttft_s", "TTFT p50"), ("tpot_s", "TPOT p50"), ("e2e_s", "latency p50")):
        t.add_row(name, _ms(s[key]), _tail(s[key]))
    t.add_row(
        "throughput",
        f"{s['output_tokens_per_s']:,.0f} tok/s",
        f"{s['requests_per_s']:,.2f} req/s; goodput {s['goodput_requests_per_s']:,.2f} req/s "
        f"(TTFT <= {s['slo']['ttft_s']:g} s, TPOT <= {s['slo']['tpot_s']:g} s)",
    )
    t.add_row(
        "cost",
        f"${s['usd_per_million_output_tokens']:,.2f}/M out",
        f"${s['usd_per_million_input_tokens']:,.3f}/M in; ${s['usd_per_hour']:,.2f}/h",
    )
    energy = s["energy"]
    t.add_row(
        "energy",
        f"{energy['kwh_per_million_output_tokens']:,.2f} kWh/M out",
        f"{energy['kwh']:,.3g} kWh in all; {energy['power_kw']:,.1f} kW rated x PUE "
        f"{energy['pue']:g}",
    )
    t.add_row(
        "KV cache",
        f"{s['kv_cache_peak_fraction']:.1%} peak",
        f"{s['kv_cache_tokens_per_replica']:,} tokens per replica; "
        f"{s['preemptions']:,} preemptions; weights {s['weights_gib_per_rank']:.2f} GiB per rank",
    )
    if dis := s.get("disaggregation"):
        t.add_row(
            "KV transfer p50",
            _ms(dis["kv_transfer_s"]),
            f"{dis['prefill_replicas']} prefill -> {dis['decode_replicas']} decode replicas; "
            f"{dis['kv_bytes_moved'] / 2**30:,.1f} GiB moved; in TTFT",
        )
    if spec := s.get("speculative"):
        t.add_row(
            "speculative",
            f"{spec['tokens_per_step'] or 0:.2f} tok/step",
            f"draft {spec['draft_model']}, {spec['tokens']} tokens at acceptance "
            f"{spec['acceptance']:g} (expected {spec['expected_tokens_per_step']:.2f})",
        )
    if fail := s.get("failures"):
        for inj in fail["injections"]:
            around, before = inj["around"]["e2e_s"], inj["before"]["e2e_s"]
            was = f" (before: {before['p99']:,.1f} s)" if before["p99"] is not None else ""
            now = f"{around['p99']:,.1f} s" if around["p99"] is not None else "-"
            t.add_row(
                f"failure {inj['index']}",
                f"latency p99 {now}",
                f"{inj['name']} {inj['kind']} at {inj['at_s']:g} s: {inj['effect']}{was}",
            )
        t.add_row(
            "retried",
            f"{fail['requests_retried']:,} requests",
            f"KV of {fail['kv_tokens_lost']:,} tokens lost; "
            f"{fail['requests_unfinished']:,} requests unfinished",
        )
    if out is not None:
        t.add_row("wall time", f"{s['wall_s']:.2f} s", f"results in {out}")
    return t


def serve_command(
    res: Resolved, out: Path, *, quiet: bool, as_json: bool, report: ReportWriter | None = None
) -> int:
    from clustersim.terminal import console

    output = res.scenario.output
    warning = budget_warning(serving_of(res))
    if warning is not None and not quiet:
        print(f"clustersim serve: warning: {warning}", file=sys.stderr)
    result = serve(res, record=output.trace or (output.html and report is not None))
    write_results(res, result, out, report)
    if as_json:
        print(json.dumps(result.summary, indent=2))
    elif not quiet:
        console().print(serve_table(result.summary, str(out)))
    return 0
