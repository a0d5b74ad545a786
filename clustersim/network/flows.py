"""A fluid flow model of the network on a SimPy environment.

A *transfer* is one entity: a group of flows (chip to chip) that start
together, move the same number of bytes at one common rate, and finish
together, like the flows of one step of a collective. After its latency the
entity joins the fluid model. Rates are the max-min fair allocation over all
active entities (:mod:`clustersim.network.maxmin`), recomputed whenever an
entity joins or leaves or a link's capacity changes; between changes,
remaining bytes drain linearly. The solve runs over the links that active
entities cross only, so its cost does not grow with the size of the cluster.

Joins and departures at one simulated instant are batched: the first change
schedules a solve at the same time (a zero-delay timeout), and every change
made before it runs joins the same solve. After each solve one wake-up is
scheduled for the next completion; a generation counter makes older wake-ups
no-ops, since SimPy timeouts cannot be cancelled. A wake-up finishes every
entity whose remaining bytes are within a relative epsilon of zero, so
simultaneous completions cost one solve.

**Link state.** The network listens to its topology: when a lane or a link
fails or recovers, :meth:`FlowNetwork.capacity_changed` drains the entities at
their old rates up to that instant and re-solves at it, so in-flight transfers
pick up the new capacities (a lost lane slows exactly the flows crossing its
link). Entities whose route crosses a link that is down are rerouted over the
links still up; if a pair has no route left, the entity's event fails with
:class:`~clustersim.errors.PartitionError`.

**Observability.** :class:`~clustersim.network.linkstats.LinkStats` accumulates
per-link bytes, time-weighted and peak utilisation and a binned time series,
touching only the loaded links; :meth:`FlowNetwork.link_utilisation` returns them
as numpy arrays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import simpy
from numpy.typing import NDArray

from clustersim.errors import PartitionError, SimulationError
from clustersim.network.linkstats import LinkStats, LinkUtilisation
from clustersim.network.maxmin import maxmin_rates_csc
from clustersim.network.topology import Topology

__all__ = ["FlowGroup", "FlowNetwork", "LinkUtilisation"]

Pairs = tuple[tuple[int, int], ...]


@dataclass(frozen=True, eq=False)
class FlowGroup:
    """The routed flows of one entity: its column of the incidence matrix.

    ``links`` are distinct link indices and ``counts`` how many of the group's
    flows cross each; ``latency_s`` is the longest route latency of its flows.
    ``pairs`` are the chip pairs it was routed from (to reroute it after a failure):
    a tuple, or for the many flows of a folded step a function that builds them
    as an ``n x 2`` array (a group stays small however many replicas it stands for).
    """

    links: NDArray[np.int64]
    counts: NDArray[np.float64]
    n_flows: int
    latency_s: float
    pairs: Pairs | Callable[[], NDArray[np.int64]] = ()


class FlowNetwork:
    """Active transfers sharing the links of a :class:`Topology` by max-min fairness.

    ``series_bins`` bounds the time bins of the utilisation series.
    """

    rel_eps: float = 1e-9
    """An entity is done when its remaining bytes are below this fraction of its bytes."""

    max_cached_pairs: int = 1 << 20
    """The group cache is cleared when its keys hold more pairs than this (memory bound)."""

    def __init__(
        self, env: simpy.Environment, topology: Topology, *, series_bins: int = 64
    ) -> None:
        self.env = env
        self.topology = topology
        n_links = topology.n_links
        self.stats = LinkStats(n_links, start_s=float(env.now), max_bins=series_bins)
        self.bytes_moved = 0.0
        """Flow-bytes delivered so far: the sum over flows of bytes moved."""
        self.transfers = 0
        self.entities_done = 0
        self.solves = 0
        self.reroutes = 0
        """Entities moved onto new routes after a link went down."""
        self._groups: dict[Pairs, FlowGroup] = {}
        self._groups_version = topology.version
        self._cached_pairs = 0
        # Active entities, in join order; the incidence matrix in compressed-column form.
        self._events: list[simpy.Event] = []
        self._active: list[FlowGroup] = []
        self._nnz = np.zeros(0, dtype=np.int64)
        self._links = np.zeros(0, dtype=np.int64)
        self._counts = np.zeros(0, dtype=np.float64)
        self._n_flows = np.zeros(0, dtype=np.float64)
        self._total = np.zeros(0, dtype=np.float64)
        self._remaining = np.zeros(0, dtype=np.float64)
        self._rate = np.zeros(0, dtype=np.float64)
        self._load_Bps = np.zeros(n_links)
        self._occupancy = np.zeros(n_links, dtype=np.int64)
        """Active entities crossing each link: a link is shared when this exceeds 1."""
        self._loaded = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[FlowGroup, float, simpy.Event]] = []
        self._last_s = float(env.now)
        self._generation = 0
        self._solve_scheduled = False
        topology.add_listener(self.capacity_changed)

    # -- public API -----------------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Entities moving bytes now (not counting those in their latency phase)."""
        return len(self._events) + len(self._pending)

    @property
    def load_Bps(self) -> NDArray[np.float64]:
        """Current load of each link, from the last solve. Do not modify."""
        return self._load_Bps

    @property
    def link_bytes(self) -> NDArray[np.float64]:
        """Bytes carried so far by each link (up to the last change of rates)."""
        return self.stats.bytes

    def link_utilisation(self, top: int = 8) -> LinkUtilisation:
        """Per-link bytes, mean and peak utilisation up to now, and the series of the
        ``top`` most-loaded links (see :class:`~.linkstats.LinkUtilisation`)."""
        self._advance()
        topo = self.topology
        return self.stats.summary(topo.names, topo.kinds, topo.capacity_Bps, top)

    def group(self, pairs: Sequence[tuple[int, int]] | NDArray[np.int64]) -> FlowGroup:
        """Route ``(src_chip, dst_chip)`` pairs into a :class:`FlowGroup` (cached).

        Raises :class:`~clustersim.errors.PartitionError` when a pair has no route.
        """
        topo = self.topology
        if self._groups_version != topo.version or self._cached_pairs > self.max_cached_pairs:
            self._groups.clear()
            self._groups_version = topo.version
            self._cached_pairs = 0
        if isinstance(pairs, np.ndarray):
            pairs = tuple(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), strict=True))
        key = pairs if isinstance(pairs, tuple) else tuple(pairs)
        found = self._groups.get(key)
        if found is not None:
            return found
        flat, latency = topo.routes(key)
        links, counts = np.unique(flat, return_counts=True)
        latency_s = float(latency.max()) if latency.size else 0.0
        found = FlowGroup(
            links.astype(np.int64), counts.astype(np.float64), len(key), latency_s, key
        )
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

    def capacity_changed(self) -> None:
        """Link capacities changed: drain at the old rates up to now, re-solve at this instant.

        The topology calls this on every change of links or lanes; call it yourself
        after changing capacities some other way.
        """
        if self.topology.n_links != self.stats.n_links:
            self._resize()
        self._advance()
        if self._events or self._pending:
            self._request_solve()

    # -- fluid model ----------------------------------------------------------------------------

    def _resize(self) -> None:
        """The topology gained links: grow the per-link arrays (statistics start over)."""
        n = self.topology.n_links
        load = np.zeros(n)
        load[: self._load_Bps.size] = self._load_Bps
        self._load_Bps = load
        occupancy = np.zeros(n, dtype=np.int64)
        occupancy[: self._occupancy.size] = self._occupancy
        self._occupancy = occupancy
        old, self.stats = self.stats, LinkStats(n, start_s=float(self.env.now))
        self.stats.bytes[: old.n_links] = old.bytes

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
        if dt <= 0:
            return
        self.stats.advance(self._last_s, now)
        self._last_s = now
        if not self._events:
            return
        self._remaining -= self._rate * dt
        np.maximum(self._remaining, 0.0, out=self._remaining)
        self.bytes_moved += float(self._rate @ self._n_flows) * dt

    def _on_solve(self, _ev: Any) -> None:
        self._solve_scheduled = False
        self._advance()
        if self._pending:
            self._merge_pending()
        if self.topology.links_down and self._events:
            self._reroute()
        self._solve()

    def _merge_pending(self) -> None:
        pending, self._pending = self._pending, []
        groups = [g for g, _, _ in pending]
        self._events.extend(done for _, _, done in pending)
        self._active.extend(groups)
        self._nnz = np.concatenate([self._nnz, [g.links.size for g in groups]]).astype(np.int64)
        np.add.at(self._occupancy, np.concatenate([g.links for g in groups]), 1)
        self._links = np.concatenate([self._links, *(g.links for g in groups)])
        self._counts = np.concatenate([self._counts, *(g.counts for g in groups)])
        self._n_flows = np.concatenate([self._n_flows, [float(g.n_flows) for g in groups]])
        nbytes = np.asarray([b for _, b, _ in pending], dtype=np.float64)
        self._total = np.concatenate([self._total, nbytes])
        self._remaining = np.concatenate([self._remaining, nbytes])
        self._rate = np.concatenate([self._rate, np.zeros(len(pending))])

    def _reroute(self) -> None:
        """Move entities off links that are down; fail those with no route left."""
        dead_nnz = self.topology.capacity_Bps[self._links] <= 0
        if not dead_nnz.any():
            return
        entity = np.repeat(np.arange(len(self._events)), self._nnz)
        dead = np.unique(entity[dead_nnz]).tolist()
        failed = np.zeros(len(self._events), dtype=bool)
        errors: dict[int, Exception] = {}
        new: dict[int, FlowGroup] = {}
        for e in dead:
            pairs = self._active[e].pairs
            if callable(pairs):
                pairs = pairs()
            try:
                if len(pairs) == 0:
                    raise PartitionError(
                        f"a transfer over links {self._links_of(e)} lost a link and was "
                        "created without its pairs, so it cannot be rerouted"
                    )
                new[e] = self.group(pairs)
            except PartitionError as exc:
                failed[e] = True
                errors[e] = exc
        self.reroutes += len(new)
        bounds = np.cumsum(self._nnz)[:-1]
        links = np.split(self._links, bounds)
        counts = np.split(self._counts, bounds)
        for e, group in new.items():
            self._active[e] = group
            links[e], counts[e] = group.links, group.counts
        self._nnz = np.asarray([x.size for x in links], dtype=np.int64)
        self._links = np.concatenate(links)
        self._counts = np.concatenate(counts)
        self._occupancy[:] = 0
        np.add.at(self._occupancy, self._links, 1)
        if failed.any():
            self._drop(failed, errors)

    def _solve(self) -> None:
        self._generation += 1
        n = len(self._events)
        if n == 0:
            self._set_loads(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))
            return
        rate, loaded, load, capacity = self._rates(n)
        self.solves += 1
        # Rate 0 is a stall: a link on the route has failed and routing has not
        # noticed yet (capacity factor 0, see LinkTable.set_capacity_factor).
        if not (rate.min() >= 0 and np.isfinite(rate).all()):
            bad = int(np.argmin(rate)) if rate.min() < 0 else int(np.argmax(~np.isfinite(rate)))
            raise SimulationError(
                f"transfer over links {self._links_of(bad)} got rate {rate[bad]}: "
                "a link on its route has no capacity"
            )
        self._rate = rate
        self._set_loads(loaded, load, capacity)
        moving = rate > 0
        remaining = self._remaining
        if not moving.all():
            if not moving.any():
                return  # all stalled: the next change of capacities re-solves
            remaining, rate = remaining[moving], rate[moving]  # for the wake-up time only
        delay = max(float((remaining / rate).min()), 0.0)
        self.env.timeout(delay).callbacks.append(partial(self._on_wake, self._generation))

    def _rates(
        self, n: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
        """Max-min rates of the ``n`` active entities, and the loaded links with their
        loads and capacities.

        An entity that shares none of its links with another runs at the rate of
        its own tightest link, whatever the others do; only the entities that share
        links go through progressive filling, over their links alone. In a folded
        run most solves share no link at all (stages and groups on disjoint links).
        """
        links, counts, nnz = self._links, self._counts, self._nnz
        ent_of_nz = np.repeat(np.arange(n, dtype=np.int64), nnz)
        cap_nz = self.topology.capacity_Bps[links]
        sharing = np.zeros(n, dtype=bool)
        shared_nz = self._occupancy[links] > 1
        if not nnz.all():
            sharing[:] = True  # an entity without links: let the solver report it
        elif shared_nz.any():
            sharing[ent_of_nz[shared_nz]] = True
        starts = np.zeros(n, dtype=np.int64)
        np.cumsum(nnz[:-1], out=starts[1:])
        rate: NDArray[np.float64] = (
            np.full(n, np.inf) if sharing.all() else np.minimum.reduceat(cap_nz / counts, starts)
        )
        if not sharing.any():
            return rate, links, counts * rate[ent_of_nz], cap_nz
        on_sharing = sharing[ent_of_nz]
        loaded, rows = np.unique(links[on_sharing], return_inverse=True)
        rows = rows.ravel()
        capacity = self.topology.capacity_Bps[loaded]
        indptr = np.zeros(int(sharing.sum()) + 1, dtype=np.int64)
        np.cumsum(nnz[sharing], out=indptr[1:])
        rate[sharing] = maxmin_rates_csc(indptr, rows, counts[on_sharing], capacity)
        load_nz = counts * rate[ent_of_nz]
        shared_load = np.bincount(rows, weights=load_nz[on_sharing], minlength=loaded.size)
        lone = ~on_sharing
        return (
            rate,
            np.concatenate([links[lone], loaded]),
            np.concatenate([load_nz[lone], shared_load]),
            np.concatenate([cap_nz[lone], capacity]),
        )

    def _set_loads(
        self, links: NDArray[np.int64], load: NDArray[np.float64], capacity: NDArray[np.float64]
    ) -> None:
        self._load_Bps[self._loaded] = 0.0
        self._load_Bps[links] = load
        self._loaded = links
        self.stats.set_loads(links, load, capacity)

    def _on_wake(self, generation: int, _ev: Any) -> None:
        if generation != self._generation:
            return  # superseded by a later solve
        self._advance()
        remaining, rate = self._remaining, self._rate
        time_left = np.divide(remaining, rate, out=np.full_like(remaining, np.inf), where=rate > 0)
        # Completions predicted for now may be a few ulps of `now` away.
        tol_s = 64 * float(np.spacing(max(float(self.env.now), 1e-300)))
        done = (remaining <= self.rel_eps * self._total) | (time_left <= tol_s)
        if not done.any():
            done[int(np.argmin(time_left))] = True
        self._drop(done)
        self._request_solve()

    def _drop(self, done: NDArray[np.bool_], errors: dict[int, Exception] | None = None) -> None:
        """Remove entities: their events succeed, or fail with ``errors[i]``."""
        keep = ~done
        events = self._events
        for i in np.flatnonzero(done).tolist():
            if errors and i in errors:
                events[i].fail(errors[i])
            else:
                events[i].succeed()
                self.entities_done += 1
        self._events = [ev for ev, k in zip(events, keep, strict=True) if k]
        self._active = [g for g, k in zip(self._active, keep, strict=True) if k]
        per_nnz = np.repeat(keep, self._nnz)
        np.subtract.at(self._occupancy, self._links[~per_nnz], 1)
        self._links = self._links[per_nnz]
        self._counts = self._counts[per_nnz]
        self._nnz = self._nnz[keep]
        self._n_flows = self._n_flows[keep]
        self._total = self._total[keep]
        self._remaining = self._remaining[keep]
        self._rate = self._rate[keep]

    def _links_of(self, entity: int) -> list[str]:
        start = int(self._nnz[:entity].sum())
        links = self._links[start : start + int(self._nnz[entity])]
        return [self.topology.link_name(int(link)) for link in links]
