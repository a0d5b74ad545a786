"""What the gradient reduction running under a stage's last backward costs the layers.

Without sharded gradients (ZeRO 0 and 1) a stage reduces its gradients in the last
microbatch's backward only: a bucket's collective starts when the backward op that
completes its last gradient has run (``workload.transformer.grad_buckets``). Where
the data-parallel group's links are the TP (or CP) groups' links too (a torus axis
of a Trn2 instance, say), the layers' collectives that run while buckets are on
those links share them: max-min sharing gives a collective of f flows on a link
with k of the buckets' flows f/(f+k) of it, so it takes k/f times longer while
the buckets' bytes are there (:func:`link_ratio`). The buckets hold the shared
links only for their phases on those tiers (a reduce-scatter's first ring runs
along the chip's inner axes, the later ones elsewhere), and buckets in flight at
once share them equally (processor sharing).

The backward is longer by what its collectives lose; the stage before waits for
its gradients, so the delay carries down the pipeline's drain
(``search.pipeline``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from clustersim.catalog.schema import ModelSpec
from clustersim.network.runtimes import NcclRuntime
from clustersim.scenario.models import TrainingCfg
from clustersim.search.buckets import Ready, backward_ready, is_bf16_layer
from clustersim.search.netmodel import TORUS, NetModel, collective_wire_s
from clustersim.workload import Layout, grad_buckets
from clustersim.workload.dims import is_moe_layer, stage_layers
from clustersim.workload.gradbuckets import param_bytes

__all__ = [
    "hop_shared_s",
    "in_turn",
    "link_ratio",
    "op_ready_times",
    "own_flows",
    "shared_backward_s",
    "shares_links",
    "tier_wire_s",
]

Group = tuple[int, int]


class Estimator(Protocol):
    """What these closed forms read of ``search.estimate.Estimator``."""

    model: ModelSpec
    train: TrainingCfg
    net: NetModel
    memo: dict[tuple[object, ...], float]  # what layouts share: :func:`tier_wire_s`

    def coll_s(self, stride: int, size: int, op: str, nbytes: float) -> float: ...
    def wire_s(self, stride: int, size: int, op: str, nbytes: float) -> float: ...
    def tiers(self, stride: int, size: int) -> set[str]: ...


def own_flows(est: Estimator, layout: Layout, tiers: set[str]) -> int:
    """The fewest flows a chip's TP or CP groups put on a link of ``tiers``: every
    rank of the chip on it, when the group's inner level is the chip's ranks."""
    own = []
    for stride, size in ((1, layout.tp), (layout.tp, layout.cp)):
        levels, sharing = est.net.levels(stride, size) if size > 1 else ([], 1)
        if tiers & {lv.tier for lv in levels}:
            own.append(sharing * (levels[0].size if levels[0].shared_link else 1))
    return min(own, default=1)


def shares_links(est: Estimator, layout: Layout, group: Group) -> bool:
    """Whether the TP or CP groups' links carry ``group``'s traffic too (the same
    tier: a chip's DMA link, a torus axis or a switch, the domain's or EFA)."""
    tiers = est.tiers(*group)
    for stride, size in ((1, layout.tp), (layout.tp, layout.cp)):
        if size > 1 and tiers & {lv.tier for lv in est.net.levels(stride, size)[0]}:
            return True
    return False


def link_ratio(est: Estimator, layout: Layout, group: Group, size: int) -> float:
    """k/f: the flows one collective over ``group`` (``size`` members) puts on a link
    of its tiers, over the fewest a TP or CP collective puts there. A bidirectional
    ring of three or more puts two flows on a chip's link to its switch."""
    ring = 2.0 if size >= 3 and est.net.fabric_topology not in TORUS else 1.0
    levels, sharing = est.net.levels(*group)
    slow = ring * sharing * max((lv.hop for lv in levels), default=1)
    return slow / own_flows(est, layout, {lv.tier for lv in levels})


def tier_wire_s(est: Estimator, group: Group, op: str, nbytes: float, tiers: set[str]) -> float:
    """One collective's seconds on the links of ``tiers``: its rings along them (each
    level's ring moves what the inner levels left of the buffer)."""
    key = ("tier_wire_s", group, op, nbytes, *sorted(tiers))
    found = est.memo.get(key)
    if found is not None:
        return found
    levels, sharing = est.net.levels(*group)
    m, secs = nbytes, 0.0
    for lv in levels:
        if lv.tier in tiers:
            secs += collective_wire_s(op, m, [lv], sharing, est.net.runtime)
        m /= lv.size
    est.memo[key] = secs
    return secs


def _tp_tiers(est: Estimator, layout: Layout) -> set[str]:
    tiers: set[str] = set()
    for stride, size in ((1, layout.tp), (layout.tp, layout.cp)):
        if size > 1:
            tiers |= est.tiers(stride, size)
    return tiers


def shared_backward_s(
    est: Estimator,
    layout: Layout,
    stage: int,
    *,
    zero: int,
    bucket_bytes: float,
    ready: Mapping[str, Ready],
    layer_comms: Sequence[tuple[float, float]],
    first_only: bool = False,
) -> float:
    """Seconds the layers' TP and CP collectives lose in the stage's last backward to
    the dense gradient buckets on their links; see the module doc.

    ``ready`` holds the dense layer's :func:`~clustersim.search.buckets.ready_offsets`
    and ``layer_comms`` its collectives' (start, seconds on the links), both from the
    start of its recompute. Only dense layers count; an MoE layer (or one the FP8
    recipe keeps in BF16) passes its time. ``first_only``: the buckets are cut as
    Megatron-Core cuts them (``workload.first_chunk_buckets``).
    """
    group = layout.span(layout.grad_group(zero))
    if group[1] <= 1 or not layer_comms or not shares_links(est, layout, group):
        return 0.0
    model = est.model
    op = "reduce_scatter" if zero == 1 else "all_reduce"
    tiers = _tp_tiers(est, layout)

    seen: dict[float, float] = {}  # the buckets are mostly of one size

    def on_shared(nbytes: float) -> float:
        found = seen.get(nbytes)
        if found is None:
            found = seen[nbytes] = tier_wire_s(est, group, op, nbytes, tiers)
        return found

    # Of a layer collective's seconds on the links, the part on the shared tiers (a
    # TP ring's inner level, the chip's own ranks, shares nothing with the buckets).
    inner = (1, layout.tp) if layout.tp > 1 else (layout.tp, layout.cp)
    probe = float(2**26)
    alone = tier_wire_s(est, inner, "reduce_scatter", probe, est.tiers(*inner))
    there = tier_wire_s(est, inner, "reduce_scatter", probe, tiers & est.tiers(*group))
    ratio = link_ratio(est, layout, group, group[1]) * (there / alone if alone > 0 else 1.0)
    experts = False if model.moe is not None else None
    keyed, _ = grad_buckets(
        model,
        layout,
        stage,
        bucket_bytes,
        experts=experts,
        shared_embedding=zero == 1,
        first_only=first_only,
        elem_bytes=param_bytes(est.train),
    )
    dense_len, offsets = ready["dense"]
    layers = list(reversed(stage_layers(model, layout, stage)))
    arrivals: list[tuple[float, float]] = []  # (time, seconds on the shared links)
    comms: list[tuple[float, float]] = []
    t = 0.0
    for k in layers:
        if not is_moe_layer(model, k) and not _bf16(est, k):
            for piece, off in offsets:
                arrivals.extend((t + off, on_shared(float(b))) for b in keyed.get((k, piece), ()))
            comms.extend((t + start, wire) for start, wire in layer_comms)
        t += dense_len  # (an MoE layer's backward is longer: a bound the timeline keeps)
    return _lost_s(sorted(arrivals), comms, ratio, serial=in_turn(est))


def _bf16(est: Estimator, layer: int) -> bool:
    return is_bf16_layer(est.model, est.train, layer)


def in_turn(est: Estimator) -> bool:
    """Whether the runtime runs one communicator's collectives in turn: NCCL enqueues
    every operation of a communicator on its own stream (the DP group's buckets one
    at a time); the Neuron runtime's buckets share the links at once."""
    return isinstance(est.net.runtime, NcclRuntime)


def _lost_s(
    arrivals: Iterable[tuple[float, float]],
    comms: Sequence[tuple[float, float]],
    ratio: float,
    *,
    serial: bool = False,
) -> float:
    """Step the buckets on the shared links as a processor-sharing queue (``serial``:
    one at a time, in turn): at each collective's start, k buckets there slow its w
    seconds on the links by ``ratio`` k w, no more than the buckets' seconds left
    there, which the links serve meanwhile (the time lost is theirs)."""
    links = _Sharing()
    now = lost = 0.0
    queue = list(arrivals)
    i = 0
    for start, wire in comms:
        # A bucket the op before a collective completes starts with it (the two
        # clocks sum the same op times in different orders: allow for rounding).
        while i < len(queue) and queue[i][0] <= start * (1 + 1e-9) + 1e-12:
            links.serve(queue[i][0] - now)
            now = max(now, queue[i][0])
            links.add(queue[i][1])
            i += 1
        links.serve(start - now)
        now = max(now, start)
        if links.tags:
            x = min(ratio * (1 if serial else len(links.tags)) * wire, links.left())
            lost += x
            links.serve(x)  # the buckets' bytes served while it waited
    return lost


class _Sharing:
    """Jobs served equally (processor sharing) in virtual time: each job's tag is the
    service per job at which it is done, so serving and adding take log n."""

    def __init__(self) -> None:
        self.served = 0.0  # service each job in the system has had since the start
        self.tags: list[float] = []  # a heap
        self.total = 0.0  # the sum of the tags

    def add(self, secs: float) -> None:
        heapq.heappush(self.tags, self.served + secs)
        self.total += self.served + secs

    def left(self) -> float:
        return self.total - len(self.tags) * self.served

    def serve(self, dt: float) -> None:
        while self.tags and dt > 0:
            n = len(self.tags)
            need = (self.tags[0] - self.served) * n
            if need <= dt:
                dt -= need
                self.served = heapq.heappop(self.tags)
                self.total -= self.served
            else:
                self.served += dt / n
                dt = 0.0


def hop_shared_s(
    est: Estimator,
    layout: Layout,
    *,
    nbytes: float,
    tail_s: float,
    streams: Sequence[tuple[Group, float]],
    op: str,
    bucket_bytes: float,
) -> float:
    """Seconds the last gradient a stage sends back (``nbytes``) loses to its own
    gradient reduction, still running when its last backward ends (``tail_s`` past
    it), where the hop's link is one the reduction's groups cross (EFA between the
    stages, say).

    The buckets left then are about ``tail_s`` over one bucket's time, in flight at
    once on Trainium, one at a time on NCCL (:func:`in_turn`), each on the hop's
    tier for its ring there (a reduce-scatter's last, over EFA, moves what the rings
    inside the instance left); the hop's f flows share the link with the k flows
    each puts there, k/f times longer each, for no more than their bytes hold the
    link.
    """
    if layout.pp < 2 or tail_s <= 0 or nbytes <= 0 or not streams:
        return 0.0
    levels, sharing = est.net.levels(layout.ranks_per_stage, 2)
    if not levels:
        return 0.0
    lv = levels[-1]
    group, _ = max(streams, key=lambda s: s[1])  # the stream with the most bytes
    if lv.tier not in est.tiers(*group):
        return 0.0
    flows = sharing * (levels[0].size if levels[0].shared_link else 1)
    wire = nbytes * flows / lv.bw_Bps
    size = min(bucket_bytes, max(b for _, b in streams))
    per = est.coll_s(*group, op, size)
    there = tier_wire_s(est, group, op, size, {lv.tier})
    left = tail_s / per if per > 0 else 0.0  # buckets left
    on_link = min(left, 1.0) if in_turn(est) else left  # in flight at once
    theirs = link_ratio(est, layout, group, group[1]) * own_flows(
        est, layout, {lv.tier for lv in est.net.levels(*group)[0]}
    )
    # ... and no longer than their bytes hold the link (work conservation)
    return min(wire * theirs / flows * on_link * there / per, left * there, tail_s)


def op_ready_times(
    est: Estimator, layout: Layout, stage: int, ready: Mapping[str, Ready]
) -> tuple[dict[tuple[int, str], float], float]:
    """When each gradient piece of the stage's last backward is complete, and the
    backward's length (``search.buckets.backward_ready`` on the estimator's model)."""
    return backward_ready(est.model, est.train, layout, stage, ready)
