"""Solving the flow model: batched solves, predicted completions and reroutes (a mixin of
:class:`~.flownetwork.FlowNetwork`).

Changes of one instant mark their components dirty and ask for one solve
(:meth:`Solving._on_solve`), which re-solves each dirty component (memoised by its
groups) and schedules one wake-up for the earliest predicted completion; entities on
links that went down are moved onto new routes first.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy
from numpy.typing import NDArray

from clustersim.errors import PartitionError
from clustersim.network.fabric import Topology
from clustersim.network.flows.entity import Component, Entity, FlowGroup, LinkIds
from clustersim.network.flows.flows_hbm import HbmFlows
from clustersim.network.flows.linkstats import LinkStats
from clustersim.network.flows.live import LiveGroups
from clustersim.network.flows.solve import Scratch, Solved, solve_groups

__all__ = ["Solving"]


class Solving(HbmFlows):
    """The solving half of :class:`~.flownetwork.FlowNetwork` (its base class: the flow
    network sets the attributes declared here)."""

    rel_eps: float
    max_memo_links: int
    max_memo_entries: int
    topology: Topology
    stats: LinkStats
    bytes_moved: float
    entities_done: int
    solves: int
    reroutes: int
    _live: LiveGroups
    _dirty: dict[int, None]
    _memo: dict[tuple[FlowGroup, ...], Solved]
    _memo_links: int
    _dead: dict[FlowGroup, bool]
    _heap: list[tuple[float, int, int, Entity]]
    _pushes: int
    _generation: int
    _wake_s: float
    _solve_scheduled: bool
    _scratch: Scratch

    if TYPE_CHECKING:

        def group(self, pairs: Sequence[tuple[int, int]] | NDArray[np.int64]) -> FlowGroup: ...
        def _finished(self, event: simpy.Event, rest: Any) -> None: ...

    # -- solving --------------------------------------------------------------------------------

    def _on_solve(self, _ev: Any) -> None:
        self._solve_scheduled = False
        now = float(self.env.now)
        self.stats.advance_to(now)
        if self._heated:
            self._heated = False
            self._rejoin_hot(now)
        if self._pending:
            pending, self._pending = self._pending, []
            for ent in pending:
                self._attach(ent, now)
        if self._regroups:
            self._regroup_now(now)
        if self.topology.links_down and self._comps:
            self._reroute(now)
        if self._dirty:
            dirty, self._dirty = self._dirty, {}
            for ident in dirty:
                self._solve_component(self._comps[ident], now)
            self.solves += 1
        self._schedule_wake(now)

    def _solve_component(self, comp: Component, now: float) -> None:
        ents = comp.entities
        key = tuple(e.group for e in ents)
        memo = self._memo
        solved = memo.pop(key, None)  # put back last: the dict runs from least recently used
        if solved is None:
            solved = self._solve_groups(key)
            self._memo_links += solved[1].size
            while memo and (
                self._memo_links > self.max_memo_links or len(memo) >= self.max_memo_entries
            ):
                self._memo_links -= memo.pop(next(iter(memo)))[1].size
        memo[key] = solved
        rates, pattern = solved
        self.stats.hold(comp.ident, now, pattern)
        heap = self._heap
        for ent, rate in zip(ents, rates.tolist(), strict=True):
            if rate == ent.rate and ent.stamp and rate > 0:
                continue  # its predicted finish still holds
            self._drain(ent, now)
            ent.rate = rate
            ent.stamp += 1
            if rate > 0:  # rate 0 is a stall, until capacities change again
                self._pushes += 1
                heapq.heappush(heap, (now + ent.remaining / rate, self._pushes, ent.stamp, ent))

    def _solve_groups(self, groups: tuple[FlowGroup, ...]) -> Solved:
        """Max-min rates of entities routed as ``groups``, with their links' loads."""
        cap, base = self._cap(), self.hbm.base if self.hbm is not None else None
        return solve_groups(groups, cap, base, self._names, self._scratch, common=self._live.common)

    def _schedule_wake(self, now: float) -> None:
        """One wake-up, for the earliest predicted completion."""
        heap = self._heap
        while heap and heap[0][2] != heap[0][3].stamp:
            heapq.heappop(heap)
        if not heap or heap[0][0] == self._wake_s:
            return  # nothing moving, or the pending wake-up is for that very time
        self._wake_s = heap[0][0]
        self._generation += 1
        self.env.timeout(max(self._wake_s - now, 0.0)).callbacks.append(
            partial(self._on_wake, self._generation)
        )

    def _on_wake(self, generation: int, _ev: Any) -> None:
        if generation != self._generation:
            return  # superseded by a later solve
        self._wake_s = math.inf
        now = float(self.env.now)
        # Completions predicted for now may be a few ulps of `now` away.
        tol_s = 64 * math.ulp(max(now, 1e-300))  # np.spacing's, without a numpy call
        heap = self._heap
        done: list[Entity] = []
        while heap:
            finish, _, stamp, ent = heap[0]
            if stamp != ent.stamp:
                heapq.heappop(heap)
                continue
            left = finish - now
            if left <= tol_s or left * ent.rate <= self.rel_eps * ent.total:
                heapq.heappop(heap)
                done.append(ent)
            elif not done:  # the one this wake-up was for, a rounding error early
                done.append(heapq.heappop(heap)[3])
            else:
                break
        if not done:
            return
        self.stats.advance_to(now)
        done.sort(key=lambda e: e.seq)
        for ent in done:
            self.bytes_moved += ent.remaining * ent.group.n_flows
            ent.remaining = 0.0
            self._detach(ent, now)
            self._left(ent)
            self.entities_done += 1
            self._finished(ent.event, ent.rest)
        if self._dirty or self._pending or self.topology.links_down:
            self._request_solve()
        else:  # the components they left are gone: nothing to re-solve, only the next wake-up
            self._schedule_wake(now)

    # -- link failures --------------------------------------------------------------------------

    def _reroute(self, now: float) -> None:
        """Move entities off links that are down; fail those with no route left."""
        cap, known = self._cap(), self._dead
        dead = []
        for comp in self._comps.values():
            for e in comp.entities:
                found = known.get(e.group)
                if found is None:
                    found = known[e.group] = bool((cap[e.group.links] <= 0).any())
                if found:
                    dead.append(e)
        for ent in sorted(dead, key=lambda e: e.seq):
            routed = ent.group.pairs
            pairs = routed() if callable(routed) else routed
            self._drain(ent, now)
            self._detach(ent, now)
            self._left(ent)
            try:
                if len(pairs) == 0:
                    raise PartitionError(
                        f"a transfer over links {self._names(ent.group.links)} lost a link and "
                        "was created without its pairs, so it cannot be rerouted"
                    )
                ent.full = replace(self.group(pairs), rate_cap_Bps=ent.full.rate_cap_Bps)
            except PartitionError as exc:
                ent.event.fail(exc)
                continue
            ent.group = ent.full
            if self.hbm is not None:
                self._hbm_enter(ent)
            ent.rate = 0.0
            self._attach(ent, now)
            self.reroutes += 1

    def _names(self, links: LinkIds) -> list[str]:
        topo = self.topology
        return [
            topo.link_name(int(link))
            if link < topo.n_links
            else f"hbm of chip {link - topo.n_links}"
            for link in links
        ]
