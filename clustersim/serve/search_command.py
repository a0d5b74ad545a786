"""``clustersim serve-search``: check the input, search, write the table and figure,
print the pick and the best candidates.

The output directory gets ``serve_search.parquet`` and ``serve_search.csv`` (one row
per layout or simulated candidate), ``pareto.png`` (drawn by the ``figure`` callback
the command line passes: :mod:`clustersim.report.serve_search`) and, last,
``serve_search.json`` (the settings, counts and pick), each written atomically.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from clustersim.errors import MISSING, ScenarioError
from clustersim.scenario import load_scenario
from clustersim.serve.capacity import (
    DEFAULT_INSTANCES,
    CapacityResult,
    serve_search,
    write_serve_search,
)

__all__ = ["parse_rate", "search_table", "serve_search_command", "skipped_line"]

Figure = Callable[[CapacityResult], bytes]


def parse_rate(text: str) -> float:
    """``--rate``: a positive, finite number of requests per second, or exit 2."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not 0 < rate < math.inf:
        raise ScenarioError("--rate", text, "must be a positive, finite number of requests/s")
    return rate


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return slug[:80] or "scenario"


_KINDS = (
    ("model:", "do not fit HBM"),
    ("parallelism.tp:", "have a tp the KV heads refuse"),
    ("serving.max_num_seqs:", "reserve more KV than fits (Neuron)"),
    ("serving.precision:", "lack the precision"),
    ("batch-1 decode", "decode slower than the TPOT target at batch 1"),
    ("one prompt's prefill", "prefill one prompt slower than the TTFT target"),
)


def skipped_line(result: CapacityResult) -> str:
    """How many layouts were refused before simulating, grouped by why."""
    frame = result.frame
    reasons = frame.loc[frame["status"] == "skipped", "reason"]
    if reasons.empty:
        return "no layout refused"
    kinds: Counter[str] = Counter()
    for reason in reasons:
        kinds[next((k for p, k in _KINDS if str(reason).startswith(p)), "other")] += 1
    parts = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    return f"refused before simulating: {parts} (reasons in serve_search.csv)"


def _ms(value: Any) -> str:
    if value is None or not math.isfinite(float(value)):
        return "-"
    return f"{value * 1e3:,.1f}"


def search_table(result: CapacityResult, top: int) -> Table:
    """The pick and the best candidates that met the SLO, then the closest misses."""
    from rich import box

    meta = result.meta
    slo = meta["slo"]
    table = Table(
        title=f"cheapest first; SLO: TTFT p90 <= {slo['ttft_s']:g} s, TPOT p90 <= "
        f"{slo['tpot_s'] * 1e3:g} ms at {meta['rate_per_s']:g} requests/s",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for name in ("", "instance", "tp", "batch", "inst.", "repl."):
        table.add_column(name, justify="left" if name in ("", "instance") else "right")
    for name in ("$/h", "$/M out", "TTFT p90 ms", "TPOT p90 ms", "tok/s per $/h"):
        table.add_column(name, justify="right")
    frame = result.frame
    shown = frame[frame["status"].isin(["pick", "meets"])].head(top)
    for row in shown.to_dict(orient="records"):
        table.add_row(
            "pick" if row["status"] == "pick" else "",
            str(row["instance"]),
            str(row["tp"]),
            str(row["max_num_seqs"]),
            str(row["instances"]),
            str(row["replicas"]),
            f"{row['usd_per_hour']:,.2f}",
            f"{row['usd_per_million_output_tokens']:,.2f}",
            _ms(row["ttft_p90_s"]),
            _ms(row["tpot_p90_s"]),
            f"{row['output_tokens_per_s_per_usd_hour']:,.1f}",
        )
    return table


def serve_search_command(args: argparse.Namespace, figure: Figure | None = None) -> int:
    from clustersim.progress import Bar
    from clustersim.terminal import console

    rate = parse_rate(args.rate)
    res = load_scenario(args.scenario, list(args.sets), args.seed)
    if res.scenario.serving is None:
        raise ScenarioError("serving", MISSING, "clustersim serve-search needs a serving scenario")
    err = console(stderr=True)
    bar = (
        None
        if (args.json or args.quiet)
        else Bar(err, eta=False, template="simulating {task.description}")
    )
    try:
        result = serve_search(
            res,
            rate,
            instances=args.instances or DEFAULT_INSTANCES,
            requests=args.requests,
            max_instances=args.max_instances,
            progress=None if bar is None else bar.update,
        )
    finally:
        if bar is not None:
            bar.close()
    out = args.out or Path("reports") / f"{_slug(res.scenario.name)}-serve-search"
    paths = write_serve_search(out, result, figure)
    if args.json:
        print(json.dumps({**result.meta, "files": [str(p) for p in paths]}, indent=2))
        return 0
    if args.quiet:
        return 0
    con = console()
    meta = result.meta
    con.print(
        f"{meta['scenario']}: {meta['model']} at {meta['rate_per_s']:g} requests/s over "
        f"{', '.join(meta['instances_searched'])}; {meta['layouts']} layouts, "
        f"{meta['simulated']} candidates simulated with {meta['requests_per_candidate']} "
        f"requests each (the pick with {meta['requests_pick']}) in {meta['wall_s']:.1f} s",
        markup=False,
        highlight=False,
    )
    con.print(skipped_line(result), markup=False, highlight=False)
    pick = result.pick
    if pick is None:
        con.print(
            "no candidate met the SLO: raise --max-instances, add --instance types, or "
            "relax serving.slo (closest misses in serve_search.csv)",
            markup=False,
        )
    else:
        con.print(search_table(result, args.top))
    con.print(f"table: {paths[0]} ({paths[1].name}); figure: {out / 'pareto.png'}", markup=False)
    return 0
