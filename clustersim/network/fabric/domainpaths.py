"""Routes inside scale-up domains that are all the same torus, found in bulk.

A torus builder's path function gives, in every domain, the path of the domain's
first one shifted to its chips (``base + local path``). :class:`LocalPaths`
holds those local paths once, for every ordered pair of local chips, as one
table; :meth:`LocalPaths.nodes` gives the node paths of any number of chip pairs
with a few numpy gathers, where asking the path function costs a Python call per
pair (a folded step on 131,072 chips routes 10^6 pairs inside domains).
:meth:`LocalPaths.links` gives their links the same way: each path as local hops
(indices into the domain's list of chip-to-chip links), and each domain's link
ids for those hops, looked up once per domain. :func:`distinct_pairs` merges pairs
that repeat (ranks that share chips), so each distinct path is looked up once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from clustersim.network.fabric._runs import FEW_LINKS

__all__ = ["LocalPaths", "distinct_pairs"]

Int64s = NDArray[np.int64]
Check = Callable[[Int64s, Int64s, Int64s], NDArray[np.bool_]]
"""``check(links, u, v)``: whether link ``links[i]`` runs from node ``u[i]`` to ``v[i]``."""

_STRIDE_FROM = 4
"""New domains from which their links are guessed from the first two's (:func:`_strided`)."""


class LocalPaths:
    """The path of each pair of local chips ``(a, b)`` of a domain of ``chips`` chips, as
    local chip indices from ``a`` to ``b`` (``path(a, b)``, asked once per pair on first use).
    """

    def __init__(self, chips: int, path: Callable[[int, int], Sequence[int]]) -> None:
        self.chips = chips
        self._path = path
        self._table: tuple[Int64s, Int64s] | None = None
        self._hops: tuple[Int64s, Int64s, Int64s] | None = None
        self._domain_links: Int64s | None = None
        """Row ``d``: the link id of each local hop in domain ``d`` (-1: not looked up yet)."""
        self._looked_up: NDArray[np.bool_] = np.zeros(0, dtype=bool)
        """Whether each domain's row has been looked up (a byte per domain is read faster
        than a column of the table)."""

    def _built(self) -> tuple[Int64s, Int64s]:
        """``indptr`` over the pair codes ``a * chips + b``, and the local nodes of each path."""
        if self._table is None:
            n = self.chips
            paths = [list(self._path(a, b)) if a != b else [a] for a in range(n) for b in range(n)]
            lengths = np.fromiter((len(p) for p in paths), dtype=np.int64, count=n * n)
            indptr = np.zeros(n * n + 1, dtype=np.int64)
            np.cumsum(lengths, out=indptr[1:])
            nodes = np.fromiter(
                (x for p in paths for x in p), dtype=np.int64, count=int(indptr[-1])
            )
            self._table = (indptr, nodes)
        return self._table

    def nodes(self, src: Int64s, dst: Int64s) -> tuple[Int64s, Int64s]:
        """The chips along each path ``src[i] -> dst[i]`` (both in one domain), concatenated,
        and the number of chips on each path (1 for a chip to itself)."""
        indptr, local = self._built()
        n = self.chips
        base = src - src % n
        code = (src - base) * n + (dst - base)
        starts = indptr[code]
        lengths = indptr[code + 1] - starts
        # Position j of the output reads local[starts[i] + (j - first[i])] for its path i.
        first = np.zeros(lengths.size, dtype=np.int64)
        np.cumsum(lengths[:-1], out=first[1:])
        shift = np.repeat(starts - first, lengths)
        nodes = local[shift + np.arange(shift.size, dtype=np.int64)] + np.repeat(base, lengths)
        return nodes, lengths

    def _built_hops(self) -> tuple[Int64s, Int64s, Int64s]:
        """``indptr`` over the pair codes, the local hop of each path's links, and the
        ``(from, to)`` local chips of each hop."""
        if self._hops is None:
            indptr, local = self._built()
            n = self.chips
            lengths = np.diff(indptr)
            last = np.zeros(local.size, dtype=bool)
            last[indptr[1:] - 1] = True
            code = local[:-1][~last[:-1]] * n + local[1:][~last[:-1]]
            hops, which = np.unique(code, return_inverse=True)
            hop_ptr = np.zeros(indptr.size, dtype=np.int64)
            np.cumsum(lengths - 1, out=hop_ptr[1:])
            self._hops = (hop_ptr, which.ravel().astype(np.int64), np.stack([hops // n, hops % n]))
        return self._hops

    def links(
        self,
        src: Int64s,
        dst: Int64s,
        find: Callable[[Int64s, Int64s], Int64s],
        n_domains: int,
        *,
        check: Check | None = None,
    ) -> tuple[Int64s, Int64s]:
        """The links along each path ``src[i] -> dst[i]`` (both in one domain), concatenated
        in path order, and the number of links of each path (0 for a chip to itself):
        the links between the chips of :meth:`nodes`. ``find(u, v)`` gives the ids of the
        links ``u[j] -> v[j]`` between chips; the domains are ``0..n_domains-1``; ``check``
        (see :meth:`domain_links`)."""
        hop_ptr, which, _ = self._built_hops()
        n = self.chips
        domain = src // n
        base = domain * n
        code = (src - base) * n + (dst - base)
        starts = hop_ptr[code]
        lengths = hop_ptr[code + 1] - starts
        table = self.domain_links(domain, find, n_domains, check=check)
        first = np.zeros(lengths.size, dtype=np.int64)
        np.cumsum(lengths[:-1], out=first[1:])
        # Entry j of path i reads hop which[starts[i] + j] of its domain's row of the table;
        # the indices are built in place, and the table read flat.
        at = np.repeat(starts - first, lengths)
        at += np.arange(at.size, dtype=np.int64)
        hop = which.take(at)
        at = np.repeat(domain * table.shape[1], lengths)
        at += hop
        return table.reshape(-1).take(at), lengths

    def hop_of(self) -> Int64s:
        """The local hop of each link ``a -> b`` between local chips, at ``a * chips + b``
        (-1 where no path has that hop): the column of :meth:`domain_links` that holds it."""
        _, _, ends = self._built_hops()
        n = self.chips
        out = np.full(n * n, -1, dtype=np.int64)
        out[ends[0] * n + ends[1]] = np.arange(ends.shape[1], dtype=np.int64)
        return out

    def domain_links(
        self,
        domains: Int64s,
        find: Callable[[Int64s, Int64s], Int64s],
        n_domains: int,
        *,
        check: Check | None = None,
    ) -> Int64s:
        """The table of each domain's link id per local hop (``n_domains`` rows, one
        column per hop), with the rows of ``domains`` looked up (the others may be -1).
        With ``check(links, u, v)`` (whether each link runs ``u -> v``), the links of many
        new domains are guessed from the first two's and checked (:func:`_strided`)."""
        _, _, ends = self._built_hops()
        n = self.chips
        table = self._domain_links
        if table is None:
            table = self._domain_links = np.full((n_domains, ends.shape[1]), -1, dtype=np.int64)
            self._looked_up = np.zeros(n_domains, dtype=bool)
        looked_up = self._looked_up
        new = np.unique(domains[~looked_up[domains]]) if ends.shape[1] else domains[:0]
        if new.size:
            at = (new * n)[:, None]
            u, v = at + ends[0], at + ends[1]
            found = None
            if check is not None and new.size >= _STRIDE_FROM:
                found = _strided(new, u, v, find, check)
            if found is None:
                found = find(u.ravel(), v.ravel()).reshape(new.size, -1)
            table[new] = found
            looked_up[new] = True
        return table


def _strided(
    domains: Int64s,
    u: Int64s,
    v: Int64s,
    find: Callable[[Int64s, Int64s], Int64s],
    check: Check,
) -> Int64s | None:
    """The links ``u[i, j] -> v[i, j]`` of the hops of ``domains[i]`` (increasing), guessed.

    A builder that adds every domain's links alike puts domain ``d``'s link of a hop
    at the first domain's plus ``d - domains[0]`` times one stride. The first two
    domains are looked up, a few links at a time (which a link table answers without
    merging its sorted runs: 10^7 links at a million chips), and every guess is
    checked against the links' ends; those that miss are looked up. None when no
    stride fits the first two.
    """
    first = np.concatenate(
        [
            find(u[:2].ravel()[i : i + FEW_LINKS], v[:2].ravel()[i : i + FEW_LINKS])
            for i in range(0, 2 * u.shape[1], FEW_LINKS)
        ]
    ).reshape(2, -1)
    step = first[1] - first[0]
    apart = int(domains[1] - domains[0])
    if (step != step[0]).any() or step[0] % apart:
        return None
    out: Int64s = first[0] + (domains - domains[0])[:, None] * (step[0] // apart)
    miss = ~check(out.ravel(), u.ravel(), v.ravel()).reshape(out.shape)
    if miss.any():
        out[miss] = find(u[miss], v[miss])
    return out


def distinct_pairs(
    src: Int64s,
    dst: Int64s,
    domain: Int64s,
    chips: int,
    n_domains: int,
    *,
    times: Int64s | None = None,
) -> tuple[Int64s, Int64s, Int64s]:
    """The distinct pairs ``(src[i], dst[i])`` of chips inside domains of ``chips`` chips
    (``0..chips-1``, ``chips..2*chips-1``, ...; ``n_domains`` of them), the domain of each
    pair being ``domain[i]``, and how often each occurs (with ``times``: the sum of
    ``times[i]`` over its occurrences), in the order of their domains and local chips.
    With few pairs of local chips per entry, a count per pair replaces the sort."""
    present = np.zeros(n_domains, dtype=bool)
    present[domain] = True
    ids = np.flatnonzero(present)
    at = np.cumsum(present) - 1
    pair = chips * chips
    # (at * chips + src - base) * chips + dst - base, with base = domain * chips, in place.
    base = domain * chips
    key = at[domain]
    key *= chips
    key -= base
    key += src
    key *= chips
    key += dst
    key -= base
    # Whole numbers of flows: their sums in floating point are exact.
    if ids.size * pair <= 4 * key.size:
        per_key = np.bincount(key, weights=times, minlength=ids.size * pair)
        keys = np.flatnonzero(per_key)
        counts = per_key[keys]
    elif times is None:
        keys, counts = np.unique(key, return_counts=True)
    else:
        keys, inverse = np.unique(key, return_inverse=True)
        counts = np.bincount(inverse.ravel(), weights=times, minlength=keys.size)
    base = ids[keys // pair] * chips
    local = keys % pair
    return base + local // chips, base + local % chips, counts.astype(np.int64)
