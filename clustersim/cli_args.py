"""The command line's arguments: one argparse parser per subcommand.

Usage errors are one line on stderr with exit code 2, like every other bad input.
Building the parser imports nothing of the simulator (``--help`` stays fast): the
few names it shows are spelled here, and tests hold them to their sources.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from clustersim._version import __version__

__all__ = ["CATALOG_KINDS", "RELIABILITY_FILES", "STUDY_MAX_EVENTS", "build_parser"]

CATALOG_KINDS = ("chips", "instances", "models", "stacks")
"""``clustersim.catalog.KINDS`` and the software stacks, without importing the catalogs."""
STUDY_MAX_EVENTS = 2e9
"""``clustersim.sweep.guard.STUDY_MAX_EVENTS``, the default of ``sweep --max-events``."""
RELIABILITY_FILES = ("reliability.json", "reliability_timeline.parquet")
"""What ``reliability --out`` writes: ``failures.command.RESULT_FILE`` and
``failures.TIMELINE_FILE``."""


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line, like every other bad input (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="clustersim",
        description="Discrete-event simulator of AI-training clusters (Trainium and GPUs).",
    )
    p.add_argument("--version", action="version", version=f"clustersim {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="simulate a scenario and write summary, trace and report")
    _simulate_arguments(run, "scenario YAML file", "parallelism.tp=4")
    run.add_argument(
        "--no-report", action="store_true",
        help="skip trace.json, the figures and report.html (rebuild later with `report`)",
    )  # fmt: skip
    run.add_argument(
        "--fidelity", choices=("auto", "detailed", "folded"), default="auto",
        help="simulate every rank, or one per pipeline stage with all ranks' traffic "
        "(auto: folded above 256 ranks, or where every rank would exceed the work limits)",
    )  # fmt: skip
    _chip_model(run)
    run.add_argument(
        "--max-events", type=float, default=60e6, metavar="N",
        help="refuse runs estimated above N simulated events (default 6e7)",
    )  # fmt: skip
    run.add_argument(
        "--max-memory", default="8GiB", metavar="SIZE",
        help="refuse runs estimated to need more memory (default 8GiB)",
    )  # fmt: skip
    _force(run)

    serve = sub.add_parser(
        "serve", help="simulate inference serving: requests, TTFT, TPOT, throughput, cost"
    )
    _simulate_arguments(
        serve, "scenario YAML file with a serving section", "serving.arrival.rate_per_s=10"
    )
    _force(serve)

    ssearch = sub.add_parser(
        "serve-search",
        help="find the cheapest instance type, TP and instance count meeting a serving SLO",
    )
    ssearch.add_argument("scenario", type=Path, help="scenario YAML file with a serving section")
    ssearch.add_argument(
        "--rate", required=True, metavar="R", help="Poisson arrival rate, requests per second"
    )
    ssearch.add_argument(
        "--instance", dest="instances", action="append", metavar="NAME",
        help="an instance type to search (repeatable; default: trn2.48xlarge, "
        "trn1.32xlarge, inf2.48xlarge, inf2.24xlarge, inf2.8xlarge, inf2.xlarge, "
        "p5.48xlarge, p5en.48xlarge)",
    )  # fmt: skip
    ssearch.add_argument(
        "--requests", type=_positive, default=400, metavar="N",
        help="requests simulated per candidate (default 400; the pick is simulated again "
        "with the scenario's serving.requests when that is more)",
    )  # fmt: skip
    ssearch.add_argument(
        "--max-instances", type=_positive, default=16, metavar="N",
        help="most instances of one type a candidate may use (default 16)",
    )  # fmt: skip
    ssearch.add_argument("--top", type=_positive, default=10, metavar="K", help="rows printed (10)")
    ssearch.add_argument(
        "--out", type=Path, help="output directory (default reports/<name>-serve-search/)"
    )
    ssearch.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="override a scenario key, e.g. --set serving.slo.tpot_s=0.05 (repeatable)",
    )  # fmt: skip
    ssearch.add_argument("--seed", type=int, help="random seed (overrides the scenario's)")
    ssearch.add_argument("--quiet", action="store_true", help="print nothing on success")
    ssearch.add_argument(
        "--json", action="store_true", help="print the settings, counts and pick as JSON"
    )

    check = sub.add_parser("check", help="validate a scenario; print layout, placement, memory")
    check.add_argument("scenario", type=Path)
    check.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")

    topo = sub.add_parser(
        "topology", help="the fabric as a graph: export the built one (GraphML, GML, JSON)"
    )
    topo_sub = topo.add_subparsers(dest="topology_command", required=True, metavar="ACTION")
    export = topo_sub.add_parser(
        "export", help="write a scenario's fabric (chips, switches, links) as a networkx graph"
    )
    export.add_argument("scenario", type=Path, help="scenario YAML file")
    export.add_argument("--out", type=Path, required=True, help="file to write")
    export.add_argument(
        "--format", choices=("graphml", "gml", "json"),
        help="graph format (default: from the suffix of --out; json is node-link JSON)",
    )  # fmt: skip
    export.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")

    exp = sub.add_parser("export", help="write a scenario's workload as execution traces")
    exp_sub = exp.add_subparsers(dest="export_format", required=True, metavar="FORMAT")
    chakra = exp_sub.add_parser(
        "chakra", help="Chakra execution traces, one file per rank, and comm_group.json"
    )
    chakra.add_argument("scenario", type=Path, help="scenario YAML file")
    chakra.add_argument("--out", type=Path, required=True, help="directory to write")
    chakra.add_argument("--prefix", help="file name prefix (default: the scenario's name)")
    chakra.add_argument(
        "--rank", dest="ranks", action="append", type=int, metavar="R",
        help="write only this rank's trace (repeatable; comm_group.json is always whole)",
    )  # fmt: skip
    chakra.add_argument("--gzip", action="store_true", help="write PREFIX.{rank}.et.gz")
    chakra.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")

    cat = sub.add_parser("catalog", help="list or show catalog entries")
    cat.add_argument("kind", nargs="?", choices=CATALOG_KINDS)
    cat.add_argument("name", nargs="?")

    sub.add_parser("schema", help="print the JSON Schema of scenario files")

    rep = sub.add_parser(
        "report", help="rebuild report.html, figures and trace.json from saved results"
    )
    rep.add_argument(
        "dirs", nargs="+", type=Path, metavar="DIR",
        help="result directories of `clustersim run`; several make a comparison report",
    )  # fmt: skip
    rep.add_argument(
        "--out", type=Path,
        help="output directory (default: DIR itself; reports/comparison/ for several DIRs)",
    )  # fmt: skip
    rep.add_argument(
        "--trace-ranks", type=_positive, default=None, metavar="N",
        help="ranks shown in trace.json (default 8)",
    )  # fmt: skip
    rep.add_argument(
        "--trace-events", type=_positive, default=None, metavar="N",
        help="most events in trace.json (default 500000)",
    )  # fmt: skip
    rep.add_argument("--no-trace", action="store_true", help="do not rewrite trace.json")

    coll = sub.add_parser("collective", help="microbenchmark one collective, like nccl-tests")
    coll.add_argument("--instance", required=True, help="catalog instance, e.g. trn2.48xlarge")
    coll.add_argument("--count", default="1", help="instances (default 1)")
    coll.add_argument(
        "--op", default="all_reduce",
        help="all_reduce (default), reduce_scatter, all_gather, all_to_all, broadcast, reduce, "
        "gather, scatter",
    )  # fmt: skip
    coll.add_argument(
        "--size", dest="sizes", action="append", default=[], metavar="SIZE",
        help="message size, e.g. 1MiB or 4GB (repeatable)",
    )  # fmt: skip
    coll.add_argument("--min", dest="min_size", metavar="SIZE", help="sweep from this size")
    coll.add_argument("--max", dest="max_size", metavar="SIZE", help="sweep up to this size")
    coll.add_argument("--factor", default="2", help="sweep step factor (default 2)")
    coll.add_argument("--algorithm", default="auto", help="collective algorithm (default auto)")
    coll.add_argument(
        "--protocol", help="NCCL protocol on GPUs: LL, LL128 or Simple (default: NCCL's choice)"
    )
    coll.add_argument("--ranks", help="group size (default: every rank)")
    coll.add_argument("--lnc", help="logical core grouping (default: one rank per chip)")
    coll.add_argument(
        "--fabric-file", metavar="FILE",
        help="a fabric graph (GraphML, GML, node-link JSON) that replaces the built fabric",
    )  # fmt: skip
    coll.add_argument("--json", action="store_true", help="print the rows as JSON")
    _chip_model(coll)

    bench = sub.add_parser(
        "bench", help="measure event rate, big-cluster steps, a 1,024-rank all-reduce, scaling"
    )
    bench.add_argument("--json", action="store_true", help="print every figure as one JSON object")
    bench.add_argument(
        "--quick", action="store_true",
        help="leave out the folded runs of 16K chips and more (scaling: 1K and 4K only) "
        "and the 4,096-rank all-to-all",
    )  # fmt: skip
    bench.add_argument(
        "--timeout", type=float, default=120.0, metavar="S",
        help="seconds each case may run before it is stopped and reported (default 120)",
    )  # fmt: skip
    bench.add_argument(
        "--only", nargs="+", metavar="NAME",
        help="cases to run: simpy, ultraserver, collective, a2a-256, a2a-4k, "
        "a2a-1024-switch, a2a-1024-ring, fold-1k ... fold-1m, fattree-16k, fattree-1m, "
        "moe-16k, moe-128k, serve-trn2, serve-ultraserver, serve-search, or the groups "
        "event-rate, scaling, fat-tree, moe, all-to-all, dense-traffic, serving, all",
    )  # fmt: skip
    bench.add_argument(
        "--max-rss", default="8GiB", metavar="SIZE",
        help="stop a case whose resident memory passes SIZE (default 8GiB)",
    )  # fmt: skip

    val = sub.add_parser(
        "validate", help="check the simulator against published measurements and closed forms"
    )
    val.add_argument("--json", action="store_true", help="print the rows as JSON")
    val.add_argument(
        "--json-out", type=Path, metavar="FILE",
        help="also write the rows as JSON to FILE (for python -m clustersim.docs --check)",
    )  # fmt: skip
    val.add_argument("--only", nargs="+", metavar="NAME", help="references to check (default all)")
    val.add_argument(
        "--quick", action="store_true", help="leave out the slow end-to-end rows (large clusters)"
    )
    val.add_argument(
        "--jobs", type=_positive, metavar="N",
        help="references run at once, each in a worker process, the longest first "
        "(default: the CPUs this process may use; 1 runs them here, one after another); "
        "the rows are the same either way",
    )  # fmt: skip

    cal = sub.add_parser(
        "calibrate", help="fit the chip families' constants, or your cluster's from measurements"
    )
    cal.add_argument("--check", action="store_true", help="exit 1 if the shipped fits differ")
    cal.add_argument("--write", action="store_true", help="write the fits into the catalog")
    cal.add_argument(
        "--no-simulate", action="store_true",
        help="fit on the closed-form estimate alone (no anchoring simulation per row)",
    )  # fmt: skip
    cal.add_argument(
        "--validation", type=Path, metavar="FILE",
        help="anchor on the step times of a `clustersim validate --json-out` run at the "
        "shipped constants instead of simulating the rows again",
    )  # fmt: skip
    cal.add_argument(
        "--nccl-tests", nargs="+", metavar="[OP=]FILE",
        help="nccl-tests outputs (all_reduce_perf etc.); OP if the file name does not say",
    )  # fmt: skip
    cal.add_argument("--nccom-test", nargs="+", metavar="[OP=]FILE", help="nccom-test outputs")
    cal.add_argument("--step-times", metavar="CSV", help="measured steps: scenario,step_time_s")
    cal.add_argument("--instance", help="the instance the collectives ran on")
    cal.add_argument("--count", type=_positive, default=1, help="instances they spanned")
    cal.add_argument("--out", metavar="FILE", help="the overlay to write (catalog_overlay:)")
    cal.add_argument("--json", action="store_true", help="print the fits as JSON")

    sweep = sub.add_parser("sweep", help="run a study: many points of one base scenario")
    sweep.add_argument("study", type=Path, help="study YAML file")
    sweep.add_argument(
        "--allow-outside", action="store_true",
        help="let the study's base scenario lie outside its directory and the working directory",
    )  # fmt: skip
    sweep.add_argument("--out", type=Path, help="output directory (default reports/<study>/)")
    sweep.add_argument(
        "--workers", type=_positive, metavar="N", help="local worker processes (default: all cores)"
    )
    sweep.add_argument(
        "--scheduler", metavar="ADDRESS",
        help="run on an existing Dask cluster, e.g. tcp://host:8786 (needs clustersim[dask])",
    )  # fmt: skip
    sweep.add_argument(
        "--dask-local", type=_positive, metavar="N",
        help="start a Dask LocalCluster of N worker processes on loopback",
    )  # fmt: skip
    sweep.add_argument(
        "--keep-runs", action="store_true", help="also write each point's run outputs to runs/<id>/"
    )
    sweep.add_argument("--retry-failed", action="store_true", help="rerun failed points")
    sweep.add_argument(
        "--max-events", type=float, metavar="N",
        help=f"refuse a study estimated above N simulated events over all its points "
        f"(default {STUDY_MAX_EVENTS:g})",
    )  # fmt: skip
    sweep.add_argument(
        "--max-memory", metavar="SIZE",
        help="refuse a study whose points running at once are estimated to need more "
        "memory (default 8GiB)",
    )  # fmt: skip
    sweep.add_argument(
        "--force", action="store_true",
        help="write into an output directory that holds another study's results",
    )  # fmt: skip
    sweep.add_argument("--quiet", action="store_true", help="print nothing on success")
    sweep.add_argument("--json", action="store_true", help="print the outcome as JSON")
    _chip_model(sweep)
    srch = sub.add_parser(
        "search", help="find the fastest or cheapest parallel layout for a model on N chips"
    )
    srch.add_argument("scenario", type=Path, help="scenario YAML file (model, instance, batch)")
    srch.add_argument(
        "--chips", type=int, required=True, metavar="N",
        help="chips to lay the model out on (a multiple of the instance's chips)",
    )  # fmt: skip
    srch.add_argument("--objective", choices=("time", "cost"), default="time")
    srch.add_argument("--top", type=_positive, default=5, metavar="K", help="rows printed (5)")
    srch.add_argument(
        "--simulate", type=int, default=5, metavar="K",
        help="simulate the K best by estimate (default 5; 0: estimates only)",
    )  # fmt: skip
    srch.add_argument("--out", type=Path, help="output directory (default reports/<name>-search/)")
    srch.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    srch.add_argument("--json", action="store_true", help="print the counts and top rows as JSON")
    _chip_model(srch)
    rel = sub.add_parser(
        "reliability",
        help="days to months of a job under failures: goodput, ETTR, interruptions, "
        "$ per useful token; Monte Carlo and checkpoint-interval studies",
    )
    _reliability_arguments(rel)
    return p


def _reliability_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", type=Path, help="scenario YAML file with a failures section")
    p.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="override a scenario key, e.g. --set failures.spares=8 (repeatable)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, help="base random seed (overrides the scenario's)")
    p.add_argument(
        "--seeds", type=int, metavar="N", help="Monte Carlo seeds (default failures.seeds)"
    )
    p.add_argument("--workers", type=int, metavar="N", help="worker processes (default: all cores)")
    p.add_argument(
        "--step-time", metavar="T",
        help="healthy step time, e.g. 6.6s (default: simulate one step first)",
    )  # fmt: skip
    p.add_argument("--degraded-step-time", metavar="T", help="step time with a link or lane down")
    p.add_argument(
        "--checkpoint-study", action="store_true",
        help="also sweep the checkpoint interval around Daly's and find the simulated optimum",
    )  # fmt: skip
    p.add_argument("--points", type=int, default=17, metavar="N", help="study intervals (17)")
    p.add_argument("--out", type=Path, help="write {} and {} here".format(*RELIABILITY_FILES))
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")


def _simulate_arguments(parser: argparse.ArgumentParser, what: str, example: str) -> None:
    """The scenario, output and override arguments ``run`` and ``serve`` share."""
    parser.add_argument("scenario", type=Path, help=what)
    parser.add_argument("--out", type=Path, help="output directory (default reports/<name>/)")
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help=f"override a scenario key, e.g. --set {example} (repeatable)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, help="random seed (overrides the scenario's)")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    parser.add_argument("--json", action="store_true", help="print summary.json to stdout")


def _force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force", action="store_true",
        help="write into an output directory that holds another scenario's results",
    )  # fmt: skip


def _chip_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--chip-model", choices=("roofline", "engines"), default=None,
        help="roofline (an op lasts as long as its busiest engine or its HBM traffic) or "
        "engines (ops as tile streams on each engine); sets the scenario key chip_model",
    )  # fmt: skip


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer (got {text})")
    return value
