"""Overlap of one microbatch's expert all-to-alls with another's compute.

Megatron-Core's ``overlap_moe_expert_parallel_comm`` (its "combined 1F1B") and
DeepSeek-V3's DualPipe (arXiv 2412.19437 section 3.2.1) run a forward and a
backward of two different microbatches as one unit: while one waits for its
dispatch or combine all-to-all, the other computes. ``pair_units`` picks the
units from a schedule's order (two adjacent items, one forward and one
backward, of different microbatches: neither can depend on the other), and
``interleave`` merges their instruction lists.

``interleave`` cuts each list at its expert all-to-alls (``ep``, or under the
hierarchical dispatcher ``ep_cross`` with the ``ep_node`` one started beside it
and waited for after it: one cut) into segments and alternates the two: a
segment of one, its all-to-all started without waiting, a segment of the other,
its all-to-all started, then a wait for the first all-to-all (all but the one
started last) before the first list's next segment, and so on. So at most one
cut of each list is in flight, each hides behind the other list's segment, and a
list that runs out of segments leaves the other to run with its all-to-alls
waited for at once (blocking).
Everything else (TP collectives, sends and receives, gradient buckets) keeps
its place inside its segment. The all-to-all's flows share links and HBM with
the compute they overlap, as any asynchronous collective does.

``interleave_recompute`` merges the same way a layer's backward with the
recomputed forward of the layer before it (full recompute under the ``dataflow``
rule, ``workload.tp_comm``), cut at their blocking tensor-parallel collectives: the
Neuron compiler orders work only by explicit dependencies and runs collectives on
their own cores (aws-neuron-sdk neuron-runtime/explore/compute-comm-overlap.rst),
and the recomputed forward of layer l - 1 depends only on that layer's saved
input, not on layer l's backward, so each hides its collectives behind the
other's compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from clustersim.workload.program import Instr, Kind
from clustersim.workload.schedules import Step

if TYPE_CHECKING:
    from clustersim.catalog.schema import ModelSpec
    from clustersim.scenario.models import ParallelismCfg
    from clustersim.workload.dims import Dims
    from clustersim.workload.layout import Layout

__all__ = ["a2a_overlap", "interleave", "interleave_recompute", "pair_units", "recompute_beside"]

_A2A_GROUPS = ("ep", "ep_node", "ep_cross")


def a2a_overlap(par: ParallelismCfg, model: ModelSpec, layout: Layout) -> bool:
    """Whether the layout overlaps expert all-to-alls across microbatches."""
    wanted = par.overlap_moe_a2a or par.schedule == "dualpipe"  # DualPipe's own overlap
    return wanted and model.moe is not None and layout.ep > 1


def recompute_beside(par: ParallelismCfg, dm: Dims) -> bool:
    """Whether each layer's full recompute runs beside the backward of the layer after
    it (``interleave_recompute``): under the ``dataflow`` rule, with TP collectives.
    Not under ZeRO-3, whose per-layer parameter gathers (``workload.sharding``) are
    placed before each layer's recompute and backward in turn."""
    return par.recompute == "full" and dm.tp_overlap == "dataflow" and dm.tp > 1 and par.zero < 3


def pair_units(order: Sequence[Step]) -> list[tuple[int, ...]]:
    """The order's items as units: pairs to overlap, and single items.

    Greedy from the start: two adjacent items form a pair when one is a forward
    and the other a backward of different microbatches. Returns index tuples in
    order, covering every item once.
    """
    units: list[tuple[int, ...]] = []
    i = 0
    while i < len(order):
        if i + 1 < len(order):
            (k0, mb0, _), (k1, mb1, _) = order[i], order[i + 1]
            if k0 != k1 and mb0 != mb1:
                units.append((i, i + 1))
                i += 2
                continue
        units.append((i,))
        i += 1
    return units


def _is_a2a(ins: Instr, kind: Kind) -> bool:
    return ins.kind == kind and ins.collective == "all_to_all" and ins.group in _A2A_GROUPS


def _is_tp(ins: Instr, kind: Kind) -> bool:
    return kind == Kind.COLLECTIVE and ins.kind == kind and ins.group == "tp"


CutTest = Callable[[Instr, Kind], bool]


Cut = tuple[Instr, ...]
"""A blocking expert all-to-all with the ones started just before it to run beside it
(the hierarchical dispatcher's NVLink part), whose waits after it the cut takes over."""

Flight = tuple[int, int, int]
"""An all-to-all in flight: (stream, cut, member of the cut)."""


def _segments(
    instrs: list[Instr], is_cut: CutTest = _is_a2a
) -> tuple[list[list[Instr]], list[Cut]]:
    """Cut at the blocking collectives ``is_cut`` picks (the expert all-to-alls): the
    segments, and the cuts between."""
    segs: list[list[Instr]] = [[]]
    cuts: list[Cut] = []
    beside: set[str] = set()  # groups of the last cut whose wait it took over
    for ins in instrs:
        if is_cut(ins, Kind.COLLECTIVE):
            seg = segs[-1]
            lead: list[Instr] = []
            while seg and is_cut(seg[-1], Kind.ASYNC_COLLECTIVE):
                lead.insert(0, seg.pop())
            cuts.append((*lead, ins))
            beside = {a.group for a in lead}
            segs.append([])
        elif ins.kind == Kind.WAIT_ASYNC and ins.group in beside and is_cut(ins, ins.kind):
            beside.discard(ins.group)  # the cut's own wait, placed by interleave
        else:
            segs[-1].append(ins)
    return segs, cuts


def interleave_recompute(backward: list[Instr], recompute: list[Instr]) -> list[Instr]:
    """One instruction list running a layer's ``backward`` and the ``recompute`` of the
    layer before it, each one's blocking TP collectives under the other's compute."""
    return interleave(backward, recompute, _is_tp)


def interleave(first: list[Instr], second: list[Instr], is_cut: CutTest = _is_a2a) -> list[Instr]:
    """One instruction list running ``first`` and ``second`` with their blocking
    collectives that ``is_cut`` picks (the expert all-to-alls) overlapped."""
    streams = [_segments(first, is_cut), _segments(second, is_cut)]
    if not streams[0][1] and not streams[1][1]:
        return first + second  # nothing to overlap
    out: list[Instr] = []
    flight: list[Flight] = []  # the all-to-alls in flight, oldest first
    nxt = [0, 0]  # next segment of each stream
    turn = 0
    while nxt[0] < len(streams[0][0]) or nxt[1] < len(streams[1][0]):
        if nxt[turn] >= len(streams[turn][0]):
            turn = 1 - turn
        segs, cuts = streams[turn]
        j = nxt[turn]
        if j > 0:  # this stream's last all-to-alls must be done
            for m, a2a in enumerate(cuts[j - 1]):
                key = (turn, j - 1, m)
                if key not in flight:
                    continue
                out.append(_wait(a2a, key, flight, streams))
                last = flight.index(key)
                flight = [
                    f
                    for i, f in enumerate(flight)
                    if i > last or _window(streams, f) != _window_of(a2a)
                ]
        out.extend(segs[j])
        if j < len(cuts):
            for m, a2a in enumerate(cuts[j]):
                out.append(
                    Instr(
                        Kind.ASYNC_COLLECTIVE,
                        a2a.name,
                        a2a.phase,
                        a2a.layer,
                        a2a.microbatch,
                        collective=a2a.collective,
                        group=a2a.group,
                        nbytes=a2a.nbytes,
                    )
                )
                flight.append((turn, j, m))
        nxt[turn] = j + 1
        turn = 1 - turn
    return out


def _member(streams: list[tuple[list[list[Instr]], list[Cut]]], f: Flight) -> Instr:
    return streams[f[0]][1][f[1]][f[2]]


def _window_of(ins: Instr) -> tuple[str, str]:
    """The engine's wait window an asynchronous collective is in: its group and kind."""
    return ins.group, ins.collective


def _window(streams: list[tuple[list[list[Instr]], list[Cut]]], f: Flight) -> tuple[str, str]:
    return _window_of(_member(streams, f))


def _wait(
    a2a: Instr,
    key: Flight,
    flight: list[Flight],
    streams: list[tuple[list[list[Instr]], list[Cut]]],
) -> Instr:
    """Wait for ``a2a``: for every collective of its group and kind started up to it
    (the engine's window is per group and collective: it leaves the ones started later)."""
    pos = flight.index(key)
    leave = sum(1 for f in flight[pos + 1 :] if _window(streams, f) == _window_of(a2a))
    return Instr(
        Kind.WAIT_ASYNC,
        f"{a2a.name}.wait",
        a2a.phase,
        a2a.layer,
        a2a.microbatch,
        collective=a2a.collective,
        group=a2a.group,
        tag=leave,
    )
