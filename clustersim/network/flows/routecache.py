"""Chip pairs routed into the flow model's groups, cached (:meth:`~.flownetwork.FlowNetwork.group`).

Routing a step's pairs costs more than moving its bytes in the fluid model, and the
same steps recur every microbatch, so a :class:`RouteCache` keeps each routed
:class:`~.entity.FlowGroup` under its pairs: a tuple of pairs is its own key, an
array (the many flows of a folded step) is keyed by a digest of its bytes. The
cache is dropped when the topology's routes change (its ``version``), when the
pairs it holds pass a bound, and when HBM becomes shared (:meth:`RouteCache.clear`),
since groups then carry HBM rows too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
from numpy.typing import NDArray

from clustersim.network.fabric import Topology
from clustersim.network.flows.entity import NO_CHIPS, FlowGroup, Pairs, link_counts
from clustersim.network.flows.hbm import SharedHbm

__all__ = ["RouteCache"]


class RouteCache:
    """:class:`~.entity.FlowGroup`\\ s of ``(src_chip, dst_chip)`` pairs on ``topology``."""

    max_cached_pairs: int = 1 << 20
    """The cache is cleared when its keys hold more pairs than this (memory bound)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._groups: dict[Pairs | bytes, FlowGroup] = {}
        self._groups_version = topology.version
        self._cached_pairs = 0

    def clear(self) -> None:
        """Forget every group (their links change: HBM became shared)."""
        self._groups.clear()

    def group(
        self, pairs: Sequence[tuple[int, int]] | NDArray[np.int64], hbm: SharedHbm | None
    ) -> FlowGroup:
        """Route ``pairs`` into a group (cached), with the HBM rows of their chips when
        ``hbm`` is shared.

        Raises :class:`~clustersim.errors.PartitionError` when a pair has no route.
        """
        topo = self.topology
        if self._groups_version != topo.version or self._cached_pairs > self.max_cached_pairs:
            self._groups.clear()
            self._groups_version = topo.version
            self._cached_pairs = 0
        routed: Pairs | Callable[[], NDArray[np.int64]]
        key: Pairs | bytes
        if isinstance(pairs, np.ndarray):
            # An array is keyed by a digest of its bytes: as a tuple of Python ints, a
            # step of 10^5 pairs costs more to build than to route.
            ends = np.array(pairs, dtype=np.int64).reshape(-1, 2)
            key = hashlib.blake2b(np.ascontiguousarray(ends).data, digest_size=16).digest()
            found = self._groups.get(key)
            if found is not None:
                return found
            ends.flags.writeable = False
            routed = partial(np.asarray, ends)  # the pairs themselves, to reroute them
        else:
            key = routed = pairs if isinstance(pairs, tuple) else tuple(pairs)
            found = self._groups.get(key)
            if found is not None:
                return found
            ends = np.asarray(key, dtype=np.int64).reshape(-1, 2)
        loads = topo.route_loads(ends[:, 0], ends[:, 1]) if len(ends) > 1 else None
        if loads is None:
            flat, weights, latency = topo.weighted_routes(ends[:, 0], ends[:, 1])
            links, counts = link_counts(flat, weights)
            latency_s = float(latency.max()) if latency.size else 0.0
        else:
            links, counts, latency_s = loads
        chips = NO_CHIPS
        if hbm is not None:
            links, counts = hbm.add(links, counts, ends[:, 0], ends[:, 1])
            chips = hbm.chips_of(links)
        found = FlowGroup(links, counts, len(ends), latency_s, routed, hbm_chips=chips)
        self._groups[key] = found
        self._cached_pairs += len(ends)
        return found
