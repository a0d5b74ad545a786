"""Compute runs on a chip's shared HBM: a fast path, and a fluid one when flows share it.

A run of compute ops of a rank moves ``hbm_bytes`` through its chip's HBM in
``seconds`` when it has the HBM share its op times assume (the roofline's or the
engine model's per-rank share: the ranks of a chip, all at full speed, never
oversubscribe it). So a run is one SimPy timeout, as long as its chip's HBM has
room for everything on it: its runs' full-speed demands and what the flows on it
(a collective's DMA reads at the source and writes at the destination;
:meth:`~clustersim.network.flows.flownetwork.FlowNetwork.share_hbm`) can move at most
(:mod:`clustersim.network.flows.hbm`). When a flow turns the chip *hot*, every run in
progress there becomes an entity of the flow model with the bytes it has left,
capped at its full-speed demand ``hbm_bytes / seconds``: the max-min solve then
shares the chip's HBM between it and the flows, and the run ends when its bytes
are through, stretched by the share it got. A run that starts on a hot chip is
fluid from the start. On GPUs a collective also takes SMs from
compute (``collective_sm_fraction`` in the chip catalog, NCCL's channels): a run
that meets one is capped at that much less of its demand for the rest of the run.

A run that starts on a chip without flows does no more than note its demand: it
is added to the chip's fast demand only when a flow arrives there
(:attr:`~clustersim.network.flows.hbm.SharedHbm.first_flow`), since nothing reads that
demand before, so the runs that never meet a flow cost a few list writes.

The rank process keeps its timeout either way (SimPy cannot cancel one): it
writes its run into per-rank slots before waiting (``begin``), and after the
timeout waits for the fluid remainder if its run went fluid (``end``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import simpy
from numpy.typing import NDArray

from clustersim.network.flows import FlowGroup, FlowNetwork

__all__ = ["ComputeRuns"]


class ComputeRuns:
    """The compute runs of the simulated ranks (by position), on their chips' shared HBM.

    ``rank_chips`` is the chip of each simulated rank, by position; ``sm_fraction`` the
    share of a chip's compute a collective takes while it runs (0 on Trainium, whose
    collectives run on the DMA engines).
    """

    def __init__(
        self,
        env: simpy.Environment,
        flows: FlowNetwork,
        rank_chips: Sequence[int],
        sm_fraction: float = 0.0,
    ) -> None:
        self.env = env
        self.flows = flows
        self.sm_fraction = sm_fraction
        n = len(rank_chips)
        self.chips = list(rank_chips)
        self.end_s = [0.0] * n
        """When each rank's current run ends at full speed (0: none running)."""
        self.hbm_bytes = [0.0] * n
        self.seconds = [0.0] * n
        self.fluid: list[simpy.Event | None] = [None] * n
        self.fast = [False] * n
        """Whether each rank's run is on its fast path now (begun, not fluid, not ended)."""
        self._counted = [False] * n
        """Whether that run's demand is in its chip's fast demand (the chip had flows)."""
        self._handles: list[object | None] = [None] * n
        """With an SM fraction: each rank's fluid run in the flow model, until it ends."""
        self._capped = [False] * n
        """Whether that run's ceiling leaves out the collectives' SMs."""
        self._on_chip: dict[int, list[int]] = {}
        for pos, chip in enumerate(rank_chips):
            self._on_chip.setdefault(chip, []).append(pos)
        if flows.hbm is None:
            raise ValueError("compute runs need shared HBM (FlowNetwork.share_hbm)")
        self._simulated = np.zeros(flows.hbm.capacity.size, dtype=bool)
        """Chips with a simulated rank: a folded step's flows touch many more."""
        self._simulated[list(self._on_chip)] = True
        self._groups: dict[tuple[int, float], FlowGroup] = {}
        hbm = flows.hbm
        self.hot = hbm.hot_of
        """The chips whose HBM rows are in the solve (the flow model's live flags)."""
        self.flows_on = hbm.flows
        self.fast_Bps = hbm.fast
        """Each chip's fast runs' demand, as the flow model reads it."""
        self._fast_n = dict.fromkeys(self._on_chip, 0)
        if sm_fraction > 0:  # every collective takes SMs: any flow makes its chips hot
            flows.hbm.strict = True
        self.fluid_runs = 0
        """Runs that met flows on their chip's HBM and went through the flow model."""
        flows.hbm_listener = self._turned_hot
        hbm.first_flow = self._first_flow

    def begin(self, pos: int, hbm_bytes: float, seconds: float) -> None:
        """Rank ``pos`` starts a run now; wait ``seconds``, then call :meth:`end`."""
        self.end_s[pos] = float(self.env.now) + seconds
        self.hbm_bytes[pos] = hbm_bytes
        self.seconds[pos] = seconds
        chip = self.chips[pos]
        if not self.flows_on[chip]:  # counted when a flow arrives (_first_flow)
            self.fast[pos] = True
            return
        if self.hot[chip]:
            self._go_fluid(pos)
            return
        self.fast[pos] = True
        self._count(pos, chip)
        self.flows.hbm_check(chip)  # may turn the chip hot: then the run is fluid

    def end(self, pos: int) -> simpy.Event | None:
        """The run's full-speed time is over: None if it is done, else the event of the
        end of its bytes (it met flows on its chip's HBM)."""
        self.end_s[pos] = 0.0
        if self.fast[pos]:
            if self._counted[pos]:
                self._unfast(pos)
            else:  # never met a flow: nothing was counted
                self.fast[pos] = False
        rest = self.fluid[pos]
        if rest is None:
            return None
        self.fluid[pos] = None
        return rest

    def _count(self, pos: int, chip: int) -> None:
        """Add rank ``pos``'s fast run to its chip's fast demand."""
        self._counted[pos] = True
        self.fast_Bps[chip] += self.hbm_bytes[pos] / self.seconds[pos]
        self._fast_n[chip] += 1

    def _first_flow(self, chip: int) -> None:
        """A flow arrives on ``chip``, which had none: its fast runs' demand counts now."""
        fast, counted = self.fast, self._counted
        for pos in self._on_chip.get(chip, ()):
            if fast[pos] and not counted[pos]:
                self._count(pos, chip)

    def _unfast(self, pos: int) -> None:
        """Rank ``pos``'s run is no longer on its fast path."""
        self.fast[pos] = False
        if not self._counted[pos]:
            return
        self._counted[pos] = False
        chip = self.chips[pos]
        n = self._fast_n[chip] = self._fast_n[chip] - 1
        if n:
            self.fast_Bps[chip] -= self.hbm_bytes[pos] / self.seconds[pos]
        else:
            self.fast_Bps[chip] = 0.0  # no rounding residue left behind

    def _turned_hot(self, chips: NDArray[np.int64], hot: bool) -> None:
        """``chips`` turned hot (their runs go fluid) or cooled (their last flow left:
        fluid runs get back the SMs the collectives took)."""
        chips = chips[self._simulated[chips]]
        if not chips.size:
            return
        now = float(self.env.now)
        on_chip, end_s, fluid, handles = self._on_chip, self.end_s, self.fluid, self._handles
        for chip in chips.tolist():
            for pos in on_chip.get(chip, ()):
                if hot and end_s[pos] > now and fluid[pos] is None:
                    self._go_fluid(pos)
                elif self.sm_fraction and handles[pos] is not None:
                    self._recap(pos, hot)

    def _group(self, pos: int, busy: bool) -> FlowGroup:
        """The entity of rank ``pos``'s run: its chip's HBM, at most its full-speed demand,
        less the collectives' SMs while ``busy`` (flows on the chip)."""
        demand = self.hbm_bytes[pos] / self.seconds[pos]
        if busy:
            demand *= 1.0 - self.sm_fraction
        key = (self.chips[pos], demand)
        group = self._groups.get(key)
        if group is None:  # one group per chip and demand, so solves of repeats are remembered
            group = self._groups[key] = self.flows.compute_group(key[0], demand)
        return group

    def _go_fluid(self, pos: int) -> None:
        seconds, hbm_bytes = self.seconds[pos], self.hbm_bytes[pos]
        if self.fast[pos]:
            self._unfast(pos)
        left_s = self.end_s[pos] - float(self.env.now)
        left = hbm_bytes * min(max(left_s / seconds, 0.0), 1.0)
        busy = bool(self.flows_on[self.chips[pos]])
        self.fluid_runs += 1
        done, handle = self.flows.compute_transfer(self._group(pos, busy), left)
        self.fluid[pos] = done
        if self.sm_fraction:
            self._handles[pos] = handle
            self._capped[pos] = busy
            done.callbacks.append(partial(self._forget, pos, handle))

    def _recap(self, pos: int, busy: bool) -> None:
        """Rank ``pos``'s fluid run: collectives start (``busy``) or stop taking SMs."""
        if self._capped[pos] != busy:
            self._capped[pos] = busy
            self.flows.regroup(self._handles[pos], self._group(pos, busy))

    def _forget(self, pos: int, handle: object, _ev: object) -> None:
        if self._handles[pos] is handle:
            self._handles[pos] = None
