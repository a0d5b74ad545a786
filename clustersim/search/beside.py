"""The estimate of a full recompute run beside the backward of the layer after it.

Under the ``dataflow`` TP rule the simulator runs each layer's full recompute beside
the backward of the layer after it (``workload.overlap.recompute_beside``, under the
same conditions here): ``interleave_recompute`` cuts both instruction lists at their
blocking TP collectives and alternates their segments, so each one's collectives run
under the other's compute. A stage's backward of a model chunk of n layers then runs
the first layer's recompute alone, n - 1 such pairs, and the last layer's backward
alone.

:func:`timeline_s` times an instruction list as the simulator's rank does: compute
one op after another, a blocking collective in line, an asynchronous one in flight
from its start until a wait for its group and collective (all but the ``tag`` last
started), each collective taking its closed-form time (the estimate's ``coll_s``).
The collectives of one group in flight at once share its links, as the flow model's
max-min sharing does (``search.sharedlinks``): each is slowed by what another of the
same size beside it adds (the estimator's ``contended_s``: the seconds its bytes
spend on the links, less where a halving-doubling message is bound by its DMA queues
rather than by the link, which then has room for another's). :func:`pair_beside`
gives what a pair saves against the two lists run one after the other: blocking
communication that the interleaving hides, and nothing of the compute (the
simulator's compute is the same either way). It also gives the pair's collectives
with the link seconds the rank waits for, which is what the gradient buckets on the
same links slow (``search.drain``): one hidden under the other list's compute costs
nothing while it stays hidden.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

from clustersim.catalog.schema import ModelSpec
from clustersim.hardware.work import Work
from clustersim.scenario.models import TrainingCfg
from clustersim.search.buckets import is_bf16_layer
from clustersim.search.experts import group_of
from clustersim.search.sharedlinks import SharedLinks
from clustersim.search.templates_time import sm_lost_s
from clustersim.workload.dims import chunk_layers, is_moe_layer
from clustersim.workload.layout import Layout
from clustersim.workload.ops import Block, Tpl
from clustersim.workload.overlap import interleave_recompute
from clustersim.workload.program import Instr, Kind

__all__ = ["Links", "Pair", "pair_beside", "pairs_beside", "stage_saved_s", "timeline_s"]


class Links(Protocol):
    """The estimator's collective costs: one alone, its seconds on the links, and what
    one more of the same on the same links at once adds to it."""

    def coll_s(self, stride: int, size: int, op: str, nbytes: float) -> float: ...
    def wire_s(self, stride: int, size: int, op: str, nbytes: float) -> float: ...
    def contended_s(self, stride: int, size: int, op: str, nbytes: float) -> float: ...


def _instrs(tpls: tuple[Tpl, ...]) -> list[Instr]:
    return [
        Instr(kind, name, phase, work=work, collective=coll, group=group, nbytes=nbytes)
        for kind, name, phase, work, coll, group, nbytes in tpls
    ]


Comm = tuple[float, float]
"""A collective's start, and its seconds on the links that a rank waits for."""


@dataclass(frozen=True)
class Pair:
    """A layer's backward beside the recompute of the layer before it."""

    saved_s: float  # against the two one after the other
    comms: tuple[Comm, ...]  # each collective's start and (waited-for) link seconds


def timeline_s(
    instrs: Sequence[Instr],
    layout: Layout,
    work_s: Callable[[Work], float],
    links: Links,
    *,
    sm_fraction: float = 0.0,
    comms: list[Comm] | None = None,
) -> tuple[float, float]:
    """(compute, everything else) seconds of ``instrs`` on one rank; see the module doc.

    ``comms``, when given, receives each collective's start and its seconds on the
    links (``wire_s``) times the fraction of its time the rank waits for it (all of a
    blocking one's): what a slower link would cost the rank, to first order."""
    t = comp = 0.0
    shared: dict[str, SharedLinks] = {}
    # per (group, collective) window: [id, compute since its start, seconds, start,
    # link seconds] of each collective in flight
    windows: dict[tuple[str, str], list[list[float]]] = {}

    def start(ins: Instr) -> list[float]:
        group = group_of(ins.group, layout)
        took = links.coll_s(*group, ins.collective, ins.nbytes)
        extra = links.contended_s(*group, ins.collective, ins.nbytes)
        ident = shared.setdefault(ins.group, SharedLinks()).add(t, took, extra)
        return [ident, 0.0, took, t, links.wire_s(*group, ins.collective, ins.nbytes)]

    def waited(f: list[float], end: float) -> None:
        if comms is not None and f[2] > 0:
            comms.append((f[3], f[4] * min(max(end - t, 0.0) / f[2], 1.0)))

    for ins in instrs:
        if ins.kind == Kind.COMPUTE and ins.work is not None:
            d = work_s(ins.work)
            t += d
            comp += d
            for window in windows.values():
                for f in window:
                    f[1] += d
        elif ins.kind == Kind.COLLECTIVE:
            f = start(ins)
            if comms is not None:  # blocking: waited for all its time
                comms.append((t, f[4]))
            t = max(t, shared[ins.group].finish(int(f[0])))
        elif ins.kind == Kind.ASYNC_COLLECTIVE:
            windows.setdefault((ins.group, ins.collective), []).append(start(ins))
        elif ins.kind == Kind.WAIT_ASYNC:
            window = windows.get((ins.group, ins.collective), [])
            due = len(window) - ins.tag
            if due <= 0:
                continue
            done, window[:due] = window[:due], []
            ends = [shared[ins.group].finish(int(f[0])) for f in done]
            for f, end in zip(done, ends, strict=True):
                waited(f, end)
            lost = max(sm_lost_s(sm_fraction, f[2], f[1], 0.0) for f in done)
            t = max(t, *ends) + lost
    return comp, t - comp


def pair_beside(
    bwd: tuple[Tpl, ...],
    rec: tuple[Tpl, ...],
    layout: Layout,
    work_s: Callable[[Work], float],
    links: Links,
    *,
    sm_fraction: float = 0.0,
) -> Pair:
    """A layer's backward ``bwd`` beside the recompute ``rec`` of the layer before it
    (``interleave_recompute``): what it saves against one after the other, and its
    collectives."""
    b, r = _instrs(bwd), _instrs(rec)
    alone = sum(timeline_s(b, layout, work_s, links, sm_fraction=sm_fraction))
    alone += sum(timeline_s(r, layout, work_s, links, sm_fraction=sm_fraction))
    comms: list[Comm] = []
    both = interleave_recompute(b, r)
    took = sum(timeline_s(both, layout, work_s, links, sm_fraction=sm_fraction, comms=comms))
    return Pair(max(alone - took, 0.0), tuple(sorted(comms)))


def _kind(model: ModelSpec, train: TrainingCfg, layer: int) -> str:
    """The block a layer runs (``LayerBlocks[layer]``): ``bf16``, ``dense`` or ``moe``."""
    if is_bf16_layer(model, train, layer):
        return "bf16"
    return "moe" if is_moe_layer(model, layer) else "dense"


def stage_saved_s(
    run: tuple[ModelSpec, TrainingCfg, Layout],
    stage: int,
    pairs: Mapping[tuple[str, str], Pair],
) -> float:
    """Seconds a stage's backward of one microbatch saves: over each model chunk's
    layers in backward order, what each layer's backward beside the recompute of the
    layer before it saves (``pairs``, by their blocks' kinds); the first layer a
    backward reaches recomputes alone."""
    model, train, layout = run
    total = 0.0
    for chunk in range(layout.vp):
        order = [
            _kind(model, train, i) for i in reversed(chunk_layers(model, layout, stage, chunk))
        ]
        total += sum(pairs[(lay, before)].saved_s for lay, before in pairwise(order))
    return total


def pairs_beside(
    blocks: Mapping[str, Block],
    layout: Layout,
    work_s: Callable[[Work], float],
    links: Links,
    *,
    sm_fraction: float = 0.0,
) -> dict[tuple[str, str], Pair]:
    """:func:`pair_beside` of each (backward, recompute) pair of the named blocks."""
    return {
        (b, r): pair_beside(bb.bwd, rb.recompute, layout, work_s, links, sm_fraction=sm_fraction)
        for b, bb in blocks.items()
        for r, rb in blocks.items()
    }
