"""The estimate's seconds of a block's op templates, and what overlapped collectives cost.

Compute ops take their time on the chip's roofline and blocking collectives their
closed-form cost. The CP ring's transfers (``workload.cp_ring``) and the TP
backward's asynchronous collectives (``workload.tp_comm``) overlap the compute
between their start and their wait: what they take beyond it is exposed, and the
compute under them loses the SMs the collective takes (counted with the
communication, so the compute stays the simulator's).
"""

from __future__ import annotations

from collections.abc import Callable

from clustersim.hardware.work import Work
from clustersim.search.experts import group_of
from clustersim.workload.layout import Layout
from clustersim.workload.ops import Tpl
from clustersim.workload.program import Kind

__all__ = ["sm_lost_s", "templates_s"]


def sm_lost_s(fraction: float, in_flight_s: float, comp_s: float, comm_s: float) -> float:
    """The seconds a pass of ``comp_s`` compute and ``comm_s`` blocking communication
    loses to collectives in flight for ``in_flight_s`` of it that take ``fraction`` of
    the SMs (``collective_sm_fraction``): its compute runs at ``1 - fraction`` of its
    speed for its share of that time (the simulator caps the runs that meet a flow
    so), ``1/(1 - fraction)`` longer, and at most all of it is slowed."""
    if fraction <= 0 or in_flight_s <= 0 or comp_s <= 0:
        return 0.0
    slowed = comp_s / (1.0 - fraction)
    return fraction * min(in_flight_s * slowed / (slowed + comm_s), slowed)


def templates_s(
    tpls: tuple[Tpl, ...],
    layout: Layout,
    work_s: Callable[[Work], float],
    coll_s: Callable[[int, int, str, float], float],
    sm_fraction: float,
) -> tuple[float, float]:
    """(compute, communication) seconds of ``tpls``; see the module doc."""
    comp = comm = 0.0
    ring_s = under_s = 0.0  # the ring transfer in flight, and the compute since its start
    # Other asynchronous collectives (the TP backward's, workload.tp_comm) by group and
    # collective: [seconds, compute since its start].
    flight: dict[tuple[str, str], list[float]] = {}
    for kind, _, _, work, coll, group, nbytes in tpls:
        if kind == Kind.COMPUTE and work is not None:
            t = work_s(work)
            comp += t
            under_s += t
            for f in flight.values():
                f[1] += t
        elif kind == Kind.COLLECTIVE:
            comm += coll_s(*group_of(group, layout), coll, nbytes)
        elif kind == Kind.ASYNC_COLLECTIVE and group == "cp":
            ring_s, under_s = coll_s(*group_of(group, layout), coll, nbytes), 0.0
        elif kind == Kind.WAIT_ASYNC and group == "cp" and ring_s > 0:
            comm += max(ring_s - under_s, 0.0) + sm_lost_s(sm_fraction, ring_s, under_s, 0.0)
            ring_s = 0.0
        elif kind == Kind.ASYNC_COLLECTIVE and group != "cp":
            flight[(group, coll)] = [coll_s(*group_of(group, layout), coll, nbytes), 0.0]
        elif kind == Kind.WAIT_ASYNC and (group, coll) in flight:
            took, under = flight.pop((group, coll))
            comm += max(took - under, 0.0) + sm_lost_s(sm_fraction, took, under, 0.0)
    return comp, comm
