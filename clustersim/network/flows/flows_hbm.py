"""Slack HBM in the flow model: which HBM rows an entity is solved with, and moving
entities between variants of their group (a mixin of :class:`~.flownetwork.FlowNetwork`).

A chip's HBM row joins the solve only while the chip is *hot*
(:mod:`clustersim.network.flows.hbm`): each entity keeps its ``full`` group and is solved
on the variant with the rows of its hot chips only (``lite``: none). When chips turn
hot, the entities on them move to the variant with their rows at the next solve of
that instant (drained at their old rate, detached, re-attached); compute runs, which
are only on their chip's HBM, always keep their row. :meth:`regroup` moves a compute
run's entity onto a new ceiling the same way (GPU collectives taking and giving back
SMs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import simpy
from numpy.typing import NDArray

from clustersim.network.flows.entity import Component, Entity, FlowGroup, HbmUse
from clustersim.network.flows.hbm import SharedHbm

__all__ = ["HbmFlows"]

FEW = 32
"""Entities on at most this many chips read their chips' hot flags one at a time
(cheaper than numpy's fancy indexing and reductions on a few elements)."""


class HbmFlows:
    """The shared-HBM half of :class:`~.flownetwork.FlowNetwork`."""

    max_hbm_uses: int = 1 << 16
    """The cache of groups' HBM loads is cleared when it holds this many."""

    env: simpy.Environment
    transfers: int
    hbm: SharedHbm | None
    hbm_listener: Callable[[NDArray[np.int64], bool], None] | None
    """Called with the chips that turn hot (True) and with those that cool (False)."""
    _hbm_uses: dict[FlowGroup, HbmUse]
    _heated: bool
    _regroups: list[tuple[Entity, FlowGroup]]
    _pending: list[Entity]
    _comps: dict[int, Component]

    if TYPE_CHECKING:

        def _join(self, group: FlowGroup, nbytes: float, done: simpy.Event) -> Entity | None: ...
        def _request_solve(self) -> None: ...
        def _cap(self) -> NDArray[np.float64]: ...
        def _drain(self, ent: Entity, now: float) -> None: ...
        def _detach(self, ent: Entity, now: float) -> None: ...
        def _attach(self, ent: Entity, now: float) -> None: ...

    def hbm_check(self, chip: int) -> None:
        """The fast compute demand on ``chip`` (not hot, with flows) grew: turn it hot if
        its users could now oversubscribe it (the listener hears of it now)."""
        assert self.hbm is not None
        if self.hbm.over(chip):
            self._heat(np.asarray([chip], dtype=np.int64))

    def compute_transfer(self, group: FlowGroup, nbytes: float) -> tuple[simpy.Event, object]:
        """A compute run's entity (:meth:`compute_group`) with ``nbytes`` left, now: its
        end event, and a handle for :meth:`regroup`."""
        done = self.env.event()
        self.transfers += 1
        return done, self._join(group, float(nbytes), done)

    def regroup(self, handle: object, group: FlowGroup) -> None:
        """Move the entity of ``handle`` (from :meth:`compute_transfer`) onto ``group``
        (a compute run's new ceiling) at this instant, with the bytes it has left."""
        if isinstance(handle, Entity):
            self._regroups.append((handle, group))
            self._request_solve()

    def _hbm_capacity_changed(self) -> None:
        """The slack bounds were taken on the old capacities: every row from now on."""
        hbm = self.hbm
        if hbm is not None and not hbm.strict:
            hbm.strict = True
            self._hbm_uses.clear()
            chips = np.asarray(hbm.with_flows(), dtype=np.int64)
            if chips.size:
                self._heat(chips)

    def _hbm_enter(self, ent: Entity) -> None:
        """Count ``ent`` on its chips' HBM and choose the variant of its group to solve."""
        hbm = self.hbm
        assert hbm is not None
        full = ent.full
        if not full.links.size or full.links[-1] < hbm.base:
            return
        use = self._hbm_uses.get(full)
        if use is None:
            if len(self._hbm_uses) >= self.max_hbm_uses:
                self._hbm_uses.clear()
            use = self._hbm_uses[full] = HbmUse(full, hbm.base, self._cap())
        ent.hbm = use
        turned = hbm.enter(use.chip_list, use.load_list, use.flow)
        if turned:
            self._heat(np.asarray(turned, dtype=np.int64))
        ent.group = self._variant(full, use)

    def _variant(self, full: FlowGroup, use: HbmUse) -> FlowGroup:
        """``full`` with the HBM rows of its hot chips only."""
        if use.lite is None:
            return full
        assert self.hbm is not None
        chips = use.chip_list
        if len(chips) <= FEW:
            hot_of = self.hbm.hot_of
            n_hot = 0
            for chip in chips:
                if hot_of[chip]:
                    n_hot += 1
            if not n_hot:
                return use.lite
            if n_hot == len(chips):
                return full
        hot = self.hbm.hot[use.chips]
        if not hot.any():
            return use.lite
        if hot.all():
            return full
        return use.partial_variant(full, hot)

    def _heat(self, chips: NDArray[np.int64]) -> None:
        """``chips`` turn hot: their rows join the solve at the next solve (this instant),
        and their compute runs hear of it."""
        assert self.hbm is not None
        self.hbm.heat(chips.tolist())
        self._heated = True
        self._request_solve()
        if self.hbm_listener is not None:
            self.hbm_listener(chips, True)

    def _rejoin_hot(self, now: float) -> None:
        """Move every entity whose variant lacks a hot chip's row onto the one with it."""
        moved = [e for e in self._pending if e.group is not e.full]
        moved += [e for c in self._comps.values() for e in c.entities if e.group is not e.full]
        for ent in moved:
            assert ent.hbm is not None
            group = self._variant(ent.full, ent.hbm)
            if group is ent.group:
                continue
            if ent.comp is None:  # pending: not on any link yet
                ent.group = group
                continue
            self._drain(ent, now)
            self._detach(ent, now)
            ent.group = group
            ent.rate = 0.0
            self._attach(ent, now)

    def _regroup_now(self, now: float) -> None:
        regroups, self._regroups = self._regroups, []
        for ent, group in regroups:
            if ent.hbm is None:
                continue  # done already (an entity on HBM leaves it when it ends)
            self._left(ent)
            attached = ent.comp is not None
            if attached:  # off its old group first: the components know it by that
                self._drain(ent, now)
                self._detach(ent, now)
            ent.full = ent.group = group
            if self.hbm is not None:
                self._hbm_enter(ent)
            if attached:
                ent.rate = 0.0
                self._attach(ent, now)

    def _left(self, ent: Entity) -> None:
        """``ent`` is done (or failed): it no longer loads its chips' HBM."""
        use = ent.hbm
        if use is not None:
            assert self.hbm is not None
            cooled = self.hbm.leave(use.chip_list, use.load_list, use.flow)
            ent.hbm = None
            if cooled and self.hbm_listener is not None:
                self.hbm_listener(np.asarray(cooled, dtype=np.int64), False)
