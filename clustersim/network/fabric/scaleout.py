"""What a scale-out fabric offers a :class:`~.topology.Topology`: bulk routes between domains.

Inside a scale-up domain a builder's path function gives each chip pair its path;
between domains the topology hands whole arrays of pairs to its :class:`ScaleOut`
fabric (``nonblocking``, ``fat_tree``, ``rail``: :mod:`.fabrics`; an imported
graph's: :mod:`clustersim.network.graphs.custom`), which routes them vectorised and
uncached, spreads a chip's traffic over its NIC ports, and with links down moves a pair to another
equal-cost path or says it has none (the topology then falls back to Dijkstra).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from clustersim.network.fabric.links import Int64s

__all__ = ["ScaleOut"]


class ScaleOut(Protocol):
    """A scale-out fabric that routes chip pairs of different domains in bulk."""

    @property
    def name(self) -> str: ...

    @property
    def private(self) -> bool:
        """Whether every path is just its two chips' own links to one switch: then no
        other pair's path shares a link with it."""
        ...

    @property
    def spread(self) -> int:
        """Equal-cost paths that one chip's traffic to another domain spreads over: its
        NIC ports, each a flow of its own to ECMP (1 on a :attr:`private` fabric)."""
        ...

    def host_links(self, src: Int64s, dst: Int64s) -> tuple[Int64s, Int64s]:
        """The up link of each source and the down link of each target: on a
        :attr:`private` fabric, the whole path of each pair."""
        ...

    def paths(
        self,
        src: Int64s,
        dst: Int64s,
        usable: NDArray[np.bool_] | None,
        offset: Int64s | None = None,
    ) -> tuple[Int64s, NDArray[np.bool_]]:
        """Links of each pair's path, one row per pair padded with -1, and whether it is usable.

        With ``usable`` (a mask over links; None when every link is up) a pair
        whose preferred path crosses an unusable link takes another equal-cost
        path, and is marked not ok when none is left. ``offset[i]`` shifts pair
        ``i`` to its ``offset``-th next equal-cost path (one of a chip's NIC ports).
        """
        ...
