"""ZeRO-2 and 3's extra seconds in each microbatch of a stage, for the estimate.

:func:`sharded_pass_s` adds to a stage's forward and backward what sharded data
parallelism costs them (``search.sharded``'s closed forms: ZeRO-2's buckets under the
backward, ZeRO-3's gather stream), and where the shard group's links are the layers'
TP and CP links too, what its traffic slows their collectives.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from clustersim.hardware.chip import ChipModel
from clustersim.scenario.models import ParallelismCfg
from clustersim.search import drain
from clustersim.search.drain import link_ratio, shares_links
from clustersim.search.netmodel import TORUS
from clustersim.search.parts import Blocks, blocks_times
from clustersim.search.sharded import buckets as _buckets
from clustersim.search.sharded import (
    expert_shard_group,
    fsdp_overhead,
    stage_uses,
)
from clustersim.search.sharded import overlap_s as _overlap
from clustersim.search.sharded import wire_share as _wire_share
from clustersim.workload import Layout, microbatches
from clustersim.workload.dims import layer_pieces, stage_layers
from clustersim.workload.ops import ACT_BYTES

__all__ = ["Estimator", "sharded_pass_s"]


class Estimator(drain.Estimator, Protocol):
    """What :func:`sharded_pass_s` reads of ``search.estimate.Estimator``."""

    chip: ChipModel


def sharded_pass_s(
    est: Estimator,
    par: ParallelismCfg,
    layout: Layout,
    stage: int,
    blk: Blocks,
    *,
    mb: tuple[float, float, float, float],
    once: list[float],
    in_flight: list[tuple[float, float]],
    sm_lost: list[tuple[float, float] | None],
) -> tuple[float, float]:
    """ZeRO-2 and 3's extra (forward, backward) seconds per microbatch on ``stage``
    (``search.sharded``); ZeRO-3's once-per-step seconds go to ``once``, and the
    seconds their collectives are in flight in a forward and a backward to
    ``in_flight``.

    ``mb`` is the stage's (forward compute, forward comm, backward compute,
    backward comm) per microbatch. Where the layers' TP and CP collectives cross
    the links of the shard group, they share them with its traffic for the
    fraction of the microbatch that traffic is in flight: that fraction of
    their time again.
    """
    once.append(0.0)
    in_flight.append((0.0, 0.0))
    sm_lost.append(None)  # ZeRO-3's stepped SM losses, when it steps them
    if par.zero < 2 or layout.dp * layout.cp == 1:
        return 0.0, 0.0
    f_comp, f_comm, b_comp, b_comm = mb
    # Sharing a link slows only the bytes on it, not the runtime's fixed costs.
    f_wire = f_comm * _wire_share(blk.layer_fwd_comms, blk.layer_fwd[1])
    b_wire = b_comm * _wire_share(blk.layer_bwd_comms, blk.layer_bwd[1])
    shard = layout.span("dp_shard")
    if par.zero == 2:
        edp = expert_shard_group(layout)
        busy = sum(
            est.coll_s(*group, "reduce_scatter", b)
            for group, experts in ((shard, False), (edp, True))
            for b in _buckets(est.model, layout, stage, par.grad_bucket_bytes, experts=experts)
        )
        f_x, b_x = 0.0, max(busy - (b_comp + b_comm), 0.0)
        in_flight[-1] = (0.0, busy)
    else:
        times = blocks_times(blk)
        comms = blocks_times(blk, part=1)
        uses = stage_uses(est.model, par, layout, stage, times=times, links=est, comms=comms)
        sm = est.chip.spec.collective_sm_fraction
        sh = fsdp_overhead(uses, par.fsdp.prefetch, sm)
        sm_lost[-1] = (sh.fwd_lost_s, sh.bwd_lost_s)
        once[-1] = sh.once_s
        busy = sum(u.gather_s + u.scatter_s for u in uses)
        f_x, b_x = sh.fwd_s, sh.bwd_s
        if layout.pp > 1 and not par.fsdp.reshard_after_forward:
            # Gathered once per step (``sharding``): the first microbatch waits for
            # the gathers, the others only for the reduce-scatters.
            kept = [replace(u, gather_s=0.0) for u in uses]
            steady = fsdp_overhead(kept, par.fsdp.prefetch, sm)
            sm_lost[-1] = (steady.fwd_lost_s, steady.bwd_lost_s)
            once[-1] = sh.once_s + sh.fwd_s + sh.bwd_s + steady.once_s
            n_mb = microbatches(par, est.train, layout)
            busy = sum(u.scatter_s for u in uses) + sum(u.gather_s for u in uses) / n_mb
            f_x, b_x = steady.fwd_s, steady.bwd_s
            uses = [replace(u, gather_s=u.gather_s / n_mb) for u in uses]
        in_flight[-1] = (
            sum(u.gather_s for u in uses if not u.backward),
            sum(u.gather_s + u.scatter_s for u in uses if u.backward),
        )
    if not shares_links(est, layout, shard):
        return f_x, b_x
    # A collective of f flows sharing a link with k of the shard group's flows
    # runs at f/(f+k) of the rate, k/f times longer (``search.drain``).
    slow = link_ratio(est, layout, shard, layout.shard_size)
    ring = 2.0 if layout.shard_size >= 3 and est.net.fabric_topology not in TORUS else 1.0
    if par.zero == 2:
        # The buckets stream under the whole backward, from every rank of a chip
        # at once (each its own shard group), with the groups interleaved
        # between a group's members on each link: k is all of their flows.
        b_total = b_comp + b_comm
        busy_frac = min(busy / b_total, 1.0) if b_total > 0 else 0.0
        # ... and it can lose no more time than the shard traffic holds the link.
        return f_x, b_x + min(slow * busy_frac * b_wire, busy)
    if par.zero == 3 and par.fsdp.unit == "layer" and par.fsdp.prefetch:
        # The next layer's gather (and in the backward the last one's reduce-
        # scatter) start with a layer: they share links with its first collectives.
        n = len(stage_layers(est.model, layout, stage))
        per_layer = float(ACT_BYTES * sum(k for _, k in layer_pieces(est.model, layout.tp)))
        # A pipeline stage that keeps its units gathered gathers in its first
        # microbatch alone (above): no gather meets the others' layers.
        once_only = layout.pp > 1 and not par.fsdp.reshard_after_forward
        gather = 0.0 if once_only else est.wire_s(*shard, "all_gather", per_layer)
        scatter = est.wire_s(*shard, "reduce_scatter", per_layer)
        again = gather if par.fsdp.reshard_after_forward else 0.0
        # Only the first collectives of a layer meet its prefetched gather, a
        # burst from one group: k is the ring's flows (measured on the shipped
        # examples: this keeps the estimate within 3% where counting every
        # chip's groups, as for ZeRO-2, overshoots by 16% on a Trn2 torus).
        f_x += n * ring * _overlap(blk.layer_fwd_comms, gather)
        b_x += n * ring * _overlap(blk.layer_bwd_comms, again + scatter)
        return f_x, b_x
    # Whole-chunk units: their gathers stream under the microbatch, as ZeRO-2's
    # buckets do under the backward, but for what the compute waits for (the
    # step's first gather, the last reduce-scatter, the steady waits): no layer
    # runs then, so no TP or CP collective meets it.
    total = f_comp + f_comm + b_comp + b_comm
    if total > 0:
        waited = f_x + b_x + once[-1] / microbatches(par, est.train, layout)
        busy_frac = min(max(busy - waited, 0.0) / total, 1.0)
        f_x = f_x + min(slow * busy_frac * f_wire, busy)
        b_x = b_x + min(slow * busy_frac * b_wire, busy)
    return f_x, b_x
