"""Microbenchmark one collective, like nccl-tests: time, algbw and busbw per size.

    rows = run_collective("trn2.48xlarge", 1, "all_reduce", [2**20, 2**30])

Each size runs alone in a fresh SimPy environment over a group of ranks on a
topology built from the catalog. ``algbw = size / time``; ``busbw = algbw x
factor``, with the factors of nccl-tests (``doc/PERFORMANCE.md``): 2(p-1)/p for
all-reduce, (p-1)/p for reduce-scatter, all-gather and all-to-all, 1 for
broadcast and reduce. busbw is comparable across group sizes: for a ring it is
the bandwidth each rank's busiest link direction sustains.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import simpy

from clustersim import catalog
from clustersim.errors import ScenarioError
from clustersim.network import Network
from clustersim.network.collectives import OPS, algorithm_names, busbw_factor
from clustersim.network.fabric import build_topology, local_path
from clustersim.network.runtimes import NO_COSTS, runtime_of
from clustersim.units import format_bytes

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["busbw_factor", "collective_table", "run_collective", "size_sweep"]


def size_sweep(lo: float, hi: float, factor: float = 2.0) -> list[float]:
    """``lo, lo*factor, ...`` up to ``hi`` (included, within rounding), as nccl-tests' -b -e -f."""
    if not (lo > 0 and math.isfinite(lo)):
        raise ScenarioError("min", lo, "must be a positive size")
    if not (hi >= lo and math.isfinite(hi)):
        raise ScenarioError("max", hi, f"must be at least the --min size, {format_bytes(lo)}")
    if not (factor > 1 and math.isfinite(factor)):
        raise ScenarioError("factor", factor, "must be a number above 1")
    count = math.floor(math.log(hi / lo, factor) + 1e-9) + 1
    if count > 1000:
        raise ScenarioError("factor", factor, f"gives {count} sizes from min to max; at most 1000")
    return [lo * factor**k for k in range(count)]


def run_collective(
    instance: str,
    count: int,
    op: str,
    sizes: Sequence[float],
    *,
    algorithm: str = "auto",
    ranks: int | None = None,
    lnc: int | None = None,
    chip: Mapping[str, Any] | None = None,
    neuronlink: Mapping[str, Any] | None = None,
    efa: Mapping[str, Any] | None = None,
    ultraserver: Mapping[str, Any] | None = None,
    chip_model: str = "roofline",
    fabric_file: str | None = None,
    overheads: bool = True,
    protocol: str | None = None,
) -> list[dict[str, Any]]:
    """Time ``op`` on each of ``sizes`` (bytes) over ``count`` x ``instance``.

    The group is ranks ``0..ranks-1`` (default: all of them), placed in chip
    order, one per chip unless ``lnc`` is given (then ``cores / lnc`` per chip,
    as in a scenario). ``chip``, ``neuronlink``, ``efa`` and ``ultraserver``
    override catalog fields, like the ``cluster`` keys of a scenario. ``overheads``
    adds the runtime's fixed costs (the chip's ``collectives`` block,
    :mod:`~clustersim.network.runtimes.costs`); without them a collective costs its wire time
    alone, as its alpha-beta closed form assumes. ``protocol`` forces NCCL's protocol
    on GPUs (``LL``, ``LL128``, ``Simple``). Bad input
    raises :class:`~clustersim.errors.ScenarioError` naming the parameter.

    Returns one row per size: ``op``, ``size_bytes``, ``time_s``,
    ``algbw_GBps``, ``busbw_GBps``, ``algorithm`` (what ran: ``auto``'s choice),
    ``protocol`` (the runtime's: NCCL's LL, LL128 or Simple; ``neuron`` on Trainium)
    and ``ranks``. ``chip_model`` (``roofline`` or ``engines``) is the chip model the
    scenario key names; ``engines`` needs the chip's engine description. A lone
    collective meets no compute, so both give the same times. ``fabric_file`` (a
    fabric graph, as ``cluster.fabric_file`` in a scenario) replaces the built fabric.
    """
    if op not in OPS:
        raise ScenarioError("op", op, f"unknown collective; valid: {', '.join(OPS)}")
    if algorithm not in algorithm_names(op):
        raise ScenarioError(
            "algorithm", algorithm, f"not one for {op}; valid: {', '.join(algorithm_names(op))}"
        )
    if count < 1:
        raise ScenarioError("count", count, "must be at least 1")
    over = {
        key: dict(value)
        for key, value in (("fabric", neuronlink), ("efa", efa), ("ultraserver", ultraserver))
        if value
    }
    inst = catalog.instance(instance, over or None, "instance")
    chip_spec = catalog.chip(inst.chip, dict(chip) if chip else None, "chip")
    if chip_model not in ("roofline", "engines"):
        raise ScenarioError("chip_model", chip_model, "expected roofline or engines")
    if chip_model == "engines" and chip_spec.engines is None:
        raise ScenarioError(
            "chip_model", chip_model, f"chip {chip_spec.name} has no engine description"
        )
    if lnc is not None and lnc not in chip_spec.lnc_options:
        valid = ", ".join(map(str, chip_spec.lnc_options))
        raise ScenarioError("lnc", lnc, f"{chip_spec.name} supports lnc {valid}")
    per_chip = 1 if lnc is None else chip_spec.cores // lnc
    if fabric_file is None:
        topo = build_topology(inst, chip_spec, count, path="instance")
    else:
        from clustersim.network.graphs import load_graph

        local_Bps, local_s = local_path(chip_spec)
        topo = load_graph(
            fabric_file,
            chips_per_instance=inst.chips,
            instances=count,
            local_bw_Bps=local_Bps,
            local_latency_s=local_s,
            where="--fabric-file",
        )
    total = topo.n_chips * per_chip
    p = total if ranks is None else ranks
    if not 2 <= p <= total:
        raise ScenarioError("ranks", ranks, f"must be between 2 and the {total} ranks available")
    for size in sizes:
        if not (size > 0 and math.isfinite(size)):
            raise ScenarioError("sizes", size, "each size must be a positive number of bytes")
    rank_chip = [r // per_chip for r in range(total)]
    runtime = runtime_of(chip_spec, inst, protocol=protocol) if overheads else NO_COSTS
    group = list(range(p))
    rows = []
    for size in sizes:
        env = simpy.Environment()
        net = Network(env, topo, rank_chip, {op: algorithm}, runtime=runtime, path="algorithm")
        algo, proto = net.choice_for(op, group, float(size))
        done = net.collective(op, group, float(size))
        env.run(until=done)
        time_s = float(env.now)
        algbw = size / time_s / 1e9 if time_s > 0 else math.inf
        rows.append(
            {
                "op": op,
                "size_bytes": float(size),
                "time_s": time_s,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * busbw_factor(op, p),
                "algorithm": algo,
                "protocol": proto.name,
                "ranks": p,
            }
        )
    return rows


def collective_table(rows: Sequence[Mapping[str, Any]], title: str) -> Table:
    """What ``clustersim collective`` prints of :func:`run_collective`'s rows: a rich
    table with ``title``, one row per size."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        t.add_column(col, justify="right")
    t.add_column("algorithm", no_wrap=True)
    t.add_column("protocol", no_wrap=True)
    for r in rows:
        t.add_row(
            format_bytes(r["size_bytes"]), f"{r['time_s'] * 1e6:.1f}", f"{r['algbw_GBps']:.2f}",
            f"{r['busbw_GBps']:.2f}", r["algorithm"], r["protocol"],
        )  # fmt: skip
    return t
