"""Each chip's HBM as a capacity of the max-min solve (``FlowNetwork.share_hbm``).

The flow model's capacities are the topology's links, then one per chip: its
sustained HBM bandwidth, at index ``base + chip``. A flow between two chips reads
the source's HBM and writes the destination's, so a step's entity crosses the HBM
of every chip its flows start or end on, once per flow; a compute run is an entity
on its own chip's HBM with a ceiling at its demand. ``flows`` counts the flow
entities (not compute) moving through each chip's HBM, so compute can stay on its
fast path while none do.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from clustersim.network.entity import FlowGroup

__all__ = ["SharedHbm"]


class SharedHbm:
    """The HBM capacities after the topology's ``base`` links, one per chip."""

    def __init__(self, base: int, hbm_Bps: float | NDArray[np.float64], n_chips: int) -> None:
        self.base = base
        self.capacity: NDArray[np.float64] = np.broadcast_to(
            np.asarray(hbm_Bps, dtype=np.float64), (n_chips,)
        ).copy()
        self.flows: NDArray[np.int64] = np.zeros(n_chips, dtype=np.int64)
        """Flow entities moving through each chip's HBM now."""

    def compute_group(self, chip: int, demand_Bps: float) -> FlowGroup:
        """A compute run on ``chip``'s HBM, moving at most ``demand_Bps``."""
        link = np.asarray([self.base + chip], dtype=np.int64)
        return FlowGroup(link, np.ones(1), 1, 0.0, (), float(demand_Bps))

    def chips_of(self, links: NDArray[np.int64]) -> NDArray[np.int64]:
        """The chips whose HBM is among ``links``."""
        chips: NDArray[np.int64] = links[links >= self.base] - self.base
        return chips

    def add(
        self,
        links: NDArray[np.int64],
        counts: NDArray[np.float64],
        src: NDArray[np.int64],
        dst: NDArray[np.int64],
        only: NDArray[np.int64] | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """``links`` (sorted) and ``counts`` with the HBM reads at ``src`` and the writes at
        ``dst`` chips, on the chips in ``only`` (default every chip). Flows within
        one chip cross no link and are left out."""
        apart = src != dst
        ends = np.concatenate([src[apart], dst[apart]])
        if only is not None:
            keep = np.zeros(self.flows.size, dtype=bool)
            keep[only] = True
            ends = ends[keep[ends]]
        chips, n = np.unique(ends, return_counts=True)
        return (
            np.concatenate([links, self.base + chips.astype(np.int64)]),
            np.concatenate([counts, n.astype(np.float64)]),
        )
