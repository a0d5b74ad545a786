"""A routed entity of the flow model (its column of the incidence matrix), and the state
of one in flight."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import simpy
from numpy.typing import NDArray

__all__ = [
    "NO_CHIPS",
    "Component",
    "Entity",
    "FlowGroup",
    "HbmUse",
    "LinkIds",
    "Pairs",
    "compact_links",
    "link_counts",
]

Pairs = tuple[tuple[int, int], ...]
NO_CHIPS: NDArray[np.int64] = np.zeros(0, dtype=np.int64)
LinkIds = NDArray[np.int64] | NDArray[np.int32]
"""A group's link indices: 32 bits where they fit (a folded step holds 10^5 to 10^6)."""
_INT32_MAX = int(np.iinfo(np.int32).max)


@dataclass(frozen=True, eq=False)
class FlowGroup:
    """The routed flows of one entity: its column of the incidence matrix.

    ``links`` are distinct link indices and ``counts`` how many of the group's
    flows cross each; ``latency_s`` is the longest route latency of its flows.
    ``pairs`` are the chip pairs it was routed from (to reroute it after a failure):
    a tuple, or for the many flows of a folded step a function that builds them
    as an ``n x 2`` array (a group stays small however many replicas it stands for).
    """

    links: LinkIds
    counts: NDArray[np.float64]
    n_flows: int
    latency_s: float
    pairs: Pairs | Callable[[], NDArray[np.int64]] = ()
    rate_cap_Bps: float = math.inf
    """A ceiling on the entity's rate of its own (a compute run's HBM demand at full speed)."""
    hbm_chips: NDArray[np.int64] = field(default_factory=lambda: NO_CHIPS)
    """The chips whose HBM its flows read or write (with shared HBM; not for compute)."""


def compact_links(links: LinkIds) -> LinkIds:
    """``links`` (increasing) in 32 bits where the last one fits: the same indices in half
    the memory, for groups that are kept (the ids index arrays and sort alike)."""
    if links.size and int(links[-1]) <= _INT32_MAX:
        return links.astype(np.int32, copy=False)
    return links


def link_counts(
    flat: NDArray[np.int64], weights: NDArray[np.float64] | None, n_links: int = 0
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Distinct links of a multiset of route links, and the flows on each (weighted).

    With ``n_links`` (the topology's) and many entries, a count per link replaces the
    sort: the routes of every replica of a folded step hold millions of entries.
    """
    if n_links and flat.size > n_links // 4:
        per_link = np.bincount(flat, weights=weights, minlength=n_links)
        links = np.flatnonzero(per_link).astype(np.int64)
        return links, per_link[links].astype(np.float64)
    if weights is None:
        distinct, multiplicity = np.unique(flat, return_counts=True)
        return distinct.astype(np.int64), multiplicity.astype(np.float64)
    links, inverse = np.unique(flat, return_inverse=True)
    counts: NDArray[np.float64] = np.bincount(
        inverse.ravel(), weights=weights, minlength=links.size
    ).astype(np.float64)
    return links.astype(np.int64), counts


class Entity:
    """One transfer in flight on a :class:`~.flownetwork.FlowNetwork`: ``remaining`` bytes per
    flow as of ``t_s``, moving at ``rate``."""

    __slots__ = (
        "comp", "event", "full", "group", "hbm", "rate", "remaining", "rest", "seq", "stamp",
        "t_s", "total",
    )  # fmt: skip

    def __init__(
        self, group: FlowGroup, nbytes: float, event: simpy.Event, seq: int, rest: Any = None
    ) -> None:
        self.group = group
        """The group solved: ``full``, less the HBM rows of chips that are not hot."""
        self.full = group
        self.hbm: HbmUse | None = None
        """How it loads the chips' HBM (with shared HBM)."""
        self.total = nbytes
        self.remaining = nbytes
        self.rate = 0.0
        self.t_s = 0.0
        self.event = event
        self.seq = seq
        """Creation order: simultaneous completions succeed in this order."""
        self.stamp = 0
        """Bumped at every change of rate: heap entries with an older stamp are stale."""
        self.comp: Component | None = None
        self.rest = rest
        """What follows it in its chain of transfers (None: its event succeeds when it ends)."""


class Component:
    """Entities that share links, directly or through one another."""

    __slots__ = ("entities", "ident")

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.entities: list[Entity] = []


class HbmUse:
    """How an entity's group loads HBM: its chips, at most ``load`` on each (its flows
    there times the rate its own links allow it alone), and its group without the
    HBM rows (None for a compute run, which is only on HBM)."""

    __slots__ = ("at", "chip_list", "chips", "flow", "lite", "load", "load_list", "partial")

    def __init__(self, group: FlowGroup, base: int, cap: NDArray[np.float64]) -> None:
        links, counts = group.links, group.counts
        at = self.at = int(np.searchsorted(links, base))
        ub = group.rate_cap_Bps
        if at:
            ub = min(ub, float((cap[links[:at]] / counts[:at]).min()))
        self.chips: NDArray[np.int64] = links[at:].astype(np.int64) - base
        self.load: NDArray[np.float64] = counts[at:] * ub
        # The same as lists, read one chip at a time on the few chips of most entities.
        self.chip_list: list[int] = self.chips.tolist()
        self.load_list: list[float] = self.load.tolist()
        self.flow = bool(group.hbm_chips.size)
        self.lite = (
            replace(group, links=links[:at], counts=counts[:at]) if at and self.flow else None
        )
        self.partial: dict[bytes, FlowGroup] = {}
        """Variants with the rows of some chips, by the mask of those chips."""

    def partial_variant(self, full: FlowGroup, hot: NDArray[np.bool_]) -> FlowGroup:
        """``full`` with the rows of the chips where ``hot`` is set (cached)."""
        key = hot.tobytes()
        found = self.partial.get(key)
        if found is None:
            keep = np.concatenate([np.ones(self.at, dtype=bool), hot])
            found = self.partial[key] = replace(
                full, links=full.links[keep], counts=full.counts[keep]
            )
        return found
