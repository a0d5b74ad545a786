"""The runtime's flat ring on a torus whose group is not a grid, as the estimate prices it.

On a torus fabric the Neuron runtime runs large all-reduces, reduce-scatters and
all-gathers as rings along each axis of the group's grid (``torus``); a group that
is no grid (:func:`~clustersim.network.collectives.groups.torus_grid` returns None: the
data-parallel groups of every other chip pair on the snake-ordered Trn2 torus,
say) runs one bidirectional ``ring`` in rank order instead. Its members' neighbours
are then several torus links apart, routed dimension-ordered
(:func:`~clustersim.network.fabric.builders.torus_path`), and every group of the same
shape in the scale-up domain runs its ring at once over the same links.

:func:`flat_ring` places those groups as the simulator does (ranks fill chips in
order, chips fill the domain's torus as :func:`~.builders.torus_domain` places
them), counts how many ring pairs of all of them cross each direction of each
torus link, and keeps the busiest link's load over its capacity. A ring round
moves ``n / p / 2`` per pair each way, so the ring's time is

    rounds x (n / p / 2 x max_l load_l / capacity_l + longest route latency
              + a handshake + two messages posted)
    + launch

with ``p - 1`` rounds for a reduce-scatter or all-gather and ``2(p - 1)`` for an
all-reduce (:mod:`~clustersim.network.collectives.algorithms.ring`,
:mod:`~clustersim.network.runtimes.costs`).
Max-min sharing gives every flow through the busiest link the same share of it,
and the flows there are the last to finish, so the bound is what the flow model
finds when no other traffic is on the links.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

from clustersim.network.collectives import GroupInfo, torus_grid
from clustersim.network.fabric import torus_path

__all__ = ["FlatRing", "TorusDomain", "flat_ring", "flat_ring_s"]

Coords = tuple[int, ...]


@dataclass(frozen=True)
class TorusDomain:
    """One scale-up domain's torus: each local chip's coordinates, the axis sizes and
    each axis's link capacity (one direction) and latency."""

    coords: tuple[Coords, ...]
    dims: Coords
    axis_Bps: tuple[float, ...]
    axis_latency_s: tuple[float, ...]
    ranks_per_chip: int


@dataclass(frozen=True)
class FlatRing:
    """A flat ring's busiest link, in seconds per byte of one pair's message, its
    longest route's latency, and its group's placement (what the runtime's choice reads)."""

    info: GroupInfo
    s_per_byte: float
    route_s: float

    @property
    def p(self) -> int:
        return self.info.p


def flat_ring(domain: TorusDomain, stride: int, size: int) -> FlatRing | None:
    """The flat ring of a group of ``size`` ranks ``stride`` apart, or None when the
    runtime runs no flat ring on it: the group is a grid on the torus, spans several
    domains, or has several ranks on one chip."""
    return _flat_ring(domain, stride, size)


@lru_cache(maxsize=1024)
def _flat_ring(domain: TorusDomain, stride: int, size: int) -> FlatRing | None:
    rpc, chips = domain.ranks_per_chip, len(domain.coords)
    span = stride * size  # ranks of one block: ``stride`` groups interleaved
    if size < 3 or stride < rpc or span > rpc * chips or (rpc * chips) % span:
        return None
    first = [(k * stride) // rpc for k in range(size)]
    info = GroupInfo.of(first, [0] * size, [domain.coords[c] for c in first], domain.dims)
    if torus_grid(info) is not None:
        return None
    load: Counter[tuple[Coords, Coords]] = Counter()
    axis_of: dict[tuple[Coords, Coords], int] = {}
    route_s = 0.0
    for base in range(0, rpc * chips, span):
        for offset in range(stride):
            members = [domain.coords[(base + offset + k * stride) // rpc] for k in range(size)]
            for i, here in enumerate(members):
                for there in (members[(i + 1) % size], members[i - 1]):
                    path = torus_path(here, there, domain.dims)
                    latency = 0.0
                    for u, v in pairwise(path):
                        axis = next(a for a in range(len(u)) if u[a] != v[a])
                        load[(u, v)] += 1
                        axis_of[(u, v)] = axis
                        latency += domain.axis_latency_s[axis]
                    route_s = max(route_s, latency)
    busiest = max((n / domain.axis_Bps[axis_of[link]] for link, n in load.items()), default=0.0)
    return FlatRing(info, busiest, route_s)


def flat_ring_s(
    op: str, nbytes: float, ring: FlatRing, *, launch_s: float, step_s: float, message_s: float
) -> tuple[float, float]:
    """(all of it, seconds on the links) of ``op`` on ``ring``; see the module doc."""
    rounds = 2 * (ring.p - 1) if op == "all_reduce" else ring.p - 1
    wire = rounds * nbytes / ring.p / 2 * ring.s_per_byte
    # Each member posts to both neighbours in a round, and every round pays its handshake.
    fixed = launch_s + rounds * (step_s + 2 * message_s)
    return wire + rounds * ring.route_s + fixed, wire
