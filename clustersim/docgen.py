"""The documentation site's reference pages, generated from the code they describe.

Each function returns the Markdown of one generated block: the command-line
reference from the argparse parser (``cli_args.build_parser``), the scenario keys
from the JSON Schema (``clustersim schema``), the catalog from its YAML with each
figure's source, and the software stacks. ``clustersim.docs`` writes them between
``<!-- docs:NAME -->`` markers in ``docs/reference/*.md`` and, with ``--check``,
fails when one is stale.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clustersim.serve.intervals import ErrorBand

__all__ = [
    "catalog_table",
    "cli_reference",
    "quickstart_figure",
    "run_output",
    "scenario_keys",
    "serve_comparison",
    "serve_error_bands",
    "serve_output",
    "serve_validation",
    "stacks_text",
    "summary_keys",
]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(parser: argparse.ArgumentParser) -> str:
    formatter = parser.formatter_class
    try:
        parser.formatter_class = lambda prog: formatter(prog, width=92)  # type: ignore[call-arg]
        return parser.format_help().rstrip()
    finally:
        parser.formatter_class = formatter


def cli_reference() -> str:
    """Every subcommand's ``--help``, at a fixed width, nested subcommands included."""
    from clustersim.cli_args import build_parser

    root = build_parser()
    out = ["## clustersim", "", "```text", _help(root), "```"]
    pending = [(f"clustersim {n}", p) for n, p in _subcommands(root).items()]
    while pending:
        name, parser = pending.pop(0)
        out += ["", f"## {name}", "", "```text", _help(parser), "```"]
        pending[:0] = [(f"{name} {n}", p) for n, p in _subcommands(parser).items()]
    return "\n".join(out)


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return "mapping"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "anyOf" in schema:
        kinds = [_type(s) for s in schema["anyOf"] if s.get("type") != "null"]
        return " or ".join(dict.fromkeys(kinds))
    kind = schema.get("type", "any")
    if kind == "array":
        fixed = schema.get("prefixItems")  # a tuple: so many items of these types
        items = [schema.get("items", {})] if fixed is None else fixed
        count = "" if fixed is None else f"{len(fixed)} "
        return f"list of {count}" + " or ".join(dict.fromkeys(_type(s) for s in items))
    return "mapping" if kind == "object" else str(kind)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _lead(text: str) -> str:
    """The first paragraph of a docstring, as Markdown (reST literals become code spans)."""
    para = " ".join(text.strip().split("\n\n", 1)[0].split())
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", para).replace("``", "`")


def _refs(prop: dict[str, Any]) -> tuple[list[str], str]:
    """The models a property holds, and the suffix of their key path: a mapping or a
    union of mappings (``""``), a list of them (``".N"``) or a mapping of them by name
    (``".NAME"``)."""
    if "$ref" in prop:
        return [prop["$ref"]], ""
    if any("$ref" in s for s in prop.get("anyOf", ())):
        return [s["$ref"] for s in prop["anyOf"] if "$ref" in s], ""
    if prop.get("type") == "array" and "$ref" in prop.get("items", {}):
        return [prop["items"]["$ref"]], ".N"
    extra = prop.get("additionalProperties")
    if isinstance(extra, dict) and "$ref" in extra:
        return [extra["$ref"]], ".NAME"
    return [], ""


def scenario_keys() -> str:
    """One table per section of the scenario file: each key, its type, default and help."""
    from clustersim.catalog._strict import DocumentedSchema
    from clustersim.scenario import Scenario

    schema = Scenario.model_json_schema(schema_generator=DocumentedSchema)
    defs = schema.get("$defs", {})
    out: list[str] = []
    seen: set[str] = set()

    def section(names: list[str]) -> dict[str, Any]:
        """One model's schema, or the union of several (a key that takes one of them)."""
        if len(names) == 1:
            return dict(defs[names[0]])
        props: dict[str, Any] = {}
        for name in names:
            props.update(defs[name].get("properties", {}))
        keys = ", ".join(f"`{k}`" for k in props)
        return {"properties": props, "description": f"A mapping with one of the keys {keys}."}

    def table(title: str, node: dict[str, Any], prefix: str) -> None:
        rows = [f"### `{title}`", ""]
        if node.get("description"):
            rows += [_lead(node["description"]), ""]
        rows += ["| key | type | default | description |", "|---|---|---|---|"]
        nested: list[tuple[str, dict[str, Any], str]] = []
        required = set(node.get("required", ()))
        for key, prop in node.get("properties", {}).items():
            refs, suffix = _refs(prop)
            if "default" in prop:
                default = f"`{json.dumps(prop['default'])}`"
            else:
                default = "required" if key in required else ""
            what = _cell(prop.get("description", ""))
            if refs:
                names = [ref.rsplit("/", 1)[-1] for ref in refs]
                sub = f"{prefix}{key}{suffix}"
                what = (what + " " if what else "") + f"See `{sub}`."
                if sub not in seen:
                    seen.add(sub)
                    nested.append((sub, section(names), f"{sub}."))
            rows.append(f"| `{prefix}{key}` | {_type(prop)} | {default} | {what} |")
        out.extend([*rows, ""])
        for sub, sub_node, sub_prefix in nested:
            table(sub, sub_node, sub_prefix)

    table("scenario", schema, "")
    return "\n".join(out).rstrip()


def _flat(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        out: list[tuple[str, Any]] = []
        for k, v in value.items():
            out += _flat(v, f"{prefix}{k}.")
        return out
    return [(prefix.rstrip("."), value)]


def _source(sources: dict[str, str], key: str) -> str:
    """The source of ``key``: its own, or the longest dotted prefix's."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = sources.get(".".join(parts[:n]))
        if found is not None:
            return found
    return ""


def catalog_table(kind: str) -> str:
    """Every entry of one catalog (``chips``, ``instances``, ``models``): its figures, each
    with its source as the YAML names it."""
    from clustersim import catalog

    out: list[str] = []
    for name, entry in sorted(catalog.entries(kind).items()):
        raw = dict(entry)
        sources = {str(k): str(v) for k, v in (raw.pop("sources", None) or {}).items()}
        out += [f"### {name}", "", "| field | value | source |", "|---|---|---|"]
        for key, value in _flat(raw):
            shown = json.dumps(value) if not isinstance(value, str) else value
            out.append(f"| `{key}` | {_cell(shown)} | {_cell(_source(sources, key))} |")
        out.append("")
    return "\n".join(out).rstrip()


def stacks_text() -> str:
    """What ``clustersim catalog stacks`` prints: each stack, its fit and the rows behind it."""
    from clustersim.catalog import stacks

    return "```text\n" + "\n".join(stacks.stack_lines()) + "\n```"


VOLATILE = frozenset({"wall_s", "events_per_s", "clustersim_version"})


def summary_keys(summary: dict[str, Any]) -> str:
    """The keys of a ``summary.json`` (a run's summary, flattened), each with its type and
    the quick start's value; keys that vary from run to run are shown without one."""
    out = ["| key | type | quick start |", "|---|---|---|"]
    for key, value in _flat({k: v for k, v in summary.items() if not k.startswith("_")}):
        kind = "null" if value is None else type(value).__name__
        if key in VOLATILE:
            shown = "(varies)"
        elif isinstance(value, float):
            shown = f"{value:.6g}"
        elif isinstance(value, list):
            shown = "[" + ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in value)
            shown += "]"
        else:
            shown = json.dumps(value)
        out.append(f"| `{key}` | {kind} | {_cell(shown)} |")
    return "\n".join(out)


def run_output(summary: dict[str, Any]) -> str:
    """What ``clustersim run`` prints of ``summary`` (no wall time or output directory),
    fenced as the docs quote it."""
    from clustersim.terminal import summary_table, table_text

    return "```\n" + table_text(summary_table(summary)) + "\n```"


def quickstart_figure(summary: dict[str, Any], what: str) -> str:
    """A figure of the first-run tutorial's worked examples from the quick start's
    ``summary``: ``"step"`` and ``"mfu"`` (its MFU sum), ``"rows"`` (the calibration rows
    and degrees of freedom behind its interval), ``"interference"`` (the compute time lost
    to the collectives beside it)."""
    if what == "step":
        return f"{summary['step_time_s']:.3f} s"
    if what == "mfu":
        return f"{summary['mfu']:.1%}"
    if what == "rows":
        m = re.search(
            r"from (\d+) rows left out in turn, (\d+) dof", summary["uncertainty"]["basis"]
        )
        if m is None:
            raise RuntimeError(f"no rows in {summary['uncertainty']['basis']!r}")
        return f"{m.group(1)} Trainium rows, {m.group(2)} dof"
    return f"{summary['breakdown_s']['interference'] * 1e6:.0f} µs"


def serve_output(scenario: str = "serve-trn2-llama3-70b") -> str:
    """What ``clustersim serve`` prints for a serving tutorial's scenario (seeded, so the
    same every run; no wall time or output directory), fenced as the docs quote it."""
    from clustersim.scenario import load_scenario
    from clustersim.serve.command import serve_table
    from clustersim.serve.run import serve
    from clustersim.terminal import table_text

    path = Path(__file__).resolve().parent.parent / "scenarios" / f"{scenario}.yaml"
    return "```\n" + table_text(serve_table(serve(load_scenario(path)).summary)) + "\n```"


def serve_validation() -> str:
    """The serving references predicted against their publications (a Markdown table)."""
    from clustersim.serve.references import validation_table

    return validation_table()


def serve_throughput() -> str:
    """The serving throughput references predicted against their publications."""
    from clustersim.serve.references import throughput_table

    return throughput_table()


COMPARISON_SCENARIO = "serve-trn2-llama3-70b"
COMPARISON_RATE = 16.0
COMPARISON_SETS = ("serving.slo.tpot_s=0.1",)
COMPARISON_INSTANCES = ("trn2.48xlarge", "p5.48xlarge")
"""The serving comparison the README and the serving tutorial quote: Llama-3-70B in
BF16, 1,024 tokens in and 256 out, Poisson at 16 requests/s, TTFT p90 <= 2 s and
TPOT p90 <= 100 ms; the cheapest layout of each instance type by ``serve-search``."""


@functools.lru_cache(maxsize=1)
def _serve_bands() -> dict[str, ErrorBand]:
    """The serving error bands, computed once per process (two blocks quote them)."""
    from clustersim.serve.intervals import error_bands

    return error_bands()


def _band_text(value: float, interval: tuple[float, float], scale: float, unit: str) -> str:
    low, high = interval
    digits = ".0f" if value * scale >= 100 else ".1f"
    return f"{value * scale:{digits}} {unit} ({low * scale:{digits}} to {high * scale:{digits}})"


def serve_comparison() -> str:
    """The cheapest trn2.48xlarge and p5.48xlarge layouts meeting one SLO at one rate
    (two ``serve-search`` runs), with each latency's interval from its chip family's
    validation errors (:mod:`clustersim.serve.intervals`), as a Markdown table and a
    sentence."""
    from clustersim.scenario import load_scenario
    from clustersim.serve.capacity import serve_search
    from clustersim.serve.intervals import family_of

    path = Path(__file__).resolve().parent.parent / "scenarios" / f"{COMPARISON_SCENARIO}.yaml"
    res = load_scenario(path, list(COMPARISON_SETS))
    bands = _serve_bands()
    out = [
        "| instance | cheapest layout meeting the SLO | $ per M output tokens "
        "| TTFT p90 (interval) | TPOT p90 (interval) |",
        "|---|---|---|---|---|",
    ]
    cost: dict[str, float] = {}
    for name in COMPARISON_INSTANCES:
        pick = serve_search(res, COMPARISON_RATE, instances=(name,)).pick
        if pick is None:
            out.append(f"| {name} | none within 16 instances | | | |")
            continue
        band = bands[family_of(name)]
        cost[name] = pick["usd_per_million_output_tokens"]
        n, reps = pick["instances"], pick["replicas"]
        layout = (
            f"{n} instance{'s' * (n > 1)}: {reps} replica{'s' * (reps > 1)} of TP "
            f"{pick['tp']}, batch {pick['max_num_seqs']} ({pick['engine']})"
        )
        ttft = _band_text(pick["ttft_p90_s"], band.interval("ttft", pick["ttft_p90_s"]), 1e3, "ms")
        tpot = _band_text(pick["tpot_p90_s"], band.interval("tpot", pick["tpot_p90_s"]), 1e3, "ms")
        out.append(f"| {name} | {layout} | ${cost[name]:.2f} | {ttft} | {tpot} |")
    if len(cost) == 2:
        (a, ca), (b, cb) = sorted(cost.items(), key=lambda kv: kv[1])
        out += ["", f"The cheapest {a} layout costs {1 - ca / cb:.0%} less per output token "
                f"than the cheapest {b} layout at this rate and SLO."]  # fmt: skip
    return "\n".join(out)


def serve_error_bands() -> str:
    """Each chip family's range of serving errors (the validation rows'), as a table."""
    out = [
        "| family | rows | TTFT error | TPOT error | TPOT interval of a 50 ms prediction |",
        "|---|---|---|---|---|",
    ]
    for band in _serve_bands().values():
        low, high = band.interval("tpot", 0.05)
        out.append(
            f"| {band.family} | {', '.join(band.rows)} | {band.ttft[0]:+.0%} to "
            f"{band.ttft[1]:+.0%} | {band.tpot[0]:+.0%} to {band.tpot[1]:+.0%} | "
            f"{low * 1e3:.1f} to {high * 1e3:.1f} ms |"
        )
    return "\n".join(out)
