"""Nodes and directed links in numpy columns: the storage under a :class:`~.topology.Topology`.

A :class:`LinkTable` numbers its nodes (tuples such as ``("chip", 3)`` or
``("spine", 2, 5)``) and its links in the order they are added. Each link has a
source and a target node id, a nominal capacity (the total over its ``lanes``
parallel lanes), a current capacity (``nominal x lanes_up / lanes``, zero when
down), a latency and a kind. Links are added in bulk (:meth:`LinkTable.add_links`)
and looked up by their endpoints through a sorted array of packed ``u << 32 | v``
keys, so that tables of millions of links stay compact and fast to build: node ids
and the sorted keys' link indices are 32-bit, lanes 16-bit, and the current capacities are
the nominal ones (one array) until a link loses lanes or capacity.

Every change of links or lanes increments :attr:`LinkTable.version` and calls
:meth:`LinkTable._changed`, which subclasses extend to drop their caches, and
which notifies listeners (:meth:`LinkTable.add_listener`).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

from clustersim.errors import SimulationError
from clustersim.network.fabric import _runs
from clustersim.network.fabric._column import Column as _Column
from clustersim.network.fabric._runs import FEW_LINKS, Run, merge_runs, search_runs

__all__ = ["KINDS", "Int64s", "LinkKind", "LinkState", "LinkTable", "Node", "node_name"]

Node: TypeAlias = tuple[str | int, ...]
"""A graph node: ``("chip", i)``, ``("switch", instance)``, ``("efa",)``, ..."""

LinkState = Literal["up", "down", "degraded"]
LinkKind = Literal["local", "neuronlink", "switch", "efa"]
KINDS: tuple[LinkKind, ...] = ("local", "neuronlink", "switch", "efa")

Int64s: TypeAlias = NDArray[np.int64]
Int32s: TypeAlias = NDArray[np.int32]

_MAX_LANES = int(np.iinfo(np.int16).max)
"""Lanes of one link at most (16 bits)."""
_UNSORTED_MAX = 256
"""Links added since the last sort are searched linearly up to this many."""


def node_name(node: Node) -> str:
    """``chip3``, ``efa``, ``switch0``, ``spine2_5``: the first two parts joined, then ``_``."""
    head = "".join(str(part) for part in node[:2])
    return "_".join([head, *(str(part) for part in node[2:])])


class LinkTable:
    """Numbered nodes and directed links, with capacities, latencies and lane state."""

    def __init__(self, name: str, nodes: Iterable[Node] = (), *, chips: int = 0) -> None:
        self.name = name
        self.version = 0
        """Incremented whenever links or their state change; caches keyed on routes compare it."""
        self._chips = chips
        """Nodes ``0..chips-1`` are ``("chip", i)``, numbered without being stored: a
        million chips would hold 190 MB of tuples and dictionary entries."""
        self._nodes: list[Node] = []
        """The other nodes, from id ``chips`` on."""
        self._node_id: dict[Node, int] = {}
        # Node ids in 32 bits and lanes in 16: a table of 10^7 links holds 20 bytes less per link.
        self._u = _Column(np.int32)
        self._v = _Column(np.int32)
        self._nominal = _Column(np.float64)
        self._capacity: NDArray[np.float64] | None = None
        """The current capacities, once one differs from its nominal (None until then)."""
        self._latency = _Column(np.float64)
        self._lanes = _Column(np.int16)
        self._lanes_up = _Column(np.int16)
        self._kind = _Column(np.int8)
        self._sorted: Run = (np.zeros(0, np.int64), np.zeros(0, np.int32))
        self._runs: list[Run] = []
        """Sorted runs of the keys added after ``_sorted``'s, merged at the next bulk lookup."""
        self._run_end = 0
        """Keys before this one are in ``_sorted`` or a run; the rest are searched linearly."""
        self._top = (-1, -1)  # the largest source and the largest target of any link
        self._n_down = 0
        self._factors: dict[int, float] = {}
        self._names: NDArray[np.str_] | None = None
        self._listeners: list[weakref.WeakMethod[Callable[[], None]]] = []
        self.add_nodes(nodes)

    # -- nodes ----------------------------------------------------------------------------------

    def add_nodes(self, nodes: Iterable[Node]) -> Int64s:
        """Add nodes; return their ids. Existing nodes keep their ids.

        New nodes are numbered in order of first appearance. The work is done by
        dict and list operations over the whole batch, not a Python loop per node:
        a topology of 10^6 chips adds 10^6 nodes at once.
        """
        batch = nodes if isinstance(nodes, list) else list(nodes)
        known = self._node_id
        start = self.n_nodes
        chips = self._chips and any(node[:1] == ("chip",) for node in batch)
        if not chips and (not known or known.keys().isdisjoint(batch)):
            numbered = dict(zip(batch, range(start, start + len(batch)), strict=True))
            if len(numbered) == len(batch):  # all new and distinct: the common case
                self._nodes.extend(batch)
                known.update(numbered)
                return np.arange(start, start + len(batch), dtype=np.int64)
        fresh = [node for node in dict.fromkeys(batch) if self._id_of(node) is None]
        self._nodes.extend(fresh)
        known.update(zip(fresh, range(start, start + len(fresh)), strict=True))
        return np.fromiter(map(self._id_of, batch), dtype=np.int64, count=len(batch))

    def _id_of(self, node: Node) -> int | None:
        """The id of ``node``, or None if it is not one of the table's."""
        if len(node) == 2 and node[0] == "chip":
            i = node[1]
            if isinstance(i, int | np.integer) and not isinstance(i, bool) and 0 <= i < self._chips:
                return int(i)
        return self._node_id.get(node)

    def node_id(self, node: Node) -> int:
        found = self._id_of(node)
        if found is None:
            raise SimulationError(f"topology {self.name!r} has no node {node}")
        return found

    def node(self, node_id: int) -> Node:
        if 0 <= node_id < self._chips:
            return ("chip", int(node_id))
        return self._nodes[node_id - self._chips]

    def nodes(self) -> Iterator[Node]:
        """Every node, in the order of their ids."""
        return itertools.chain(zip(itertools.repeat("chip"), range(self._chips)), self._nodes)

    @property
    def n_nodes(self) -> int:
        return self._chips + len(self._nodes)

    # -- links ----------------------------------------------------------------------------------

    def add_links(
        self,
        u: ArrayLike,
        v: ArrayLike,
        *,
        capacity_Bps: ArrayLike,
        latency_s: ArrayLike,
        lanes: int = 1,
        kind: LinkKind,
    ) -> Int64s:
        """Add directed links ``u[i] -> v[i]`` between node ids, in bulk; return their indices.

        ``capacity_Bps`` is each link's total over its ``lanes`` lanes; losing a lane
        scales it by ``lanes_up / lanes``. A second link between the same nodes is an
        error: model parallel cables as lanes of one link.
        """
        uu = np.atleast_1d(np.asarray(u, dtype=np.int64))
        vv = np.atleast_1d(np.asarray(v, dtype=np.int64))
        m = uu.size
        if vv.size != m:
            raise SimulationError(f"topology {self.name!r}: {m} sources but {vv.size} targets")
        cap = np.broadcast_to(np.asarray(capacity_Bps, dtype=np.float64), (m,))
        lat = np.broadcast_to(np.asarray(latency_s, dtype=np.float64), (m,))
        n_nodes = self.n_nodes
        if m and (min(uu.min(), vv.min()) < 0 or max(uu.max(), vv.max()) >= n_nodes):
            raise SimulationError(f"topology {self.name!r}: link endpoints outside 0..{n_nodes}")
        bad = ~((cap > 0) & np.isfinite(cap) & (lat >= 0) & np.isfinite(lat))
        if bad.any() or not 1 <= lanes <= _MAX_LANES:
            i = int(np.argmax(bad))
            raise SimulationError(
                f"topology {self.name!r}: link {self.node(int(uu[i]))} -> "
                f"{self.node(int(vv[i]))} needs capacity > 0, latency >= 0 and lanes in "
                f"1..{_MAX_LANES} (got {cap[i]}, {lat[i]}, {lanes})"
            )
        if n_nodes > np.iinfo(np.int32).max:
            raise SimulationError(f"topology {self.name!r}: more than 2^31 nodes")
        keys = (uu << 32) | vv
        # One sort of the new keys finds their repeats (all but the first of each), speeds
        # the search of the table (queries in order) and becomes their run (_add_run).
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        if m > FEW_LINKS and self._u.n > self._run_end:
            self._add_run()  # the tail first: the new keys can then be a run of their own
        # Only a link whose source and target both have links already can repeat one: a
        # builder's links to new switches are not searched for.
        top_u, top_v = self._top
        seen = (uu <= top_u) & (vv <= top_v)
        dup = _runs.repeats(ordered, order, seen, lambda found: self._find(found, merge=False))
        if dup.any():
            i = int(np.argmax(dup))
            raise SimulationError(
                f"topology {self.name!r}: duplicate link {self.node(int(uu[i]))} -> "
                f"{self.node(int(vv[i]))}"
            )
        start = self._u.n
        self._top = (max(top_u, int(uu.max(initial=-1))), max(top_v, int(vv.max(initial=-1))))
        self._u.extend(uu)
        self._v.extend(vv)
        self._nominal.extend(cap)
        if self._capacity is not None:
            self._capacity = np.concatenate([self._capacity, cap])
        self._latency.extend(lat)
        self._lanes.extend(np.full(m, lanes, dtype=np.int16), fresh=True)
        self._lanes_up.extend(np.full(m, lanes, dtype=np.int16), fresh=True)
        self._kind.extend(np.full(m, KINDS.index(kind), dtype=np.int8), fresh=True)
        if self._u.n - self._run_end > _UNSORTED_MAX:
            self._add_run((ordered, order) if self._run_end == start else None)
        self._names = None
        self._changed()
        return np.arange(start, start + m, dtype=np.int64)

    def add_link(
        self,
        u: Node,
        v: Node,
        *,
        capacity_Bps: float,
        latency_s: float,
        lanes: int = 1,
        kind: LinkKind,
    ) -> int:
        """Add one directed link ``u -> v`` (nodes are added as needed); return its index."""
        uid, vid = self.add_nodes((u, v))
        (link,) = self.add_links(
            uid, vid, capacity_Bps=capacity_Bps, latency_s=latency_s, lanes=lanes, kind=kind
        )
        return int(link)

    def add_duplex(
        self,
        u: Node,
        v: Node,
        *,
        capacity_Bps: float,
        latency_s: float,
        lanes: int = 1,
        kind: LinkKind,
    ) -> tuple[int, int]:
        """Add ``u -> v`` and ``v -> u`` with the same figures; return both indices."""
        a = self.add_link(
            u, v, capacity_Bps=capacity_Bps, latency_s=latency_s, lanes=lanes, kind=kind
        )
        b = self.add_link(
            v, u, capacity_Bps=capacity_Bps, latency_s=latency_s, lanes=lanes, kind=kind
        )
        return a, b

    def add_duplex_links(
        self,
        u: ArrayLike,
        v: ArrayLike,
        *,
        capacity_Bps: ArrayLike,
        latency_s: ArrayLike,
        lanes: int = 1,
        kind: LinkKind,
    ) -> tuple[Int64s, Int64s]:
        """:meth:`add_links` in both directions; return the forward and the reverse indices."""
        fwd = self.add_links(
            u, v, capacity_Bps=capacity_Bps, latency_s=latency_s, lanes=lanes, kind=kind
        )
        rev = self.add_links(
            v, u, capacity_Bps=capacity_Bps, latency_s=latency_s, lanes=lanes, kind=kind
        )
        return fwd, rev

    @property
    def n_links(self) -> int:
        return self._u.n

    @property
    def capacity_Bps(self) -> NDArray[np.float64]:
        """Current per-direction capacity of each link (zero when down). Do not modify.

        While every link has its nominal capacity this is :attr:`nominal_Bps` (read-only);
        the first change of lanes or capacity makes it an array of its own.
        """
        if self._capacity is None:
            return self.nominal_Bps
        return self._capacity

    @property
    def nominal_Bps(self) -> NDArray[np.float64]:
        """Capacity of each link with all its lanes up (a read-only array)."""
        nominal = self._nominal.view
        nominal.flags.writeable = False
        return nominal

    def capacity_with(self, tail: NDArray[np.float64]) -> NDArray[np.float64]:
        """:attr:`capacity_Bps` followed by ``tail``; while every capacity is nominal, one
        read-only array whose head is :attr:`nominal_Bps` from then on (held once)."""
        if self._capacity is not None:
            return np.concatenate([self._capacity, tail])
        return self._nominal.joined(np.asarray(tail, dtype=np.float64))

    def _current(self) -> NDArray[np.float64]:
        """The current capacities, as an array of their own (to change some)."""
        if self._capacity is None:
            self._capacity = self._nominal.view.copy()
        return self._capacity

    @property
    def latency_s(self) -> NDArray[np.float64]:
        return self._latency.view

    @property
    def link_u(self) -> Int32s:
        """Source node id of each link."""
        return self._u.view

    @property
    def link_v(self) -> Int32s:
        """Target node id of each link."""
        return self._v.view

    @property
    def kinds(self) -> NDArray[np.str_]:
        """Kind of each link (``local``, ``neuronlink``, ``switch``, ``efa``)."""
        out: NDArray[np.str_] = np.asarray(KINDS, dtype=np.str_)[self._kind.view]
        return out

    @property
    def names(self) -> NDArray[np.str_]:
        """``chip0->chip1``, ``chip3:local``, ``leaf2->spine2_5``, ...: one per link (lazily)."""
        if self._names is None:
            names = [node_name(node) for node in self.nodes()]
            pairs = zip(self._u.view.tolist(), self._v.view.tolist(), strict=True)
            self._names = np.asarray(
                [f"{names[u]}:local" if u == v else f"{names[u]}->{names[v]}" for u, v in pairs],
                dtype=np.str_,
            )
        return self._names

    def link_name(self, link: int) -> str:
        u, v = self.endpoints(link)
        return f"{node_name(u)}:local" if u == v else f"{node_name(u)}->{node_name(v)}"

    def link(self, u: Node, v: Node) -> int:
        """Index of the link ``u -> v``."""
        uid, vid = self._id_of(u), self._id_of(v)
        found = -1
        if uid is not None and vid is not None:
            found = int(self._find(np.asarray([uid << 32 | vid], dtype=np.int64))[0])
        if found < 0:
            raise SimulationError(f"topology {self.name!r} has no link {u} -> {v}")
        return found

    def links_between(self, u: ArrayLike, v: ArrayLike) -> Int64s:
        """Indices of the links ``u[i] -> v[i]`` between node ids; an error if one is missing."""
        uu = np.asarray(u, dtype=np.int64)
        vv = np.asarray(v, dtype=np.int64)
        found = self._find((uu << 32) | vv)
        if found.size and found.min() < 0:
            i = int(np.argmin(found))
            raise SimulationError(
                f"topology {self.name!r} has no link {self.node(int(uu.flat[i]))} -> "
                f"{self.node(int(vv.flat[i]))}"
            )
        return found

    def are_links(self, links: Int64s, u: Int64s, v: Int64s) -> NDArray[np.bool_]:
        """Whether link ``links[i]`` runs from node ``u[i]`` to ``v[i]`` (False for no link)."""
        ok: NDArray[np.bool_] = (links >= 0) & (links < self.n_links)
        at = np.where(ok, links, 0)
        return ok & (self._u.take(at) == u) & (self._v.take(at) == v) if self.n_links else ok

    def endpoints(self, link: int) -> tuple[Node, Node]:
        return self.node(int(self._u.view[link])), self.node(int(self._v.view[link]))

    def _add_run(self, done: tuple[Int64s, Int64s] | None = None) -> None:
        """Sort the keys not yet in a run into one (a builder adds links in a few bulk calls:
        each is sorted once, and the runs are merged at the first bulk lookup); ``done``:
        those keys already sorted, and the stable order that sorts them."""
        start = self._run_end
        if done is None:
            keys = self._keys_since(start)
            order = np.argsort(keys, kind="stable")
            done = keys[order], order
        self._runs.append((done[0], done[1].astype(np.int32) + np.int32(start)))
        self._run_end = self._u.n

    def _keys_since(self, start: int) -> Int64s:
        """The packed keys of the links from index ``start`` on."""
        keys = self._u.since(start).astype(np.int64)
        keys <<= 32
        keys |= self._v.since(start)
        return keys

    def _merge_runs(self) -> None:
        """Merge the runs into the sorted keys."""
        runs = [self._sorted, *self._runs]
        self._runs = []
        self._sorted = (np.zeros(0, np.int64), np.zeros(0, np.int32))
        self._sorted = merge_runs(runs)

    def _find(self, keys: Int64s, *, merge: bool = True) -> Int64s:
        """Link index of each packed ``u << 32 | v`` key, or -1. A bulk lookup sorts the
        keys added since the last one first (and, with ``merge``, merges the runs)."""
        if keys.size > FEW_LINKS:
            if self._u.n > self._run_end:
                self._add_run()  # cheaper than comparing the lookup with the unsorted tail
            if merge and self._runs:
                self._merge_runs()
        out = search_runs([self._sorted, *self._runs], keys)
        return _runs.search_tail(keys, out, self._keys_since(self._run_end), self._run_end)

    # -- state ----------------------------------------------------------------------------------

    def state(self, link: int) -> LinkState:
        up, lanes = int(self._lanes_up.view[link]), int(self._lanes.view[link])
        return "down" if up == 0 else ("up" if up == lanes else "degraded")

    def lanes(self, link: int) -> int:
        return int(self._lanes.view[link])

    def lanes_up(self, link: int) -> int:
        return int(self._lanes_up.view[link])

    @property
    def links_down(self) -> int:
        return self._n_down

    def set_lanes_up(self, link: int, lanes_up: int) -> None:
        """Set how many lanes of ``link`` work; 0 takes it down.

        The link's capacity becomes ``nominal x lanes_up / lanes``; caches are dropped
        and listeners told.
        """
        if not 0 <= link < self.n_links:
            raise SimulationError(f"topology {self.name!r} has links 0..{self.n_links - 1}")
        lanes = int(self._lanes.view[link])
        if not 0 <= lanes_up <= lanes:
            raise SimulationError(
                f"link {self.link_name(link)} has {lanes} lanes (got lanes_up {lanes_up})"
            )
        before = int(self._lanes_up.view[link])
        self._n_down += (lanes_up == 0) - (before == 0)
        self._lanes_up.view[link] = lanes_up
        factor = self._factors.get(link, 1.0)
        self._current()[link] = float(self._nominal.view[link]) * lanes_up / lanes * factor
        self._state_changed(link)
        self._changed()

    def capacity_factor(self, link: int) -> float:
        """The factor set by :meth:`set_capacity_factor` (1 by default)."""
        return self._factors.get(int(link), 1.0)

    def set_capacity_factor(self, links: ArrayLike, factor: float) -> None:
        """Scale the capacity of ``links`` by ``factor`` (0 <= factor <= 1), on top of their lanes.

        Below 1 the link is degraded; at 0 it has failed but routing has not noticed
        yet (routes still cross it and the flows on it stall). The factor survives
        lane changes; 1 restores the lanes' capacity. Listeners are told once.
        """
        ids = np.atleast_1d(np.asarray(links, dtype=np.int64))
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_links):
            raise SimulationError(f"topology {self.name!r} has links 0..{self.n_links - 1}")
        if not 0.0 <= factor <= 1.0:
            raise SimulationError(f"a capacity factor is within 0..1 (got {factor})")
        for link in ids.tolist():
            if factor == 1.0:
                self._factors.pop(link, None)
            else:
                self._factors[link] = float(factor)
            up, lanes = int(self._lanes_up.view[link]), int(self._lanes.view[link])
            self._current()[link] = float(self._nominal.view[link]) * up / lanes * factor
            self._state_changed(link)
        self._changed()

    def set_link_state(self, link: int, state: Literal["up", "down"]) -> None:
        """Take a link fully down, or restore all of its lanes."""
        self.set_lanes_up(link, 0 if state == "down" else int(self._lanes.view[link]))

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call the bound method ``callback()`` after every change of links or lanes.

        Held by weak reference: a listener that is no longer used is dropped.
        """
        self._listeners.append(weakref.WeakMethod(callback))

    def _state_changed(self, link: int) -> None:
        """Hook: the lanes of ``link`` changed."""

    def _changed(self) -> None:
        self.version += 1
        alive = []
        for ref in self._listeners:
            fn = ref()
            if fn is not None:
                alive.append(ref)
                fn()
        self._listeners = alive

    def _usable(self) -> NDArray[np.bool_] | None:
        """Mask of links with a lane up; None when every link is up."""
        return None if not self._n_down else self._lanes_up.view > 0
