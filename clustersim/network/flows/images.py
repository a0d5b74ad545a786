"""Folded steps of stages placed alike, as images of one another (:class:`StageImages`).

A folded step of a pipeline stage routes every replica's flows (262,144 of them
per data-parallel step at 10^6 chips), and each stage runs the same steps on its
own chips. Where every scale-up domain is the same torus (the topology's
``local_paths``) and the scale-out fabric is :attr:`private
<clustersim.network.fabric.scaleout.ScaleOut.private>` (``nonblocking``), shifting every
chip by whole domains, ``c -> c + delta`` with ``delta`` a multiple of the chips
per domain, maps each route onto the route of the shifted pair: a path inside a
domain is the domain's local path, and a path between domains is its two chips'
own links to the one switch. So when the replica rows of a step are the rows of an
earlier step shifted by ``delta`` (the same step of another stage), the step's
group is the earlier group with each link replaced by its image: the same counts,
flows and latency, provided the images carry the same capacities and latencies.

That is checked, not assumed, once per pair of replica rows: the rows are equal
after the shift, and the capacities and latencies of every chip's links to the
switch and to itself, of the HBM, and of the torus links of every domain their
flows touch, equal those of their images. A link of the group is mapped through
its two end nodes (a chip moves by ``delta``, the switch stays), and must come
back to itself when looked up, so links that no shift maps (a switch inside a
domain, parallel links) leave the step to be routed as before. The images must
keep the links' order, so the solve sees the same columns in the same order; any
step that fails a check is routed as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from clustersim.network.fabric import Topology
from clustersim.network.flows.entity import FlowGroup, compact_links

__all__ = ["StageImages"]

Int64s = NDArray[np.int64]

_SAMPLE = 4096
"""Chips of a replica array read for the digest of its placement."""

_MAX_ENTRIES = 16_384
"""Sources, placements or checked pairs held before the tables are cleared."""


class StageImages:
    """The folded groups of steps, by their placement relative to their first domain,
    to give the same step of rows shifted by whole domains as an image (see the module
    doc). ``hbm`` is the first HBM index and each chip's HBM capacity, with shared HBM."""

    def __init__(
        self, topology: Topology, hbm: tuple[int, NDArray[np.float64]] | None = None
    ) -> None:
        self.topology = topology
        self.hbm = hbm
        self._placements: dict[int, tuple[ArrayLike, int, bytes]] = {}
        """Per replica array (by id; the value holds it): its first domain's first chip and
        the digest of its rows relative to that chip."""
        self._sources: dict[tuple[bytes, bytes], tuple[ArrayLike, int, FlowGroup]] = {}
        """Per (digest of the step's pairs, digest of the relative rows): the replicas,
        first chip and group of the first step routed with them."""
        self._checked: dict[tuple[int, int], tuple[ArrayLike, ArrayLike, bool]] = {}
        self.images = 0
        """Groups given as images (for tests and profiles)."""

    def clear(self) -> None:
        """Forget everything (the topology changed)."""
        self._placements.clear()
        self._sources.clear()
        self._checked.clear()

    @property
    def applies(self) -> bool:
        """Whether the topology is one whose routes shift with whole domains."""
        topo = self.topology
        scaleout = topo.scaleout
        return (
            topo.local_paths is not None
            and not topo.links_down
            and topo.n_domains > 1
            and scaleout is not None
            and scaleout.private
        )

    def _placement(self, replicas: ArrayLike, rows: Int64s) -> tuple[int, bytes]:
        """The first chip of the domain of the first replica's first chip, and a digest of
        the rows' shape and a sample of them relative to that chip: rows that are shifts
        of one another by whole domains have equal digests (the converse is checked)."""
        found = self._placements.get(id(replicas))
        if found is not None and found[0] is replicas:
            return found[1], found[2]
        cpd = self.topology.chips_per_domain
        flat = rows.reshape(-1)
        first = int(flat[0]) // cpd * cpd
        sample = flat[:: max(1, flat.size // _SAMPLE)] - first
        shape = np.asarray(rows.shape, dtype=np.int64).tobytes()
        digest = hashlib.blake2b(shape + sample.tobytes(), digest_size=16).digest()
        if len(self._placements) >= _MAX_ENTRIES:
            self._placements.clear()
        self._placements[id(replicas)] = (replicas, first, digest)
        return first, digest

    def remember(self, replicas: ArrayLike, rows: Int64s, pairs: bytes, group: FlowGroup) -> None:
        """``group`` is the step (``pairs``: its digest) of the chip ``rows`` of ``replicas``."""
        if not self.applies:
            return
        first, digest = self._placement(replicas, rows)
        if len(self._sources) >= _MAX_ENTRIES:
            self._sources.clear()
        self._sources.setdefault((pairs, digest), (replicas, first, group))

    def image(
        self,
        replicas: ArrayLike,
        rows: Int64s,
        pairs: bytes,
        source_rows: Callable[[ArrayLike], Int64s],
        every_pair: Callable[[], Int64s],
    ) -> FlowGroup | None:
        """The step ``pairs`` of the chip ``rows`` of ``replicas`` as the image of a step
        remembered for rows placed alike, or None. ``source_rows(replicas)`` gives the
        chip rows of a remembered replica array; ``every_pair`` is the new group's pairs."""
        if not self.applies:
            return None
        first, digest = self._placement(replicas, rows)
        found = self._sources.get((pairs, digest))
        if found is None or found[0] is replicas:
            return None
        source, source_first, group = found
        delta = first - source_first
        if not self._check(replicas, rows, source, source_rows, delta):
            return None
        links = self._links(group, delta)
        if links is None:
            return None
        self.images += 1
        return FlowGroup(
            compact_links(links),
            group.counts,
            group.n_flows,
            group.latency_s,
            every_pair,
            hbm_chips=group.hbm_chips + delta,
        )

    def _check(
        self,
        replicas: ArrayLike,
        rows: Int64s,
        source: ArrayLike,
        source_rows: Callable[[ArrayLike], Int64s],
        delta: int,
    ) -> bool:
        """Whether ``rows`` are the rows of ``source`` shifted by ``delta`` chips, and every
        link their flows can cross carries what its image does (remembered per pair)."""
        key = (id(replicas), id(source))
        found = self._checked.get(key)
        if found is not None and found[0] is replicas and found[1] is source:
            return found[2]
        ok = self._alike(rows, source_rows(source), delta)
        if len(self._checked) >= _MAX_ENTRIES:
            self._checked.clear()
        self._checked[key] = (replicas, source, ok)
        return ok

    def _alike(self, rows: Int64s, before: Int64s, delta: int) -> bool:
        topo = self.topology
        cpd = topo.chips_per_domain
        if delta % cpd or rows.shape != before.shape or not np.array_equal(rows, before + delta):
            return False
        scaleout, paths = topo.scaleout, topo.local_paths
        assert scaleout is not None and paths is not None
        seen = np.zeros(topo.n_chips, dtype=bool)
        seen[before] = True
        chips = np.flatnonzero(seen)
        moved = chips + delta
        cap, lat = topo.capacity_Bps, topo.latency_s
        up, down = scaleout.host_links(chips, chips)
        moved_up, moved_down = scaleout.host_links(moved, moved)
        local = topo.local_links
        pairs = [(up, moved_up), (down, moved_down), (local[chips], local[moved])]
        present = np.zeros(topo.n_domains, dtype=bool)
        present[topo.chip_domain[chips]] = True
        domains = np.flatnonzero(present)
        shift = delta // cpd
        table = paths.domain_links(
            np.concatenate([domains, domains + shift]),
            topo.links_between,
            topo.n_domains,
            check=topo.are_links,
        )
        pairs.append((table[domains].reshape(-1), table[domains + shift].reshape(-1)))
        for a, b in pairs:
            if not (np.array_equal(cap[a], cap[b]) and np.array_equal(lat[a], lat[b])):
                return False
        if self.hbm is not None:
            hbm_cap = self.hbm[1]
            if not np.array_equal(hbm_cap[chips], hbm_cap[moved]):
                return False
        return True

    def _links(self, group: FlowGroup, delta: int) -> Int64s | None:
        """The image of each of ``group``'s links (in the same order), or None if one has
        none or the order changes. Each link must be the link that routing gives its ends
        (a chip's local link, its links to the switch, a torus hop of its domain), and
        its image is the link routing gives the shifted ends."""
        topo = self.topology
        scaleout, paths = topo.scaleout, topo.local_paths
        assert scaleout is not None and paths is not None
        links = group.links
        n_links, n_chips, cpd = topo.n_links, topo.n_chips, topo.chips_per_domain
        own = links[links < n_links]
        hbm = links[own.size :]
        if hbm.size and (self.hbm is None or self.hbm[0] != n_links):
            return None
        u, v = topo.link_u[own].astype(np.int64), topo.link_v[own].astype(np.int64)
        chip_u, chip_v = u < n_chips, v < n_chips
        out = np.full(own.size, -1, dtype=np.int64)
        local = np.flatnonzero(chip_u & (u == v))
        if local.size:
            at = u[local]
            same = topo.local_links[at] == own[local]
            out[local] = np.where(same, topo.local_links[at + delta], -1)
        for mask, chip, side in ((chip_u & ~chip_v, u, 0), (~chip_u & chip_v, v, 1)):
            at = chip[mask]
            if at.size:
                image = scaleout.host_links(at + delta, at + delta)[side]
                same = scaleout.host_links(at, at)[side] == own[mask]
                out[mask] = np.where(same, image, -1)
        torus = np.flatnonzero(chip_u & chip_v & (u != v) & (u // cpd == v // cpd))
        if torus.size:
            a, b = u[torus], v[torus]
            domain = a // cpd
            hop = paths.hop_of()[(a - domain * cpd) * cpd + (b - domain * cpd)]
            table = paths.domain_links(
                domain + delta // cpd, topo.links_between, topo.n_domains, check=topo.are_links
            )
            same = (hop >= 0) & (table[domain, hop] == own[torus])
            out[torus] = np.where(same, table[domain + delta // cpd, hop], -1)
        moved = np.concatenate([out, hbm + delta])
        if (out < 0).any() or (moved.size > 1 and not (moved[1:] > moved[:-1]).all()):
            return None  # a link that no shift maps, or images in another order
        return moved
