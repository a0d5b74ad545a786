"""``clustersim topology export``: a scenario's fabric written as a networkx graph."""

from __future__ import annotations

import argparse

from clustersim.errors import ScenarioError
from clustersim.network.graphs import (
    MAX_GRAPH_LINKS,
    MAX_GRAPH_NODES,
    estimate_bytes,
    export_fabric,
    format_of,
)

__all__ = ["topology_command"]


def topology_command(args: argparse.Namespace) -> int:
    from clustersim.scenario import load_scenario
    from clustersim.sim.fabric import scenario_topology

    if args.topology_command != "export":  # argparse allows only export today
        raise ScenarioError("topology", args.topology_command, "unknown action; valid: export")
    fmt = format_of(args.out, args.format, "--format")
    res = load_scenario(args.scenario, args.sets)
    chips = res.chips
    # Every chip has a node and, with more than one domain, two scale-out links at least:
    # refuse before building a fabric that cannot be written.
    if chips > MAX_GRAPH_NODES or 2 * chips > MAX_GRAPH_LINKS:
        size = estimate_bytes(chips, 4 * chips, fmt)
        raise ScenarioError(
            "cluster.count",
            res.scenario.cluster.count,
            f"{chips:,} chips: the {fmt} file would take more than {size / 2**20:,.0f} MiB; "
            f"fabric files hold at most {MAX_GRAPH_NODES:,} nodes and {MAX_GRAPH_LINKS:,} "
            "links (export fewer instances with --set cluster.count=N)",
        )
    topo = scenario_topology(res)
    if args.out.exists() and not args.out.is_file():
        raise ScenarioError("--out", str(args.out), "exists and is not a file")
    g = export_fabric(topo, args.out, fmt)
    size = args.out.stat().st_size
    switches = g.number_of_nodes() - topo.n_chips
    empty = topo.n_chips - topo.filled_chips
    slots = f" ({empty} in the empty slots of the partly filled last domain)" if empty else ""
    print(
        f"wrote {args.out}: {topo.n_chips} chips{slots}, {switches} other nodes, "
        f"{g.number_of_edges()} links ({fmt}, {size / 1024:,.0f} KiB)"
    )
    return 0
