"""The search estimate's parts for mixture-of-experts layouts.

The all-to-all's closed form by fabric level, the (stride, size) of the groups
inside a layer (the expert groups included), and the gradient streams of a stage:
dense parameters over ``dp``, routed experts over ``edp``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

from clustersim.catalog.schema import ModelSpec
from clustersim.network.collectives import GroupInfo
from clustersim.network.runtimes import NcclRuntime, Runtime
from clustersim.scenario.models import ParallelismCfg
from clustersim.workload import Layout
from clustersim.workload.dims import is_moe_layer
from clustersim.workload.gradbuckets import par_grad_buckets


class Level(Protocol):
    """One level of a group, as ``estimate.Level`` describes it."""

    @property
    def size(self) -> int: ...
    @property
    def bw_Bps(self) -> float: ...
    @property
    def latency_s(self) -> float: ...
    @property
    def bidirectional(self) -> bool: ...
    @property
    def hop(self) -> int: ...


__all__ = [
    "all_to_all_cost_s",
    "all_to_all_s",
    "grad_streams_s",
    "group_of",
    "layer_kinds",
    "ring_load",
]

Group = tuple[int, int]
CollS = Callable[[int, int, str, float], float]


def all_to_all_s(nbytes: float, levels: Sequence[Level], flows: int, p: int) -> float:
    """An all-to-all (mesh, every pair at once) over ``levels``: each rank sends
    ``nbytes / p`` to every peer, and the ``(p_k - p_{k-1}) / p`` share of its buffer whose
    peers lie beyond level k-1 crosses level k, where ``p_k`` counts the members up to
    level k. Levels run at once, so the slowest sets the time, plus its latency."""
    inner = 1
    worst = 0.0
    for lv in levels:
        outer = inner * lv.size
        if lv.bidirectional:
            # A torus axis: every peer whose coordinate on it differs is routed along
            # it, the shortest way round, the peer half way round split over the two
            # ways by the source's parity (dimension order, ``network.builders``), so
            # each rank sends n/d to each of the axis's d-1 offsets and the busiest
            # direction of a link carries ring_load(d, hop) of them.
            wire = nbytes / lv.size * ring_load(lv.size, lv.hop) * flows / lv.bw_Bps
        else:
            wire = nbytes * (outer - inner) / p * flows / lv.bw_Bps
        worst = max(worst, wire + lv.latency_s)
        inner = outer
    return worst


def all_to_all_cost_s(
    nbytes: float, levels: Sequence[Level], flows: int, p: int, *, nodes: int, runtime: Runtime
) -> float:
    """One all-to-all over ``levels`` (``nodes`` of them scale-up domains over the network):
    the wire (:func:`all_to_all_s`) with what ``runtime`` adds, as the simulator runs it."""
    wire = all_to_all_s(nbytes, levels, flows, p)
    info = GroupInfo.flat(p)
    op = "all_to_all"
    if isinstance(runtime, NcclRuntime):
        if nodes > 1:
            # one group of sends and receives: the proxy's posting and the wire overlap
            # (NcclRuntime.grouped_protocol)
            local = p // nodes
            info = GroupInfo(tuple(range(p)), tuple(i // local for i in range(p)))
            proto = runtime.choose(op, p, nbytes, info, "auto")[1]
            post = runtime.posting_s(p, nbytes, info)
            return max(wire * proto.wire_factor, post) + runtime.grouped_latency_s(proto.name)
        algo, proto = runtime.choose(op, p, nbytes, info, "auto")
        return wire * proto.wire_factor + runtime.predict_s(op, p, 0.0, info, (algo, proto.name))
    proto = runtime.choose(op, p, nbytes, info, "auto")[1]
    # One mesh round: each message of n/p no faster than its DMA queues, a rank posting
    # one to each peer (an EFA one to each peer in another domain).
    cap = proto.message_cap_Bps(pipelined=False, reduces=False)
    fixed = proto.launch_s + proto.step_s + (p - 1) * proto.message_s
    fixed += (p - p // nodes) * proto.efa_message_s
    return max(wire, nbytes / p / cap) + fixed


def ring_load(d: int, hop: int = 1) -> float:
    """Offsets whose shortest route crosses the busiest direction of a link of a ring
    of ``d`` members ``hop`` links apart (the groups interleaved between them doing the
    same) that carries each member's traffic to every other, counted with the links
    each takes: (1 + 2 + ... + (d-1)//2) x hop each way, plus, for even ``d``, the
    peers half way round: the chips at even coordinates reach theirs the positive way
    and the others the negative way, d x hop / 2 links each, so a link direction
    carries the ties of the chips among the d x hop / 2 before it on one parity,
    ceil(d x hop / 4) at most (2 on a ring of 4, where ties that all went positive
    gave 3)."""
    half = (d - 1) // 2
    ties = math.ceil(d * hop / 4) if d % 2 == 0 else 0
    return half * (half + 1) / 2 * hop + ties


def group_of(name: str, lay: Layout) -> tuple[int, int]:
    """(stride, size) of a group whose collectives run inside a layer."""
    expert = {"ep": (lay.etp, lay.ep), "etp": (1, lay.etp), "edp": (lay.etp * lay.ep, lay.edp)}
    return (1, lay.tp) if name == "tp" else expert.get(name, (lay.tp, lay.cp))


def _grad_group(layout: Layout, zero: int) -> Group:
    """(stride, size) of the dense gradients' group (``Layout.grad_group``)."""
    return layout.span(layout.grad_group(zero))


def grad_streams_s(
    model: ModelSpec,
    layout: Layout,
    stage: int,
    par: ParallelismCfg,
    coll_s: CollS,
    *,
    elem_bytes: int = 2,
) -> tuple[float, float, float, list[tuple[Group, float]]]:
    """A stage's gradient reduction: (seconds, ZeRO-1 all-gather seconds, the bytes of
    the dense stream's first bucket in the forward, and each stream's (group, gradient
    bytes), the dense one first). The buckets are the simulator's (``grad_buckets``:
    whole parameters, ``elem_bytes`` a gradient)."""
    groups = [(_grad_group(layout, par.zero), False)]
    if model.moe is not None:
        groups.append(((layout.etp * layout.ep, layout.expert_shard), True))  # edp(_shard)
    op = "reduce_scatter" if par.zero == 1 else "all_reduce"
    dp_s = gather = first = 0.0
    streams: list[tuple[Group, float]] = []
    for group, experts in groups:
        _, sizes = par_grad_buckets(
            model, layout, stage, par, experts=experts, elem_bytes=elem_bytes
        )
        if not sizes:
            continue
        streams.append((group, float(sum(sizes))))
        first = first or float(sizes[-1])
        dp_s += sum(coll_s(*group, op, float(b)) for b in sizes)
        if par.zero == 1:
            gather += sum(coll_s(*group, "all_gather", float(b)) for b in sizes)
    return dp_s, gather, first, streams


def layer_kinds(model: ModelSpec, layers: Sequence[int]) -> tuple[int, int]:
    """(dense, MoE) layers among ``layers``."""
    e = sum(1 for i in layers if is_moe_layer(model, i))
    return len(layers) - e, e
