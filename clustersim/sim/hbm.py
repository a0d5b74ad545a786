"""Compute runs on a chip's shared HBM: a fast path, and a fluid one when flows share it.

A run of compute ops of a rank moves ``hbm_bytes`` through its chip's HBM in
``seconds`` when it has the HBM share its op times assume (the roofline's or the
engine model's per-rank share: the ranks of a chip, all at full speed, never
oversubscribe it). So a run is one SimPy timeout, as long as its chip's HBM has
room for everything on it: its runs' demands and what the flows on it
(a collective's DMA reads at the source and writes at the destination;
:meth:`~clustersim.network.flows.flownetwork.FlowNetwork.share_hbm`) can move at most
(:mod:`clustersim.network.flows.hbm`). When a flow turns the chip *hot*, every run in
progress there becomes an entity of the flow model with the bytes it has left,
capped at its demand: the max-min solve then shares the chip's HBM between it and
the flows, and the run ends when its bytes are through, stretched by the share it
got. A run that starts on a hot chip is fluid from the start.

On GPUs a collective also takes SMs from compute (``collective_sm_fraction`` in the
chip catalog, NCCL's channels): while a flow is on its chip, a run moves at that
much less of its full-speed demand. Where the chip is not hot the HBM row cannot
bind, so the max-min solve would give the run exactly that capped rate: the run
stays out of the flow model, its bytes are counted at the rate it has (capped while
the chip has flows, full speed otherwise), and it ends when they are through, past
its full-speed end by what the caps took (``stretched_runs``). Its capped demand
counts in the chip's fast demand, and the chip turns hot, and the run fluid, as
soon as the HBM could bind.

A run that starts on a chip without flows does no more than note its demand: it
is added to the chip's fast demand only when a flow arrives there
(:attr:`~clustersim.network.flows.hbm.SharedHbm.first_flow`), since nothing reads that
demand before, so the runs that never meet a flow cost a few list writes.

The rank process keeps its timeout either way (SimPy cannot cancel one): it
writes its run into per-rank slots before waiting (``begin``), and after the
timeout waits for the rest of its run if it met flows (``end``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import simpy
from numpy.typing import NDArray

from clustersim.network.flows import FlowGroup, FlowNetwork

__all__ = ["ComputeRuns"]

DONE_RTOL = 1e-12
"""A capped run whose bytes left are within this fraction of its bytes is done."""


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
        self._amount = [0.0] * n
        """The demand it was counted with (capped by the collectives' SMs)."""
        self._handles: list[object | None] = [None] * n
        """With an SM fraction: each rank's fluid run in the flow model, until it ends."""
        self._capped = [False] * n
        """Whether that run's ceiling leaves out the collectives' SMs."""
        # With an SM fraction, a fast run's bytes: ``_left`` at ``_since``, moving at
        # ``_rate``; ``_late`` is the event of its end once past its full-speed end,
        # ``_gen`` which of its timers is current.
        self._rate = [0.0] * n
        self._left = [0.0] * n
        self._since = [0.0] * n
        self._late: list[simpy.Event | None] = [None] * n
        self._gen = [0] * n
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
        self.fluid_runs = 0
        """Runs that met flows on their chip's HBM and went through the flow model."""
        self.stretched_runs = 0
        """Runs that ended past their full-speed end outside the flow model (SMs taken)."""
        flows.hbm_listener = self._turned_hot
        hbm.first_flow = self._first_flow
        if sm_fraction > 0:
            hbm.last_flow = self._last_flow

    def begin(self, pos: int, hbm_bytes: float, seconds: float) -> None:
        """Rank ``pos`` starts a run now; wait ``seconds``, then call :meth:`end`."""
        now = float(self.env.now)
        self.end_s[pos] = now + seconds
        self.hbm_bytes[pos] = hbm_bytes
        self.seconds[pos] = seconds
        chip = self.chips[pos]
        busy = bool(self.flows_on[chip])
        if busy and self.hot[chip]:
            self._go_fluid(pos)
            return
        self.fast[pos] = True
        if self.sm_fraction:
            self._left[pos] = hbm_bytes
            self._since[pos] = now
            self._rate[pos] = self._demand(pos, busy)
        if not busy:  # counted when a flow arrives (_first_flow)
            return
        self._count(pos, chip)
        self.flows.hbm_check(chip)  # may turn the chip hot: then the run is fluid

    def end(self, pos: int) -> simpy.Event | None:
        """The run's full-speed time is over: None if it is done, else the event of the
        end of its bytes (it met flows on its chip)."""
        self.end_s[pos] = 0.0
        if self.fast[pos]:
            if self.sm_fraction and self._bytes_left(pos) > DONE_RTOL * self.hbm_bytes[pos]:
                late = self._late[pos] = self.env.event()  # the collectives took SMs
                self.stretched_runs += 1
                self._retime(pos, self._rate[pos])
                return late
            self._unfast(pos)
        rest = self.fluid[pos]
        if rest is None:
            return None
        self.fluid[pos] = None
        return rest

    def _demand(self, pos: int, busy: bool) -> float:
        """Rank ``pos``'s full-speed HBM demand, less the collectives' SMs while ``busy``."""
        demand = self.hbm_bytes[pos] / self.seconds[pos]
        return demand * (1.0 - self.sm_fraction) if busy else demand

    def _bytes_left(self, pos: int) -> float:
        return self._left[pos] - self._rate[pos] * (float(self.env.now) - self._since[pos])

    def _retime(self, pos: int, rate: float) -> None:
        """A fast run's bytes move at ``rate`` from now; past its full-speed end, its end
        is moved to where they are through."""
        now = float(self.env.now)
        self._left[pos] = left = max(self._bytes_left(pos), 0.0)
        self._since[pos] = now
        self._rate[pos] = rate
        if self._late[pos] is not None:
            gen = self._gen[pos] = self._gen[pos] + 1
            timer = self.env.timeout(left / rate)
            timer.callbacks.append(partial(self._through, pos, gen))

    def _through(self, pos: int, gen: int, _ev: object) -> None:
        """A stretched run's bytes are through (unless its timer was replaced)."""
        late = self._late[pos]
        if late is None or gen != self._gen[pos]:
            return
        self._late[pos] = None
        self._unfast(pos)
        late.succeed()

    def _count(self, pos: int, chip: int) -> None:
        """Add rank ``pos``'s fast run to its chip's fast demand."""
        self._counted[pos] = True
        amount = self._amount[pos] = self._demand(pos, bool(self.sm_fraction))
        self.fast_Bps[chip] += amount
        self._fast_n[chip] += 1

    def _first_flow(self, chip: int) -> None:
        """A flow arrives on ``chip``, which had none: its fast runs' demand counts now,
        and with an SM fraction they slow down."""
        fast, counted, sm = self.fast, self._counted, self.sm_fraction
        for pos in self._on_chip.get(chip, ()):
            if not fast[pos]:
                if sm and self._handles[pos] is not None:  # fluid from an earlier flow
                    self._recap(pos, True)
                continue
            if sm:
                self._retime(pos, self._demand(pos, True))
            if not counted[pos]:
                self._count(pos, chip)

    def _last_flow(self, chip: int) -> None:
        """The last flow on ``chip`` left: its fast runs get back the collectives' SMs."""
        fast = self.fast
        for pos in self._on_chip.get(chip, ()):
            if fast[pos]:
                self._retime(pos, self._demand(pos, False))
            elif self._handles[pos] is not None:
                self._recap(pos, False)

    def _unfast(self, pos: int) -> None:
        """Rank ``pos``'s run is no longer on its fast path."""
        self.fast[pos] = False
        if not self._counted[pos]:
            return
        self._counted[pos] = False
        chip = self.chips[pos]
        n = self._fast_n[chip] = self._fast_n[chip] - 1
        if n:
            self.fast_Bps[chip] -= self._amount[pos]
        else:
            self.fast_Bps[chip] = 0.0  # no rounding residue left behind

    def _turned_hot(self, chips: NDArray[np.int64], hot: bool) -> None:
        """``chips`` turned hot (their runs go fluid) or cooled (their last flow left:
        fluid runs get back the SMs the collectives took)."""
        chips = chips[self._simulated[chips]]
        if not chips.size:
            return
        now = float(self.env.now)
        on_chip, end_s, fast, handles = self._on_chip, self.end_s, self.fast, self._handles
        late = self._late
        for chip in chips.tolist():
            for pos in on_chip.get(chip, ()):
                if hot and fast[pos] and (end_s[pos] > now or late[pos] is not None):
                    self._go_fluid(pos)
                elif self.sm_fraction and handles[pos] is not None:
                    self._recap(pos, hot)

    def _group(self, pos: int, busy: bool) -> FlowGroup:
        """The entity of rank ``pos``'s run: its chip's HBM, at most its full-speed demand,
        less the collectives' SMs while ``busy`` (flows on the chip)."""
        key = (self.chips[pos], self._demand(pos, busy))
        group = self._groups.get(key)
        if group is None:  # one group per chip and demand, so solves of repeats are remembered
            group = self._groups[key] = self.flows.compute_group(key[0], key[1])
        return group

    def _go_fluid(self, pos: int) -> None:
        seconds, hbm_bytes = self.seconds[pos], self.hbm_bytes[pos]
        if self.sm_fraction and self.fast[pos]:
            left = max(self._bytes_left(pos), 0.0)
        else:
            left_s = self.end_s[pos] - float(self.env.now)
            left = hbm_bytes * min(max(left_s / seconds, 0.0), 1.0)
        if self.fast[pos]:
            self._unfast(pos)
        busy = bool(self.flows_on[self.chips[pos]])
        self.fluid_runs += 1
        done, handle = self.flows.compute_transfer(self._group(pos, busy), left)
        late = self._late[pos]
        if late is not None:  # past its full-speed end: the rank waits on ``late``
            self._late[pos] = None
            self._gen[pos] += 1
            done.callbacks.append(partial(_succeed, late))
        else:
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


def _succeed(event: simpy.Event, _ev: object) -> None:
    event.succeed()
