"""A fluid flow model of the network on a SimPy environment.

A *transfer* is one entity: a group of flows (chip to chip) that start
together, move the same number of bytes at one common rate, and finish
together, like the flows of one step of a collective. After its latency the
entity joins the fluid model. Rates are the max-min fair allocation over all
active entities (:mod:`clustersim.network.maxmin`), recomputed whenever an
entity joins or leaves; between changes, remaining bytes drain linearly.

Joins and departures at one simulated instant are batched: the first change
schedules a solve at the same time (a zero-delay timeout), and every change
made before it runs joins the same solve. After each solve one wake-up is
scheduled for the next completion; a generation counter makes older wake-ups
no-ops, since SimPy timeouts cannot be cancelled. A wake-up finishes every
entity whose remaining bytes are within a relative epsilon of zero, so
simultaneous completions cost one solve.

The model keeps per-link byte counters (:attr:`FlowNetwork.link_bytes`), the
basis for per-link utilisation. Routes are fixed when an entity is created:
a later link failure does not reroute entities already in flight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import scipy.sparse as sp
import simpy
from numpy.typing import NDArray

from clustersim.errors import SimulationError
from clustersim.network.maxmin import maxmin_rates
from clustersim.network.topology import Topology

__all__ = ["FlowGroup", "FlowNetwork"]

Pairs = tuple[tuple[int, int], ...]


@dataclass(frozen=True, eq=False)
class FlowGroup:
    """The routed flows of one entity: its column of the incidence matrix.

    ``links`` are distinct link indices and ``counts`` how many of the group's
    flows cross each; ``latency_s`` is the longest route latency of its flows.
    """

    links: NDArray[np.int64]
    counts: NDArray[np.float64]
    n_flows: int
    latency_s: float


class FlowNetwork:
    """Active transfers sharing the links of a :class:`Topology` by max-min fairness."""

    rel_eps: float = 1e-9
    """An entity is done when its remaining bytes are below this fraction of its bytes."""

    max_cached_pairs: int = 1 << 20
    """The group cache is cleared when its keys hold more pairs than this (memory bound)."""

    def __init__(self, env: simpy.Environment, topology: Topology) -> None:
        self.env = env
        self.topology = topology
        n_links = topology.n_links
        self.link_bytes: NDArray[np.float64] = np.zeros(n_links)
        """Bytes carried so far by each link."""
        self.bytes_moved = 0.0
        """Flow-bytes delivered so far: the sum over flows of bytes moved."""
        self.transfers = 0
        self.entities_done = 0
        self.solves = 0
        self._groups: dict[Pairs, FlowGroup] = {}
        self._groups_version = topology.version
        self._cached_pairs = 0
        # Active entities, in join order; the incidence matrix in compressed-column form.
        self._events: list[simpy.Event] = []
        self._nnz = np.zeros(0, dtype=np.int64)
        self._links = np.zeros(0, dtype=np.int64)
        self._counts = np.zeros(0, dtype=np.float64)
        self._n_flows = np.zeros(0, dtype=np.float64)
        self._total = np.zeros(0, dtype=np.float64)
        self._remaining = np.zeros(0, dtype=np.float64)
        self._rate = np.zeros(0, dtype=np.float64)
        self._load_Bps = np.zeros(n_links)
        self._pending: list[tuple[FlowGroup, float, simpy.Event]] = []
        self._last_s = float(env.now)
        self._generation = 0
        self._solve_scheduled = False

    # -- public API -----------------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Entities moving bytes now (not counting those in their latency phase)."""
        return len(self._events) + len(self._pending)

    @property
    def load_Bps(self) -> NDArray[np.float64]:
        """Current load of each link, from the last solve. Do not modify."""
        return self._load_Bps

    def group(self, pairs: Sequence[tuple[int, int]]) -> FlowGroup:
        """Route ``(src_chip, dst_chip)`` pairs into a :class:`FlowGroup` (cached).

        Raises :class:`~clustersim.errors.PartitionError` when a pair has no route.
        """
        topo = self.topology
        if self._groups_version != topo.version or self._cached_pairs > self.max_cached_pairs:
            self._groups.clear()
            self._groups_version = topo.version
            self._cached_pairs = 0
        key = pairs if isinstance(pairs, tuple) else tuple(pairs)
        found = self._groups.get(key)
        if found is not None:
            return found
        flat, latency = topo.routes(key)
        links, counts = np.unique(flat, return_counts=True)
        latency_s = float(latency.max()) if latency.size else 0.0
        found = FlowGroup(links.astype(np.int64), counts.astype(np.float64), len(key), latency_s)
        self._groups[key] = found
        self._cached_pairs += len(key)
        return found

    def transfer(
        self, pairs: Sequence[tuple[int, int]], bytes_per_flow: float, latency_s: float
    ) -> simpy.Event:
        """Move ``bytes_per_flow`` over each ``(src_chip, dst_chip)`` pair after ``latency_s``.

        Returns an event that succeeds when every flow has arrived.
        """
        return self.transfer_group(self.group(pairs), bytes_per_flow, latency_s)

    def transfer_group(
        self, group: FlowGroup, bytes_per_flow: float, latency_s: float
    ) -> simpy.Event:
        """:meth:`transfer` for flows already routed by :meth:`group`."""
        if not (bytes_per_flow >= 0 and math.isfinite(bytes_per_flow)):
            raise SimulationError(f"bytes_per_flow must be finite and >= 0 (got {bytes_per_flow})")
        if not (latency_s >= 0 and math.isfinite(latency_s)):
            raise SimulationError(f"latency_s must be finite and >= 0 (got {latency_s})")
        self.transfers += 1
        done = self.env.event()
        if latency_s > 0:
            self.env.timeout(latency_s).callbacks.append(
                partial(self._on_arrival, group, float(bytes_per_flow), done)
            )
        else:
            self._join(group, float(bytes_per_flow), done)
        return done

    # -- fluid model ----------------------------------------------------------------------------

    def _on_arrival(self, group: FlowGroup, nbytes: float, done: simpy.Event, _ev: Any) -> None:
        self._join(group, nbytes, done)

    def _join(self, group: FlowGroup, nbytes: float, done: simpy.Event) -> None:
        if nbytes == 0 or group.n_flows == 0:
            self.entities_done += 1
            done.succeed()
            return
        self._pending.append((group, nbytes, done))
        self._request_solve()

    def _request_solve(self) -> None:
        if not self._solve_scheduled:
            self._solve_scheduled = True
            self.env.timeout(0).callbacks.append(self._on_solve)

    def _advance(self) -> None:
        """Drain remaining bytes at the current rates up to now."""
        now = float(self.env.now)
        dt = now - self._last_s
        self._last_s = now
        if dt <= 0 or not self._events:
            return
        self._remaining -= self._rate * dt
        np.maximum(self._remaining, 0.0, out=self._remaining)
        self.link_bytes += self._load_Bps * dt
        self.bytes_moved += float(self._rate @ self._n_flows) * dt

    def _on_solve(self, _ev: Any) -> None:
        self._solve_scheduled = False
        self._advance()
        if self._pending:
            self._merge_pending()
        self._solve()

    def _merge_pending(self) -> None:
        pending, self._pending = self._pending, []
        groups = [g for g, _, _ in pending]
        self._events.extend(done for _, _, done in pending)
        self._nnz = np.concatenate([self._nnz, [g.links.size for g in groups]]).astype(np.int64)
        self._links = np.concatenate([self._links, *(g.links for g in groups)])
        self._counts = np.concatenate([self._counts, *(g.counts for g in groups)])
        self._n_flows = np.concatenate([self._n_flows, [float(g.n_flows) for g in groups]])
        nbytes = np.asarray([b for _, b, _ in pending], dtype=np.float64)
        self._total = np.concatenate([self._total, nbytes])
        self._remaining = np.concatenate([self._remaining, nbytes])
        self._rate = np.concatenate([self._rate, np.zeros(len(pending))])

    def _solve(self) -> None:
        self._generation += 1
        n = len(self._events)
        if n == 0:
            self._load_Bps[:] = 0.0
            return
        n_links = self.topology.n_links
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self._nnz, out=indptr[1:])
        incidence = sp.csc_matrix((self._counts, self._links, indptr), shape=(n_links, n))
        rate = maxmin_rates(incidence, self.topology.capacity_Bps)
        self.solves += 1
        if not (rate.min() > 0 and np.isfinite(rate).all()):
            bad = int(np.argmin(rate)) if rate.min() <= 0 else int(np.argmax(~np.isfinite(rate)))
            raise SimulationError(
                f"transfer over links {self._links_of(bad)} got rate {rate[bad]}: "
                "a link on its route has no capacity"
            )
        self._rate = rate
        self._load_Bps = np.asarray(incidence @ rate, dtype=np.float64)
        delay = max(float((self._remaining / rate).min()), 0.0)
        self.env.timeout(delay).callbacks.append(partial(self._on_wake, self._generation))

    def _on_wake(self, generation: int, _ev: Any) -> None:
        if generation != self._generation:
            return  # superseded by a later solve
        self._advance()
        remaining, rate = self._remaining, self._rate
        time_left = remaining / rate
        # Completions predicted for now may be a few ulps of `now` away.
        tol_s = 64 * float(np.spacing(max(float(self.env.now), 1e-300)))
        done = (remaining <= self.rel_eps * self._total) | (time_left <= tol_s)
        if not done.any():
            done[int(np.argmin(time_left))] = True
        self._finish(done)
        self._request_solve()

    def _finish(self, done: NDArray[np.bool_]) -> None:
        keep = ~done
        events = self._events
        for i in np.flatnonzero(done):
            events[i].succeed()
        self.entities_done += int(done.sum())
        self._events = [ev for ev, k in zip(events, keep, strict=True) if k]
        self._links = self._links[np.repeat(keep, self._nnz)]
        self._counts = self._counts[np.repeat(keep, self._nnz)]
        self._nnz = self._nnz[keep]
        self._n_flows = self._n_flows[keep]
        self._total = self._total[keep]
        self._remaining = self._remaining[keep]
        self._rate = self._rate[keep]

    def _links_of(self, entity: int) -> list[str]:
        start = int(self._nnz[:entity].sum())
        links = self._links[start : start + int(self._nnz[entity])]
        return [str(self.topology.names[link]) for link in links]
