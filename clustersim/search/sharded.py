"""The estimate's closed forms for sharded data parallelism (ZeRO-2, ZeRO-3, HSDP).

ZeRO-3 adds, per microbatch, the part of each FSDP unit's gather that the compute
before it does not hide. The gathers of a stage and the reduce-scatters of its
backward share the shard group's links: those in flight share the links' time
equally, as the flow model's max-min sharing does (a gather starts when the unit
``prefetch`` gathered uses earlier starts computing, or when its own use is due
without prefetching; a reduce-scatter when its unit's backward ends), and each
ends its fixed costs after its bytes. An MoE unit's dense and expert parts are
gathered at once, over their two groups, and share the links where those cross
the same tier. A unit computes once its predecessor is done and its gather has
arrived. Two microbatches are stepped
through: the second one's time beyond its compute is the steady state, added to
every microbatch's forward and backward; what the first one adds beyond that
(the step's first gather), and the reduce-scatters still running after the last
backward, are added once.

Tails after the last backward (ZeRO-2 and 3): the shard group's reduce-scatters
left (ZeRO-2's buckets, less what hides behind the backward; ZeRO-3's drain),
the replicas' all-reduce of the shards (HSDP: each piece's, started as the
simulator's program starts it, a piece late, the dense and expert pieces sharing
the replicas' links; what ends after the backward is exposed), the Adam step on
the shard, and ZeRO-2's gather of the updated parameters. An MoE model's layers
compute for the time of an MoE layer. Contention with the pipeline's and TP's
traffic is left to the simulation, as for the other collectives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from clustersim.catalog.schema import ModelSpec
from clustersim.scenario.models import ParallelismCfg
from clustersim.search.flatring import TorusDomain, flat_ring
from clustersim.search.sharedlinks import SharedLinks, wire_part
from clustersim.search.templates_time import sm_lost_s
from clustersim.workload import Layout
from clustersim.workload.dims import chunk_layers, embed_pieces, is_moe_layer, stage_pieces
from clustersim.workload.sharding import BYTES, EMBED_UNIT, HEAD_UNIT, unit_parts
from clustersim.workload.transformer import grad_buckets

__all__ = [
    "FsdpUse",
    "GradStream",
    "Links",
    "ShardTimes",
    "bucket_streams",
    "buckets",
    "concurrent_pair_s",
    "dp_tail",
    "expert_shard_group",
    "flat_ring_tiers",
    "fsdp_overhead",
    "overlap_s",
    "pair_s",
    "ready_fractions",
    "stage_uses",
    "steady_scatter_s",
    "unit_streams",
    "wire_share",
]

CollS = Callable[[int, int, str, float], float]
"""``(stride, size, op, nbytes) -> seconds``: the estimator's collective cost."""
Group = tuple[int, int]


class Links(Protocol):
    """The estimator's collective costs: all of one, the part its bytes spend on the
    links, and the tiers of links a group's levels cross."""

    def coll_s(self, stride: int, size: int, op: str, nbytes: float) -> float: ...
    def wire_s(self, stride: int, size: int, op: str, nbytes: float) -> float: ...
    def tiers(self, stride: int, size: int) -> set[str]: ...


Passes = tuple[float, float]
"""(forward, backward) seconds of one microbatch."""


@dataclass(frozen=True)
class FsdpUse:
    """One unit's compute in one pass, with its gather and reduce-scatter seconds."""

    compute_s: float
    gather_s: float  # 0 when the pass needs no gather (kept from the forward)
    scatter_s: float  # 0 in the forward
    backward: bool
    # the seconds of each that its bytes spend on the links (None: all of it)
    gather_wire_s: float | None = None
    scatter_wire_s: float | None = None
    comm_s: float = 0.0  # the part of compute_s its blocking collectives take


@dataclass(frozen=True)
class ShardTimes:
    """ZeRO-3's extra seconds per microbatch (forward, backward) and once per step."""

    fwd_s: float
    bwd_s: float
    once_s: float
    # of which the compute loses to the SMs the collectives in flight take (GPUs)
    fwd_lost_s: float = 0.0
    bwd_lost_s: float = 0.0


def _layer_passes(model: ModelSpec, layer: int, times: dict[str, Passes]) -> Passes:
    """A layer's passes: an MoE layer's (``moe``, when given) or a dense one's."""
    return times["moe"] if "moe" in times and is_moe_layer(model, layer) else times["layer"]


def _unit_passes(
    model: ModelSpec, layout: Layout, stage: int, name: str, times: dict[str, Passes]
) -> Passes:
    if name in (EMBED_UNIT, HEAD_UNIT):
        return times[name]
    if name.startswith("L"):
        return _layer_passes(model, int(name[1:]), times)
    k = int(name[1:])  # a whole model chunk: its layers, and the embedding or head with it
    f = b = 0.0
    for i in chunk_layers(model, layout, stage, k):
        lf, lb = _layer_passes(model, i, times)
        f, b = f + lf, b + lb
    for extra, here in (
        (EMBED_UNIT, stage == 0 and k == 0),
        (HEAD_UNIT, stage == layout.pp - 1 and k == layout.vp - 1),
    ):
        if here:
            f, b = f + times[extra][0], b + times[extra][1]
    return f, b


def stage_uses(
    model: ModelSpec,
    par: ParallelismCfg,
    layout: Layout,
    stage: int,
    *,
    times: dict[str, Passes],
    links: Links,
    comms: dict[str, Passes] | None = None,
) -> list[FsdpUse]:
    """One microbatch's unit uses on ``stage``: the forwards, then the backwards in reverse.

    ``times`` gives the (forward, backward) seconds per microbatch of one ``layer``
    (and of one MoE layer, ``moe``, for an MoE model), the ``embed`` and the ``head``.
    Several model chunks are listed one after the other, as one microbatch runs them.
    An MoE unit's dense part and routed experts are gathered (and reduce-scattered)
    at once, as the simulator's program issues them (:func:`pair_s`).
    """
    cfg = par.fsdp
    shard = layout.span("dp_shard")
    edp = expert_shard_group(layout)
    fwd: list[FsdpUse] = []
    bwd: list[FsdpUse] = []

    seen: dict[tuple[str, int, int], tuple[float, float]] = {}  # the layers' units repeat

    def both(op: str, dense: int, expert: int) -> tuple[float, float]:
        key = (op, dense, expert)
        if key not in seen:
            seen[key] = _both(op, dense, expert)
        return seen[key]

    def _both(op: str, dense: int, expert: int) -> tuple[float, float]:
        # An MoE unit's routed experts travel over their shard group beside its dense
        # part (a one-member group costs nothing).
        if not expert:
            d = BYTES * dense
            return links.coll_s(*shard, op, d), links.wire_s(*shard, op, d)
        return pair_s(links, op, (shard, BYTES * dense), (edp, BYTES * expert))

    for name, (dense, expert) in unit_parts(model, layout, stage, cfg.unit).items():
        gather, g_wire = both("all_gather", dense, expert)
        scatter, s_wire = both("reduce_scatter", dense, expert)
        f_s, b_s = _unit_passes(model, layout, stage, name, times)
        f_c, b_c = _unit_passes(model, layout, stage, name, comms) if comms else (0.0, 0.0)
        fwd.append(FsdpUse(f_s, gather, 0.0, backward=False, gather_wire_s=g_wire, comm_s=f_c))
        again = gather if cfg.reshard_after_forward else 0.0
        bwd.append(
            FsdpUse(
                b_s,
                again,
                scatter,
                backward=True,
                gather_wire_s=g_wire if again else 0.0,
                scatter_wire_s=s_wire,
                comm_s=b_c,
            )
        )
    return [*fwd, *reversed(bwd)]


def fsdp_overhead(uses: Sequence[FsdpUse], prefetch: int, sm: float = 0.0) -> ShardTimes:
    """Step two microbatches of ``uses`` through the gather stream; see the module doc.

    With ``sm`` (GPUs: ``collective_sm_fraction``) a unit's compute runs at ``1 - sm``
    of its speed while collectives' bytes are on the links, as the simulator caps the
    compute runs that meet a flow: the slower unit hides more of the next gather, so
    what it loses (``*_lost_s``) is partly what it no longer waits for.
    """
    n = len(uses)
    seq = [*uses, *uses]
    starts: list[float] = []
    gathered: list[int] = []  # indices of the uses that gather
    ahead = [j for j, u in enumerate(seq) if u.gather_s > 0]
    links = SharedLinks()
    end = 0.0
    waits = [0.0] * len(seq)
    lost = [0.0] * len(seq)
    for j, use in enumerate(seq):
        ready = 0.0
        if use.gather_s > 0:
            k = len(gathered)
            gathered.append(j)
            if prefetch == 0:
                issue = end
            else:
                issue = starts[gathered[k - prefetch]] if k >= prefetch else 0.0
            ready = links.finish(links.add(issue, use.gather_s, use.gather_wire_s))
        start = max(end, ready)
        waits[j] = start - end
        starts.append(start)
        if sm > 0 and use.compute_s > use.comm_s:
            # the gather this unit's start issues is on the links beside what is there
            # (past the second microbatch's last, the next microbatch's first ones)
            k = len(gathered) - 1 + prefetch if use.gather_s > 0 and prefetch else -1
            k = k - len(ahead) // 2 if k >= len(ahead) else k
            nxt = seq[ahead[k]] if 0 <= k < len(ahead) else None
            also = (start, wire_part(nxt.gather_s, nxt.gather_wire_s)) if nxt else None
            busy = links.busy_until(start, also) - start
            lost[j] = sm_lost_s(sm, busy, use.compute_s - use.comm_s, use.comm_s)
        end = start + use.compute_s + lost[j]
        if use.scatter_s > 0:
            links.add(end, use.scatter_s, use.scatter_wire_s)
    link = links.drain()
    pairs = list(zip(waits[n:], lost[n:], uses, strict=True))
    steady_f = sum(w for w, _, u in pairs if not u.backward)
    steady_b = sum(w for w, _, u in pairs if u.backward)
    lost_f = sum(x for _, x, u in pairs if not u.backward)
    lost_b = sum(x for _, x, u in pairs if u.backward)
    first = sum(waits[:n]) + sum(lost[:n]) - steady_f - steady_b - lost_f - lost_b
    once = max(first, 0.0) + max(link - end, 0.0)
    return ShardTimes(steady_f, steady_b, once, lost_f, lost_b)


@dataclass(frozen=True)
class GradStream:
    """One shard group's gradient pieces after a stage's last backward."""

    group: tuple[int, int]
    """(stride, size) of the shard group: ``dp_shard``, or the experts' group."""
    pieces: Sequence[float]
    """Bytes reduced one collective each (ZeRO-2's buckets or ZeRO-3's units), in the
    order the backward completes them."""
    ready: Sequence[float]
    """When each piece is complete, as a fraction of the last backward."""


def ready_fractions(weights: Sequence[float]) -> list[float]:
    """The running share of ``weights`` (bytes or seconds) each piece completes at."""
    total = sum(weights)
    if total <= 0:
        return [1.0] * len(weights)
    out, acc = [], 0.0
    for w in weights:
        acc += w
        out.append(acc / total)
    return out


def unit_streams(
    model: ModelSpec, par: ParallelismCfg, layout: Layout, stage: int, times: dict[str, Passes]
) -> list[GradStream]:
    """ZeRO-3's units in backward order: the dense parts over ``dp_shard``, the routed
    experts' over their group, each ready when its unit's backward ends."""
    parts = list(unit_parts(model, layout, stage, par.fsdp.unit).items())[::-1]
    secs = [_unit_passes(model, layout, stage, name, times)[1] for name, _ in parts]
    ready = ready_fractions(secs)
    dense = [float(BYTES * d) for _, (d, _) in parts]
    expert = [(float(BYTES * e), r) for (_, (_, e)), r in zip(parts, ready, strict=True) if e]
    out = [GradStream(layout.span("dp_shard"), dense, ready)]
    if expert:
        out.append(
            GradStream(expert_shard_group(layout), [b for b, _ in expert], [r for _, r in expert])
        )
    return out


def bucket_streams(
    model: ModelSpec,
    layout: Layout,
    stage: int,
    bucket_bytes: float,
    times: dict[str, Passes],
    *,
    op_ready: tuple[dict[tuple[int, str], float], float] | None = None,
) -> list[GradStream]:
    """ZeRO-2's buckets of the last microbatch: the dense stream over ``dp_shard``, an
    MoE model's routed experts over their group; a bucket is ready when the layer (or
    the head, or the embedding) holding its last byte ends its backward, or with
    ``op_ready`` (each piece's time in the backward, and its length) when the op
    completing that byte has run."""
    pieces = stage_pieces(model, layout, stage)
    embed = {name for name, _ in embed_pieces(model, layout.tp)}
    done: dict[tuple[int, str], float] = {}
    clock, current = 0.0, None
    for layer, name, _ in pieces:
        unit = f"L{layer}" if layer >= 0 else EMBED_UNIT if name in embed else HEAD_UNIT
        if unit != current:
            clock += _unit_passes(model, layout, stage, unit, times)[1]
            current = unit
        done[(layer, name)] = clock
    total = clock or 1.0
    if op_ready is not None and op_ready[1] > 0:
        at, length = op_ready
        done = {key: at.get(key, t / total * length) for key, t in done.items()}
        total = length
    moe = model.moe is not None
    groups = [(layout.span("dp_shard"), False if moe else None)]
    if moe:
        groups.append((expert_shard_group(layout), True))
    out = []
    for group, experts in groups:
        ready, _ = grad_buckets(model, layout, stage, bucket_bytes, experts=experts)
        cut = [(float(b), done[key] / total) for key, sizes in ready.items() for b in sizes]
        out.append(GradStream(group, [b for b, _ in cut], [r for _, r in cut]))
    return out


def dp_tail(
    par: ParallelismCfg,
    layout: Layout,
    streams: Sequence[GradStream],
    *,
    last_bwd_s: float,
    coll_s: CollS,
    wire_s: CollS | None = None,
) -> tuple[float, float]:
    """(exposed reduction, parameter gather) seconds after a stage's last backward.

    Without replicas: ZeRO-2's reduce-scatters of the last microbatch left once the
    backward is done (ZeRO-3's drain is ``fsdp_overhead``'s). With replicas: see
    :func:`_replica_tail`. ZeRO-2 then gathers the updated parameters.
    """
    gather = 0.0
    if par.zero == 2:
        gather = sum(coll_s(*s.group, "all_gather", b) for s in streams for b in s.pieces)
    if layout.replicas > 1:
        tail = _replica_tail(
            par, layout, streams, last_bwd_s=last_bwd_s, coll_s=coll_s, wire_s=wire_s or coll_s
        )
        return tail, gather
    exposed = 0.0
    if par.zero == 2:
        for s in streams:
            rs = [coll_s(*s.group, "reduce_scatter", b) for b in s.pieces]
            exposed += max(sum(rs) - last_bwd_s, rs[-1] if rs else 0.0)
    return exposed, gather


def _replica_tail(
    par: ParallelismCfg,
    layout: Layout,
    streams: Sequence[GradStream],
    *,
    last_bwd_s: float,
    coll_s: CollS,
    wire_s: CollS,
) -> float:
    """HSDP's exposed seconds after the last backward, as ``sharding`` lowers it.

    Each stream's last-microbatch reduce-scatters run one after another from their
    pieces' ready times. A piece's shard is all-reduced over ``dp_replicate`` once its
    reduce-scatter is done and the next piece's starts; the last one's after the
    backward, once its stream's reduce-scatters and those of the streams whose
    reduce-scatters began before it are done (the program's waits). The
    all-reduces of every stream share the replicas' links, their bytes (``wire_s``)
    served in the order they start, each done its runtime's fixed costs (the rest
    of ``coll_s``) after its bytes, which the all-reduces in flight pay at once.
    ZeRO-2 exposes all of it beyond the backward; ZeRO-3 what outlasts its
    reduce-scatters' drain, which ``fsdp_overhead`` already counts.
    """
    replicate = (layout.tp * layout.cp * layout.shard, layout.replicas)
    rs_end = final = 0.0
    issues: list[tuple[float, float, int]] = []
    for s in sorted((s for s in streams if s.pieces), key=lambda s: s.ready[0]):
        link = 0.0
        ends = []
        for b, f in zip(s.pieces, s.ready, strict=True):
            link = max(link, f * last_bwd_s) + coll_s(*s.group, "reduce_scatter", b)
            ends.append(link)
        rs_end = max(rs_end, link)
        final = max(final, last_bwd_s, ends[-1])
        for i, b in enumerate(s.pieces):
            at = max(ends[i], s.ready[i + 1] * last_bwd_s) if i + 1 < len(ends) else final
            shard = math.ceil(b / s.group[1])
            issues.append((at, coll_s(*replicate, "all_reduce", shard), shard))
    link = end = 0.0
    for at, secs, shard in sorted(issues):
        wire = wire_s(*replicate, "all_reduce", shard)
        link = max(link, at) + wire
        end = max(end, link + secs - wire)
    if par.zero == 2:
        return max(rs_end, end) - last_bwd_s
    return max(end - max(rs_end, last_bwd_s), 0.0)


def pair_s(
    links: Links, op: str, a: tuple[Group, float], b: tuple[Group, float]
) -> tuple[float, float]:
    """``op`` over two groups, (group, bytes) each, started together, until both end:
    they share links where their levels cross the same tier (:func:`concurrent_pair_s`)."""
    (ga, na), (gb, nb) = a, b
    return concurrent_pair_s(
        (links.coll_s(*ga, op, na), links.wire_s(*ga, op, na)),
        (links.coll_s(*gb, op, nb), links.wire_s(*gb, op, nb)),
        shared=bool(links.tiers(*ga) & links.tiers(*gb)),
    )


def concurrent_pair_s(
    a: tuple[float, float], b: tuple[float, float], *, shared: bool
) -> tuple[float, float]:
    """Two collectives started together, each given as (seconds alone, seconds of it
    on the links), until the later one ends.

    On separate links each takes its own time. On the same bottleneck links max-min
    sharing halves each one's rate while both move bytes: the one with fewer
    seconds on the links, w_a, ends after its time alone plus w_a, and the other,
    slowed for those 2 w_a of which it had half, after its own time plus w_a. Either
    way the pair ends at ``max(t_a, t_b) + min(w_a, w_b)``. Returns that and the
    pair's seconds on the links (both ones' on shared links, else the longer's).
    """
    longest = max(a[0], b[0])
    if not shared or a[0] <= 0 or b[0] <= 0:
        return longest, max(a[1], b[1])
    return longest + min(a[1], b[1]), min(a[1] + b[1], longest + min(a[1], b[1]))


def expert_shard_group(layout: Layout) -> tuple[int, int]:
    """(stride, size) of the group the routed experts are sharded over: ``edp``, or
    ``edp_shard`` (one replica's part of it) under hybrid sharding."""
    return (layout.etp * layout.ep, layout.expert_shard)


def steady_scatter_s(
    layout: Layout, pieces_bytes: Sequence[float], per_mb_s: float, coll_s: CollS
) -> float:
    """ZeRO-2's extra seconds per microbatch when its bucket reduce-scatters outlast it."""
    shard = layout.span("dp_shard")
    total = sum(coll_s(*shard, "reduce_scatter", b) for b in pieces_bytes)
    return max(total - per_mb_s, 0.0)


def wire_share(comms: tuple[tuple[float, float], ...], total_s: float) -> float:
    """The fraction of a layer's collective seconds its bytes spend on the links."""
    return min(sum(d for _, d in comms) / total_s, 1.0) if total_s > 0 else 1.0


def overlap_s(comms: tuple[tuple[float, float], ...], window_s: float) -> float:
    """Seconds of the collectives (start, seconds) that run within ``window_s`` of the start."""
    return sum(max(min(t + d, window_s) - t, 0.0) for t, d in comms)


def buckets(
    model: ModelSpec, layout: Layout, stage: int, bucket: float, *, experts: bool
) -> list[float]:
    """The stage's gradient buckets of the routed experts (``experts``) or of the rest,
    cut as the simulator cuts them (whole parameters, ``grad_buckets``)."""
    return [float(b) for b in grad_buckets(model, layout, stage, bucket, experts=experts)[1]]


AXIS_TIERS = ("x", "y", "domain")
"""The ``Level.tier`` of each axis of a torus domain (an UltraServer's third is its Z)."""


def flat_ring_tiers(torus: TorusDomain | None, stride: int, size: int) -> set[str]:
    """The torus axes the routes of a group's flat ring cross (none when the group runs
    no flat ring): neighbours in rank order are routed dimension-ordered, so each route
    crosses the axes whose coordinates differ. The shard group of TP 16 on a Trn2
    UltraServer (chips 0, 4, 8, 12 of each instance's snake) hops along x as well as
    y, so it shares x links with the TP groups."""
    ring = flat_ring(torus, stride, size) if torus is not None else None
    if ring is None:
        return set()
    c = ring.info.coords
    return {
        AXIS_TIERS[a] for i in range(len(c)) for a in range(len(c[i])) if c[i][a] != c[i - 1][a]
    }
