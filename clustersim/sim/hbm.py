"""Compute runs on a chip's shared HBM: a fast path, and a fluid one when flows share it.

A run of compute ops of a rank moves ``hbm_bytes`` through its chip's HBM in
``seconds`` when it has the HBM share its op times assume (the roofline's or the
engine model's per-rank share: the ranks of a chip, all at full speed, never
oversubscribe it). So a run is one SimPy timeout, as long as no flow touches the
chip's HBM. When a flow starts on the chip (a collective's DMA reads at the source
and writes at the destination; :meth:`~clustersim.network.flows.FlowNetwork.share_hbm`),
every run in progress there becomes an entity of the flow model with the bytes it
has left, capped at its full-speed demand ``hbm_bytes / seconds``: the max-min solve
then shares the chip's HBM between it and the flows, and the run ends when its
bytes are through, stretched by the share it got. A run that starts while flows
are on its chip is fluid from the start. On GPUs a collective also takes SMs from
compute (``collective_sm_fraction`` in the chip catalog, NCCL's channels): a run
that meets one is capped at that much less of its demand for the rest of the run.

The rank process keeps its timeout either way (SimPy cannot cancel one): it
writes its run into per-rank slots before waiting (``begin``), and after the
timeout waits for the fluid remainder if its run went fluid (``end``).
"""

from __future__ import annotations

from collections.abc import Sequence

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
        self._on_chip: dict[int, list[int]] = {}
        for pos, chip in enumerate(rank_chips):
            self._on_chip.setdefault(chip, []).append(pos)
        if flows.hbm is None:
            raise ValueError("compute runs need shared HBM (FlowNetwork.share_hbm)")
        self._simulated = np.zeros(flows.hbm.flows.size, dtype=bool)
        """Chips with a simulated rank: a folded step's flows touch many more."""
        self._simulated[list(self._on_chip)] = True
        self._groups: dict[tuple[int, float], FlowGroup] = {}
        self.flows_on = flows.hbm.flows
        """Flows on each chip's HBM (the flow model's live counts)."""
        self.fluid_runs = 0
        """Runs that met a flow on their chip's HBM and went through the flow model."""
        flows.hbm_listener = self._flows_started

    def begin(self, pos: int, hbm_bytes: float, seconds: float) -> None:
        """Rank ``pos`` starts a run now; wait ``seconds``, then call :meth:`end`."""
        self.end_s[pos] = float(self.env.now) + seconds
        self.hbm_bytes[pos] = hbm_bytes
        self.seconds[pos] = seconds
        if self.flows_on[self.chips[pos]]:
            self._go_fluid(pos)

    def end(self, pos: int) -> simpy.Event | None:
        """The run's full-speed time is over: None if it is done, else the event of the
        end of its bytes (it met flows on its chip's HBM)."""
        self.end_s[pos] = 0.0
        rest = self.fluid[pos]
        self.fluid[pos] = None
        return rest

    def _flows_started(self, chips: NDArray[np.int64]) -> None:
        chips = chips[self._simulated[chips]]
        if not chips.size:
            return
        now = float(self.env.now)
        on_chip, end_s, fluid = self._on_chip, self.end_s, self.fluid
        for chip in chips.tolist():
            for pos in on_chip.get(chip, ()):
                if end_s[pos] > now and fluid[pos] is None:
                    self._go_fluid(pos)

    def _go_fluid(self, pos: int) -> None:
        seconds, hbm_bytes = self.seconds[pos], self.hbm_bytes[pos]
        left_s = self.end_s[pos] - float(self.env.now)
        left = hbm_bytes * min(max(left_s / seconds, 0.0), 1.0)
        demand = hbm_bytes / seconds * (1.0 - self.sm_fraction)
        key = (self.chips[pos], demand)
        group = self._groups.get(key)
        if group is None:  # one group per chip and demand, so solves of repeats are remembered
            group = self._groups[key] = self.flows.compute_group(key[0], demand)
        self.fluid_runs += 1
        self.fluid[pos] = self.flows.transfer_group(group, left, 0.0)
