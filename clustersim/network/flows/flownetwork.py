"""A fluid flow model of the network on a SimPy environment.

A *transfer* is one entity: a group of flows (chip to chip) that start
together, move the same number of bytes at one common rate, and finish
together, like the flows of one step of a collective. After its latency the
entity joins the fluid model. Rates are the max-min fair allocation over the
active entities (:mod:`clustersim.network.flows.maxmin`); between changes, remaining
bytes drain linearly.

**Components.** Entities that share a link, directly or through others, form a
*component*; max-min rates in one component do not depend on any other. Every
loaded link belongs to exactly one component. When an entity joins, the
components its links touch merge with it; when one leaves, only its component
is re-solved; the components a join touches are found through the groups in
flight, which know whether they share a link (:mod:`.live`), not by marking its
links. So a change costs work in proportion to the component it touches, not to
everything in flight: in a folded run most entities are alone on their links
(stages and groups on disjoint links), and their rate is that of their tightest
link. A component is not split when an entity leaves (solving two independent
parts together gives the same rates). Solves of a component are remembered by
the groups in it, so a repeated pattern of transfers (the same collective in
every microbatch) costs a dictionary lookup; repeats of one group in a component
are one column of the solve (:mod:`.solve`), which runs over the links the
groups share and each group's tightest class of private links (:mod:`.classes`).

Joins and departures at one simulated instant are batched: the first change
schedules a solve at the same time (a zero-delay timeout), and every change
made before it runs joins the same solve. Each entity has a predicted finish
time on a heap; after each solve one wake-up is scheduled for the earliest, and
a generation counter makes older wake-ups no-ops, since SimPy timeouts cannot
be cancelled. A wake-up finishes every entity whose remaining bytes are within a
relative epsilon of zero, so simultaneous completions cost one solve.

**Link state.** When a lane or link fails or recovers,
:meth:`FlowNetwork.capacity_changed` re-solves every component at that instant;
entities crossing a link that is down are rerouted, or fail with
:class:`~clustersim.errors.PartitionError` when no route is left.

**Shared HBM.** With :meth:`FlowNetwork.share_hbm`, each chip's HBM is one more
capacity in the solve (indices after the topology's links): a flow between two
chips reads the source's HBM and writes the destination's, and a compute run of
a rank is an entity on its chip's HBM capped at its demand (``rate_cap_Bps``), so
collectives and compute share HBM max-min. A chip's row joins the solve only
while its users could oversubscribe it (slack HBM: :mod:`.flows_hbm`): a flow is
solved without the rows of chips whose HBM has room for everything on it, and
when a chip turns hot the entities on it move to the variant with its row at that
instant. A listener hears of every chip that turns hot (and cools), so compute
leaves its fast path only then.

**Observability.** :class:`~.linkstats.LinkStats`: per-link bytes, utilisation, series.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import simpy
from numpy.typing import NDArray

from clustersim.errors import SimulationError
from clustersim.network.fabric import Topology
from clustersim.network.flows.entity import Component, Entity, FlowGroup, link_counts
from clustersim.network.flows.hbm import SharedHbm
from clustersim.network.flows.linkstats import LinkStats, LinkUtilisation
from clustersim.network.flows.live import LiveGroups
from clustersim.network.flows.routecache import RouteCache
from clustersim.network.flows.solve import Scratch, Solved
from clustersim.network.flows.solving import Solving

__all__ = ["FlowGroup", "FlowNetwork", "LinkUtilisation", "link_counts"]


Chain = tuple[Sequence[tuple[FlowGroup, float, float]], int] | None
"""The steps of a chain still to run after a transfer (:meth:`FlowNetwork.transfer_chain`)."""


class FlowNetwork(Solving):
    """Active transfers sharing the links of a :class:`Topology` by max-min fairness.

    ``series_bins`` bounds the time bins of the utilisation series.
    """

    rel_eps: float = 1e-9
    """An entity is done when its remaining bytes are below this fraction of its bytes."""

    max_memo_links: int = 1 << 23
    """The solve memo forgets its least recently used solutions while they hold more links
    of their own than this (the links several of a solution's groups share, 16 bytes
    each; the groups themselves belong to the routing caches)."""

    max_memo_entries: int = 1 << 15
    """... or while it holds more solutions than this."""

    def __init__(
        self,
        env: simpy.Environment,
        topology: Topology,
        *,
        series_bins: int = 64,
        hbm_Bps: float | NDArray[np.float64] | None = None,
    ) -> None:
        self.env = env
        self.topology = topology
        n_links = topology.n_links
        self.bytes_moved = 0.0
        """Flow-bytes delivered so far: the sum over flows of bytes moved."""
        self.transfers = 0
        self.entities_done = 0
        self.solves = 0
        """Instants at which rates were solved (one per batch of changes)."""
        self.reroutes = 0
        """Entities moved onto new routes after a link went down."""
        self._routes = RouteCache(topology)
        """The groups routed so far (:mod:`.routecache`)."""
        self._pending: list[Entity] = []
        self._created = 0
        self._n_active = 0
        self._scratch = Scratch()
        self._live = LiveGroups(n_links, self._scratch.slots)
        """The groups in components, and which of them share links (:mod:`.live`)."""
        self._comps: dict[int, Component] = {}
        self._next_comp = 0
        self._dirty: dict[int, None] = {}
        """Components to re-solve at the next solve (an ordered set)."""
        self._memo: dict[tuple[FlowGroup, ...], Solved] = {}
        self._memo_links = 0
        self._dead: dict[FlowGroup, bool] = {}
        """Whether a group crosses a link of zero capacity (cached until capacities change)."""
        self._heap: list[tuple[float, int, int, Entity]] = []
        """(finish time, sequence, stamp, entity): predicted completions."""
        self._pushes = 0
        self._generation = 0
        self._wake_s = math.inf
        self._solve_scheduled = False
        self.hbm: SharedHbm | None = None
        """Each chip's HBM as a capacity of the solve (:meth:`share_hbm`); None: not shared."""
        self.hbm_listener: Callable[[NDArray[np.int64], bool], None] | None = None
        self._hbm_uses = {}
        self._heated = False  # chips turned hot since the last solve
        self._regroups: list[tuple[Entity, FlowGroup]] = []
        """Called with the chips whose HBM a flow starts to load (before it is solved)."""
        self._capacity: NDArray[np.float64] | None = None
        if hbm_Bps is not None:  # see share_hbm
            self.share_hbm(hbm_Bps)
            self._cap()  # the links' capacities and the HBM's, held once with the topology's
        self.stats = LinkStats(
            n_links,
            start_s=float(env.now),
            max_bins=series_bins,
            capacity_Bps=topology.capacity_Bps,
        )
        topology.add_listener(self.capacity_changed)

    # -- public API -----------------------------------------------------------------------------

    def share_hbm(self, hbm_Bps: float | NDArray[np.float64]) -> None:
        """Make each chip's HBM (``hbm_Bps``: one figure, or one per chip) a capacity that
        the flows starting or ending on the chip and its compute runs share."""
        hbm = self.hbm = SharedHbm(self.topology.n_links, hbm_Bps, self.topology.n_chips)
        n_chips = hbm.capacity.size
        self._live.resize(self.topology.n_links + n_chips)
        self._routes.clear()
        self._memo.clear()
        self._memo_links = 0
        self._capacity = None

    def slots(self, size: int) -> NDArray[np.int32]:
        """A scratch position per link and HBM row (at least ``size``; 32 bits), shared by
        the solves, the groups in flight and the caller: read only what was written since."""
        return self._scratch.slots(size)

    def compute_group(self, chip: int, demand_Bps: float) -> FlowGroup:
        """A compute run on ``chip``'s shared HBM, moving at most ``demand_Bps``."""
        if self.hbm is None:
            raise SimulationError("HBM is not shared: call share_hbm first")
        return self.hbm.compute_group(chip, demand_Bps)

    def _cap(self) -> NDArray[np.float64]:
        """Capacities of the topology's links, then of each chip's HBM if shared."""
        if self._capacity is None:
            hbm = self.hbm
            topo = self.topology
            # capacity_with joins the links' capacities with the HBM's, without a copy of
            # the links' first (10^7 of them at a million chips).
            self._capacity = topo.capacity_Bps if hbm is None else topo.capacity_with(hbm.capacity)
        return self._capacity

    @property
    def active(self) -> int:
        """Entities moving bytes now (not counting those in their latency phase)."""
        return self._n_active + len(self._pending)

    @property
    def load_Bps(self) -> NDArray[np.float64]:
        """Current load of each link, from the last solve (a new array, built on each call)."""
        return self.stats.load()

    @property
    def link_bytes(self) -> NDArray[np.float64]:
        """Bytes carried so far by each link. Do not modify."""
        self.stats.advance_to(float(self.env.now))
        self.stats.settle()
        return self.stats.bytes

    def link_utilisation(self, top: int = 8) -> LinkUtilisation:
        """Per-link bytes, mean and peak utilisation up to now, and the series of the
        ``top`` most-loaded links (see :class:`~.linkstats.LinkUtilisation`)."""
        self.stats.advance_to(float(self.env.now))
        topo = self.topology
        return self.stats.summary(topo.names, topo.kinds, topo.capacity_Bps, top)

    def group(self, pairs: Sequence[tuple[int, int]] | NDArray[np.int64]) -> FlowGroup:
        """Route ``(src_chip, dst_chip)`` pairs into a :class:`FlowGroup` (cached:
        :mod:`.routecache`).

        Raises :class:`~clustersim.errors.PartitionError` when a pair has no route.
        """
        return self._routes.group(pairs, self.hbm)

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
        done = self.env.event()
        self._start(group, float(bytes_per_flow), latency_s, done, None)
        return done

    def transfer_chain(self, steps: Sequence[tuple[FlowGroup, float, float]]) -> simpy.Event:
        """``(group, bytes_per_flow, latency_s)`` transfers one after another, each started
        when the one before has arrived (the steps of a collective); an event for the end.

        The same as a process yielding :meth:`transfer_group` for each, without a SimPy
        event and a process resume per step.
        """
        done = self.env.event()
        if not steps:
            done.succeed()
        else:
            self._next(steps, 0, done)
        return done

    def _next(
        self, steps: Sequence[tuple[FlowGroup, float, float]], k: int, done: simpy.Event
    ) -> None:
        group, nbytes, latency_s = steps[k]
        if not (nbytes >= 0 and math.isfinite(nbytes)):
            raise SimulationError(f"bytes_per_flow must be finite and >= 0 (got {nbytes})")
        if not (latency_s >= 0 and math.isfinite(latency_s)):
            raise SimulationError(f"latency_s must be finite and >= 0 (got {latency_s})")
        self._start(
            group, float(nbytes), latency_s, done, (steps, k + 1) if k + 1 < len(steps) else None
        )

    def _start(
        self, group: FlowGroup, nbytes: float, latency_s: float, done: simpy.Event, rest: Chain
    ) -> None:
        self.transfers += 1
        if latency_s > 0:
            self.env.timeout(latency_s).callbacks.append(
                partial(self._on_arrival, group, nbytes, done, rest)
            )
        else:
            self._join(group, nbytes, done, rest)

    def _finished(self, event: simpy.Event, rest: Chain) -> None:
        """A transfer is done: start the next of its chain, or succeed its event."""
        if rest is None:
            event.succeed()
        else:
            self._next(rest[0], rest[1], event)

    def capacity_changed(self) -> None:
        """Link capacities changed: re-solve every transfer in flight at this instant.

        The topology calls this on every change of links or lanes; call it yourself
        after changing capacities some other way.
        """
        if self.topology.n_links != self.stats.n_links:
            self._resize()
        self.stats.advance_to(float(self.env.now))
        self.stats.set_capacity(self.topology.capacity_Bps)
        self._scratch.classes.clear()
        self._memo.clear()
        self._memo_links = 0
        self._dead.clear()
        self._capacity = None
        self._hbm_capacity_changed()
        for ident in self._comps:
            self._dirty[ident] = None
        if self._comps or self._pending:
            self._request_solve()

    # -- joining and leaving --------------------------------------------------------------------

    def _resize(self) -> None:
        """The topology gained links: grow the per-link arrays."""
        if self.hbm is not None:
            raise SimulationError("the topology gained links while HBM is shared")
        n = self.topology.n_links
        self.stats.grow(n)
        self._live.resize(n)

    def _on_arrival(
        self, group: FlowGroup, nbytes: float, done: simpy.Event, rest: Chain, _ev: Any
    ) -> None:
        self._join(group, nbytes, done, rest, alone_now=True)

    def _join(
        self,
        group: FlowGroup,
        nbytes: float,
        done: simpy.Event,
        rest: Chain = None,
        *,
        alone_now: bool = False,
    ) -> Entity | None:
        """``alone_now``: solve it at once if it is alone on its links (an arrival after its
        latency); transfers started together with no latency join one solve."""
        if nbytes == 0 or group.n_flows == 0:
            self.entities_done += 1
            self._finished(done, rest)
            return None
        ent = Entity(group, nbytes, done, self._created, rest)
        self._created += 1
        if self.hbm is not None:
            self._hbm_enter(ent)  # the variant to solve: ent.group
        if (
            not alone_now
            or self._solve_scheduled
            or self._dirty
            or self.topology.links_down
            or self._live.touched(ent.group)
        ):
            self._pending.append(ent)
            self._request_solve()
            return ent
        # Alone on its links: its own component, whose rates nothing else changes, so it
        # is solved now rather than at a zero-delay solve (one SimPy event less).
        now = float(self.env.now)
        self.stats.advance_to(now)
        comp = Component(self._next_comp)
        self._next_comp += 1
        self._comps[comp.ident] = comp
        self._live.add(ent.group, comp)
        comp.entities.append(ent)
        ent.comp, ent.t_s = comp, now
        self._n_active += 1
        self._solve_component(comp, now)
        self.solves += 1
        self._schedule_wake(now)
        return ent

    def _request_solve(self) -> None:
        if not self._solve_scheduled:
            self._solve_scheduled = True
            self.env.timeout(0).callbacks.append(self._on_solve)

    def _attach(self, ent: Entity, now: float) -> None:
        """Add ``ent`` to the component of the links it shares, merging those it bridges."""
        ent.t_s = now
        live = self._live
        comps = live.touched(ent.group)
        comp: Component
        if comps:
            comp = comps[0] if len(comps) == 1 else max(comps, key=lambda c: len(c.entities))
            for other in comps:
                if other is comp:
                    continue
                for e in other.entities:
                    e.comp = comp
                    live.move(e.group, comp)
                comp.entities.extend(other.entities)
                del self._comps[other.ident]
                self._dirty.pop(other.ident, None)
                self.stats.hold(other.ident, now, None)
        else:
            comp = Component(self._next_comp)
            self._next_comp += 1
            self._comps[comp.ident] = comp
        live.add(ent.group, comp)
        comp.entities.append(ent)
        ent.comp = comp
        self._dirty[comp.ident] = None
        self._n_active += 1

    def _detach(self, ent: Entity, now: float) -> None:
        """Take ``ent`` out of its component; links it leaves idle carry nothing from now on."""
        self._live.remove(ent.group)
        comp = ent.comp
        assert comp is not None
        comp.entities.remove(ent)
        ent.comp = None
        ent.stamp += 1
        if comp.entities:
            self._dirty[comp.ident] = None
        else:
            del self._comps[comp.ident]
            self._dirty.pop(comp.ident, None)
            self.stats.hold(comp.ident, now, None)
        self._n_active -= 1

    def _drain(self, ent: Entity, now: float) -> None:
        """Bring ``ent``'s remaining bytes to ``now`` at its current rate."""
        moved = min(ent.rate * (now - ent.t_s), ent.remaining)
        if moved > 0:
            ent.remaining -= moved
            self.bytes_moved += moved * ent.group.n_flows
        ent.t_s = now
