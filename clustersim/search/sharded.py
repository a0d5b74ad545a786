"""The estimate's closed forms for sharded data parallelism (ZeRO-2, ZeRO-3, HSDP).

ZeRO-3 adds, per microbatch, the part of each FSDP unit's gather that the compute
before it does not hide. The gathers of a stage and the reduce-scatters of its
backward share the shard group's links; the estimate serves them one after
another in the order they start (a gather when the unit ``prefetch`` gathered
uses earlier starts computing, or when its own use is due without prefetching;
a reduce-scatter when its unit's backward ends). A unit computes once its
predecessor is done and its gather has arrived. Two microbatches are stepped
through: the second one's time beyond its compute is the steady state, added to
every microbatch's forward and backward; what the first one adds beyond that
(the step's first gather), and the reduce-scatters still running after the last
backward, are added once.

Tails after the last backward (ZeRO-2 and 3): the shard group's reduce-scatters
left (ZeRO-2's buckets, less what hides behind the backward; ZeRO-3's drain),
the replicas' all-reduce of the shards (HSDP), less what hides behind the last
microbatch's backward, the Adam step on the shard, and ZeRO-2's gather of the
updated parameters. Contention with the pipeline's and TP's traffic is left to
the simulation, as for the other collectives.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from clustersim.catalog.schema import ModelSpec
from clustersim.scenario.models import ParallelismCfg
from clustersim.workload import Layout
from clustersim.workload.dims import chunk_layers
from clustersim.workload.sharding import BYTES, EMBED_UNIT, HEAD_UNIT, unit_parts

__all__ = ["FsdpUse", "ShardTimes", "dp_tail", "fsdp_overhead", "stage_uses", "steady_scatter_s"]

CollS = Callable[[int, int, str, float], float]
"""``(stride, size, op, nbytes) -> seconds``: the estimator's collective cost."""
Passes = tuple[float, float]
"""(forward, backward) seconds of one microbatch."""


@dataclass(frozen=True)
class FsdpUse:
    """One unit's compute in one pass, with its gather and reduce-scatter seconds."""

    compute_s: float
    gather_s: float  # 0 when the pass needs no gather (kept from the forward)
    scatter_s: float  # 0 in the forward
    backward: bool


@dataclass(frozen=True)
class ShardTimes:
    """ZeRO-3's extra seconds per microbatch (forward, backward) and once per step."""

    fwd_s: float
    bwd_s: float
    once_s: float


def _unit_passes(
    model: ModelSpec, layout: Layout, stage: int, name: str, times: dict[str, Passes]
) -> Passes:
    if name in (EMBED_UNIT, HEAD_UNIT):
        return times[name]
    if name.startswith("L"):
        return times["layer"]
    k = int(name[1:])  # a whole model chunk: its layers, and the embedding or head with it
    n = len(chunk_layers(model, layout, stage, k))
    f, b = n * times["layer"][0], n * times["layer"][1]
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
    coll_s: CollS,
) -> list[FsdpUse]:
    """One microbatch's unit uses on ``stage``: the forwards, then the backwards in reverse.

    ``times`` gives the (forward, backward) seconds per microbatch of one ``layer``,
    the ``embed`` and the ``head``. Several model chunks are listed one after the
    other, as one microbatch runs them.
    """
    cfg = par.fsdp
    shard = (layout.tp * layout.cp, layout.shard)
    edp = (layout.etp * layout.ep, layout.edp)
    fwd: list[FsdpUse] = []
    bwd: list[FsdpUse] = []

    def both(op: str, dense: int, expert: int) -> float:
        # An MoE unit's routed experts travel over edp, after its dense part.
        return coll_s(*shard, op, BYTES * dense) + (
            coll_s(*edp, op, BYTES * expert) if expert else 0.0
        )

    for name, (dense, expert) in unit_parts(model, layout, stage, cfg.unit).items():
        gather = both("all_gather", dense, expert)
        scatter = both("reduce_scatter", dense, expert)
        f_s, b_s = _unit_passes(model, layout, stage, name, times)
        fwd.append(FsdpUse(f_s, gather, 0.0, backward=False))
        again = gather if cfg.reshard_after_forward else 0.0
        bwd.append(FsdpUse(b_s, again, scatter, backward=True))
    return [*fwd, *reversed(bwd)]


def fsdp_overhead(uses: Sequence[FsdpUse], prefetch: int) -> ShardTimes:
    """Step two microbatches of ``uses`` through the gather stream; see the module doc."""
    n = len(uses)
    seq = [*uses, *uses]
    starts: list[float] = []
    gathered: list[int] = []  # indices of the uses that gather
    link = 0.0  # when the shard group's links are next free
    scatters: deque[tuple[float, float]] = deque()  # (started at, seconds), not yet served
    end = 0.0
    waits = [0.0] * len(seq)
    for j, use in enumerate(seq):
        ready = 0.0
        if use.gather_s > 0:
            k = len(gathered)
            gathered.append(j)
            if prefetch == 0:
                issue = end
            else:
                issue = starts[gathered[k - prefetch]] if k >= prefetch else 0.0
            while scatters and scatters[0][0] <= issue:
                at, secs = scatters.popleft()
                link = max(link, at) + secs
            link = max(link, issue) + use.gather_s
            ready = link
        start = max(end, ready)
        waits[j] = start - end
        starts.append(start)
        end = start + use.compute_s
        if use.scatter_s > 0:
            scatters.append((end, use.scatter_s))
    for at, secs in scatters:
        link = max(link, at) + secs
    steady_f = sum(w for w, u in zip(waits[n:], uses, strict=True) if not u.backward)
    steady_b = sum(w for w, u in zip(waits[n:], uses, strict=True) if u.backward)
    first = sum(waits[:n]) - steady_f - steady_b
    return ShardTimes(steady_f, steady_b, max(first, 0.0) + max(link - end, 0.0))


def dp_tail(
    par: ParallelismCfg,
    layout: Layout,
    pieces_bytes: Sequence[float],
    last_bwd_s: float,
    coll_s: CollS,
    *,
    shard: tuple[int, int] | None = None,
) -> tuple[float, float]:
    """(exposed reduction, parameter gather) seconds after a stage's last backward.

    ``pieces_bytes`` are the gradient bytes reduced one collective each: ZeRO-2's
    buckets or ZeRO-3's units, in the order the backward completes them, over the
    ``shard`` group (default ``dp_shard``; an MoE model's experts pass ``edp``).
    """
    shard = shard or (layout.tp * layout.cp, layout.shard)
    replicate = (layout.tp * layout.cp * layout.shard, layout.replicas)
    exposed = 0.0
    if par.zero == 2:
        rs = [coll_s(*shard, "reduce_scatter", b) for b in pieces_bytes]
        total = sum(rs)
        exposed = max(total - last_bwd_s, rs[-1] if rs else 0.0)
    if layout.replicas > 1:
        ar = [coll_s(*replicate, "all_reduce", math.ceil(b / layout.shard)) for b in pieces_bytes]
        exposed += max(sum(ar) - last_bwd_s, ar[-1] if ar else 0.0)
    gather = 0.0
    if par.zero == 2:
        gather = sum(coll_s(*shard, "all_gather", b) for b in pieces_bytes)
    return exposed, gather


def steady_scatter_s(
    layout: Layout, pieces_bytes: Sequence[float], per_mb_s: float, coll_s: CollS
) -> float:
    """ZeRO-2's extra seconds per microbatch when its bucket reduce-scatters outlast it."""
    shard = (layout.tp * layout.cp, layout.shard)
    total = sum(coll_s(*shard, "reduce_scatter", b) for b in pieces_bytes)
    return max(total - per_mb_s, 0.0)
