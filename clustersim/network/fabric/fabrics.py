"""Scale-out (EFA) fabrics, registered by the name used in ``efa.fabric``.

- ``nonblocking`` (the default): one non-blocking switch ``("efa",)``; every
  chip has an up and a down link to it.
- ``fat_tree`` (alias ``clos``): a folded Clos of ``efa.tiers`` switch tiers
  built from switches of ``efa.radix`` ports. Consecutive chips (whole instances
  where they fit) attach to leaf switches.
- ``rail``: rail-optimised. Chip ``i`` of every instance attaches to rail switch
  ``i`` of its group of instances, and the rail switches are the leaves of the
  same Clos of spine tiers.

**Chips and NICs.** A chip's link to its leaf carries its share of the instance's
EFA bandwidth (``efa.bandwidth_Bps / chips``, times the chip's link efficiency)
with half the one-way EFA latency; a NIC shared by several chips, or several
NICs of one chip, are aggregated into that one link. For counting switch ports a
chip uses ``efa.nics / chips`` ports, and its traffic to another leaf spreads
over as many equal-cost paths (``spread``; each port is a flow of its own to
ECMP), so one chip's flow across leaves gets its whole share at oversubscription
1, as on the non-blocking fabric.

**Ports and oversubscription.** A leaf switch gives ``D = floor(radix * o / (1 +
o))`` ports to chips and ``U = radix - D`` to the tier above, for an
oversubscription ``o = efa.oversubscription``. Higher switches give half their
ports down and half up, and the top tier all of them down, so that the tiers
above the leaves are non-blocking. Capacities follow ``o`` exactly rather than
the port counts: every switch-to-switch link carries ``(chips on a leaf x chip
link) / (o x U)``, so a full leaf's uplinks carry exactly ``1/o`` of what its
chips can inject. With ``efa.oversubscription_at: top`` the leaves split their
ports evenly and every tier is non-blocking but the links into the top tier,
which carry ``1/o`` of what the pods below can send: the shape of UltraCluster
networks, non-blocking in a pod and oversubscribed between pods. Parallel cables
between two switches are one link.
Switch-to-switch hops add :data:`SWITCH_HOP_LATENCY_S` each.

**Routing.** A pair goes up to the lowest tier whose subtree holds both leaves
and down again (shortest paths). Of the ``U x (radix/2)^(t-1)`` equal-cost
paths that turn at tier ``t + 1``, a pair takes path ``(slot of dst + hash(src
subtree, dst subtree)) mod paths``, where slots number the chips leaf by leaf
and the subtrees are those below the turning tier. Consecutive destinations
between two subtrees thus use distinct uplinks, so rings, shifts and
rail-aligned traffic spread evenly (like D-mod-k routing in InfiniBand fat
trees), while the salt decorrelates different subtree pairs (like flow-hash
ECMP). When a link on that path is down, the pair takes another equal-cost path
(pseudo-random probes, then a sweep), and falls back to general routing when
every one is cut.

The routes are computed in bulk with numpy, and never stored per pair: building
a 16,384-chip three-tier fabric takes well under a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from clustersim.catalog.schema import EfaSpec
from clustersim.errors import ScenarioError
from clustersim.network.fabric.registry import register_fabric
from clustersim.network.fabric.topology import EFA_NODE, Int64s, Node, Topology, ecmp_hash

__all__ = [
    "SWITCH_HOP_LATENCY_S",
    "TreeFabric",
    "attach_fat_tree",
    "attach_nonblocking",
    "attach_rail",
    "leaf_ports",
]

SWITCH_HOP_LATENCY_S = 0.5e-6
"""One Ethernet switch-to-switch hop (default: cut-through data-centre switches
forward in about 0.3-1 us; the chip-to-leaf links carry the measured
HBM-to-HBM EFA latency)."""

_PROBES = 8
"""Pseudo-random equal-cost alternatives tried before sweeping all of them."""
_SALT_TABLE = 1 << 16
"""Pairs of subtrees of a level up to which their hashes are kept as one table."""


@dataclass(frozen=True, eq=False)
class TreeFabric:
    """Up-down routes over a folded Clos with ``levels`` switch tiers (level 0 = leaves).

    A level-``j`` switch is numbered ``block * width[j] + column``: ``block`` is
    the group of ``span[j]`` consecutive leaves below it and ``column`` in
    ``0..width[j]-1`` says which of the block's equal-cost switches it is. Port
    ``t`` of switch ``(b, c)`` at level ``j`` leads up to switch ``(b', c + width[j]
    * t)`` at level ``j + 1``; ``up[j][switch, t]`` is that link and
    ``down[j][switch, t]`` the link back.
    """

    name: str
    leaf_of: Int64s
    """Leaf switch of each chip."""
    pos: Int64s
    """Position of each chip on its leaf."""
    per_leaf: int
    """Chip positions per leaf: a destination's slot is ``leaf * per_leaf + pos``."""
    host_up: Int64s
    host_down: Int64s
    span: tuple[int, ...]
    width: tuple[int, ...]
    ports: tuple[int, ...]
    up: tuple[Int64s, ...]
    down: tuple[Int64s, ...]
    spread: int = 1
    """NIC ports per chip: its traffic to another leaf spreads over this many paths."""
    _salts: dict[int, tuple[int, Int64s]] = field(default_factory=dict, repr=False)
    """Per level: how many subtrees it has, and the hash of each pair of them (or none)."""

    @property
    def levels(self) -> int:
        return len(self.width)

    @property
    def private(self) -> bool:
        """See :class:`~clustersim.network.fabric.scaleout.ScaleOut`: one tier, no switch-to-switch
        links (the ``nonblocking`` fabric)."""
        return self.levels == 1 and not self.up

    def host_links(self, src: Int64s, dst: Int64s) -> tuple[Int64s, Int64s]:
        """See :class:`~clustersim.network.fabric.scaleout.ScaleOut`."""
        return self.host_up[src], self.host_down[dst]

    def paths(
        self,
        src: Int64s,
        dst: Int64s,
        usable: NDArray[np.bool_] | None,
        offset: Int64s | None = None,
    ) -> tuple[Int64s, NDArray[np.bool_]]:
        """See :class:`~clustersim.network.fabric.scaleout.ScaleOut`."""
        out, ok, _ = self.paths_turning(src, dst, usable, offset)
        return out, ok

    def paths_turning(
        self,
        src: Int64s,
        dst: Int64s,
        usable: NDArray[np.bool_] | None,
        offset: Int64s | None = None,
    ) -> tuple[Int64s, NDArray[np.bool_], Int64s]:
        """:meth:`paths`, and the level each pair's path turns at (``m``: its first ``2m + 2``
        columns are links, the others -1)."""
        ls, ld = self.leaf_of[src], self.leaf_of[dst]
        top = np.zeros(src.size, dtype=np.int64)
        apart = ls != ld
        for j in range(1, self.levels):
            together = apart & (_div(ls, self.span[j]) == _div(ld, self.span[j]))
            top[together] = j
            apart &= ~together
        per_level = np.bincount(top, minlength=self.levels)
        last = self.levels - 1
        if per_level[last] == src.size:  # every pair turns at the top: no -1 to fill
            out = np.empty((src.size, 2 * self.levels), dtype=np.int64)
        else:
            out = np.full((src.size, 2 * self.levels), -1, dtype=np.int64)
        ok = np.ones(src.size, dtype=bool)
        for m in np.flatnonzero(per_level).tolist():
            # Pairs that all turn at one level (every pair, on a non-blocking fabric)
            # need no gathering.
            whole = per_level[m] == src.size
            rows = np.arange(src.size) if whole else np.flatnonzero(top == m)
            s, d = (src, dst) if whole else (src[rows], dst[rows])
            lsm, ldm = (ls, ld) if whole else (ls[rows], ld[rows])
            width = self.width[m]
            if width > 1:
                salt = self._salt(lsm, ldm, m)
                if offset is not None:
                    salt = salt + (offset if whole else offset[rows])
                p = _mod(ldm * self.per_leaf + self.pos[d] + salt, width)
            else:  # a single path: number 0
                p = np.zeros(s.size, dtype=np.int64)
            fill = whole and 2 * m + 2 == out.shape[1]
            links = self._links(s, d, p, m, leaves=(lsm, ldm), out=out if fill else None)
            if usable is not None:
                bad = ~usable[links].all(axis=1)
                if bad.any():
                    fixed, good = self._detour(s[bad], d[bad], p[bad], m, usable)
                    links[bad] = fixed
                    ok[rows[bad]] = good
            if not fill:
                out[rows, : links.shape[1]] = links
        return out, ok, top

    def _salt(self, ls: Int64s, ld: Int64s, m: int) -> Int64s:
        """The hash of the subtrees below level ``m`` of the leaves ``ls`` and ``ld``; from a
        table of every pair of subtrees where there are few (kept per level)."""
        block = self.span[m]
        a, b = _div(ls, block), _div(ld, block)
        found = self._salts.get(m)
        if found is None:
            n = int(self.leaf_of.max()) // block + 1 if self.leaf_of.size else 1
            every = np.arange(n if n * n <= _SALT_TABLE else 0, dtype=np.int64)
            found = self._salts[m] = (n, ecmp_hash(np.repeat(every, n), np.tile(every, n)))
        n, table = found
        if not table.size:
            return ecmp_hash(a, b)
        out: Int64s = table[a * n + b]
        return out

    def _links(
        self,
        s: Int64s,
        d: Int64s,
        p: Int64s,
        m: int,
        *,
        leaves: tuple[Int64s, Int64s] | None = None,
        out: Int64s | None = None,
    ) -> Int64s:
        """The ``2m + 2`` links of each pair's path up to level ``m`` along path number ``p``
        (``leaves``: the pairs' leaves, if known), written into ``out`` if given."""
        ls, ld = (self.leaf_of[s], self.leaf_of[d]) if leaves is None else leaves
        if out is None:
            out = np.empty((s.size, 2 * m + 2), dtype=np.int64)
        out[:, 0] = self.host_up[s]
        for j in range(m):
            # Switch (block, column) of level j and its up port t, as one index of up[j].
            col = _mod(p, self.width[j])
            port = _mod(_div(p, self.width[j]), self.ports[j])
            up_at = (_div(ls, self.span[j]) * self.width[j] + col) * self.ports[j] + port
            down_at = (_div(ld, self.span[j]) * self.width[j] + col) * self.ports[j] + port
            out[:, 1 + j] = self.up[j].reshape(-1).take(up_at)
            out[:, 2 * m - j] = self.down[j].reshape(-1).take(down_at)
        out[:, 2 * m + 1] = self.host_down[d]
        return out

    def _detour(
        self, s: Int64s, d: Int64s, p: Int64s, m: int, usable: NDArray[np.bool_]
    ) -> tuple[Int64s, NDArray[np.bool_]]:
        """Other equal-cost paths for pairs whose path ``p`` is cut; ``ok`` False if none is up."""
        out = self._links(s, d, p, m)
        host_ok = usable[self.host_up[s]] & usable[self.host_down[d]]
        left = np.flatnonzero(host_ok)
        width = self.width[m]
        if m == 0 or width == 1:
            return out, np.zeros(s.size, dtype=bool)
        found = np.zeros(s.size, dtype=bool)
        probes = min(_PROBES, width - 1)
        # Pseudo-random probes spread the displaced pairs over the surviving paths, as
        # ECMP rehashing does; the sweep then guarantees an answer in `width` tries.
        for attempt in range(1, probes + width):
            if not left.size:
                break
            if attempt <= probes:
                step = 1 + ecmp_hash(s[left] * 64 + attempt, d[left]) % (width - 1)
            else:
                step = np.full(left.size, attempt - probes, dtype=np.int64)
            trial = self._links(s[left], d[left], (p[left] + step) % width, m)
            good = usable[trial].all(axis=1)
            out[left[good]] = trial[good]
            found[left[good]] = True
            left = left[~good]
        return out, found


def _div(a: Int64s, k: int) -> Int64s:
    """``a // k`` of non-negative ``a``: a shift where ``k`` is a power of two."""
    if k & (k - 1) == 0:
        return a >> (k.bit_length() - 1)
    out: Int64s = a // k
    return out


def _mod(a: Int64s, k: int) -> Int64s:
    """``a % k`` of non-negative ``a``: a mask where ``k`` is a power of two."""
    if k & (k - 1) == 0:
        return a & (k - 1)
    out: Int64s = a % k
    return out


def leaf_ports(efa: EfaSpec) -> tuple[int, int]:
    """``(down, up)`` ports of a leaf switch for ``efa.radix`` and ``efa.oversubscription``
    (1 at the leaves when the oversubscription is at the top tier)."""
    o = efa.oversubscription if _at_leaf(efa) else 1.0
    down = math.floor(efa.radix * o / (1 + o) + 1e-9)
    return down, efa.radix - down


def _at_leaf(efa: EfaSpec) -> bool:
    """Whether the oversubscription is at the leaves' uplinks (with one tier above
    the leaves, the top tier's links are theirs)."""
    return efa.oversubscription_at == "leaf" or efa.tiers <= 2


def _host_links(
    topo: Topology, leaf_ids: Int64s, leaf_of: Int64s, efa: EfaSpec, link_efficiency: float
) -> tuple[Int64s, Int64s, float]:
    cap = efa.bandwidth_Bps / topo.chips_per_instance * link_efficiency
    chips = np.arange(topo.n_chips, dtype=np.int64)
    up, down = topo.add_duplex_links(
        chips, leaf_ids[leaf_of], capacity_Bps=cap, latency_s=efa.latency_s / 2, kind="efa"
    )
    return up, down, cap


@register_fabric("nonblocking")
def attach_nonblocking(topo: Topology, efa: EfaSpec, link_efficiency: float, path: str) -> None:
    """One non-blocking switch ``("efa",)``: each chip has its share of the instance's EFA
    bandwidth up and down, with half the one-way latency each."""
    del path
    (efa_id,) = topo.add_nodes([EFA_NODE])
    leaf_of = np.zeros(topo.n_chips, dtype=np.int64)
    up, down, _ = _host_links(topo, np.asarray([efa_id]), leaf_of, efa, link_efficiency)
    topo.scaleout = TreeFabric(
        "nonblocking",
        leaf_of,
        np.arange(topo.n_chips, dtype=np.int64),
        topo.n_chips,
        up,
        down,
        span=(1,),
        width=(1,),
        ports=(),
        up=(),
        down=(),
    )


def _chips_per_port(topo: Topology, efa: EfaSpec) -> float:
    return topo.chips_per_instance / efa.nics


@register_fabric("fat_tree")
@register_fabric("clos")
def attach_fat_tree(topo: Topology, efa: EfaSpec, link_efficiency: float, path: str) -> None:
    """A folded Clos: consecutive chips share a leaf (whole instances when they fit)."""
    down_ports, _ = _check_ports(efa, path)
    cpi = topo.chips_per_instance
    fits = max(1, math.floor(down_ports * _chips_per_port(topo, efa) + 1e-9))
    if fits >= cpi:
        per_leaf = fits - fits % cpi
    else:
        per_leaf = max(k for k in range(1, cpi + 1) if cpi % k == 0 and k <= fits)
    chips = np.arange(topo.n_chips, dtype=np.int64)
    leaf_of, pos = chips // per_leaf, chips % per_leaf
    n_leaves = -(-topo.n_chips // per_leaf)
    nodes: list[Node] = [("leaf", i) for i in range(n_leaves)]
    _attach_tree(
        topo,
        efa,
        link_efficiency,
        path,
        name="fat_tree",
        leaf_nodes=nodes,
        leaf_of=leaf_of,
        pos=pos,
        per_leaf=per_leaf,
    )


@register_fabric("rail")
def attach_rail(topo: Topology, efa: EfaSpec, link_efficiency: float, path: str) -> None:
    """Rail-optimised: chip ``i`` of each instance of a group attaches to rail switch ``i``.

    A group holds as many instances as a rail switch has chip ports; rail switch
    ``("rail", i, g)`` of group ``g`` is a leaf of the Clos above.
    """
    down_ports, _ = _check_ports(efa, path)
    cpi = topo.chips_per_instance
    # One chip per instance on each rail switch; a chip takes nics/chips ports (at least one).
    group = max(1, math.floor(down_ports / max(1.0, efa.nics / cpi) + 1e-9))
    chips = np.arange(topo.n_chips, dtype=np.int64)
    inst = chips // cpi
    leaf_of = (inst // group) * cpi + chips % cpi
    pos = inst % group
    n_groups = -(-topo.instances // group)
    nodes: list[Node] = [("rail", i % cpi, i // cpi) for i in range(n_groups * cpi)]
    _attach_tree(
        topo,
        efa,
        link_efficiency,
        path,
        name="rail",
        leaf_nodes=nodes,
        leaf_of=leaf_of,
        pos=pos,
        per_leaf=group,
    )


def _check_ports(efa: EfaSpec, path: str) -> tuple[int, int]:
    down, up = leaf_ports(efa)
    if down < 1 or (efa.tiers > 1 and up < 1):
        raise ScenarioError(
            f"{path}.efa.radix",
            efa.radix,
            f"leaves need a port down and a port up at oversubscription {efa.oversubscription}",
        )
    return down, up


def _attach_tree(
    topo: Topology,
    efa: EfaSpec,
    link_efficiency: float,
    path: str,
    *,
    name: str,
    leaf_nodes: list[Node],
    leaf_of: Int64s,
    pos: Int64s,
    per_leaf: int,
) -> None:
    tiers, radix = efa.tiers, efa.radix
    _, up_ports = leaf_ports(efa)
    half = max(1, radix // 2)
    n_leaves = len(leaf_nodes)
    # Leaves under one block of each level, switch columns per block, up ports per level.
    span = [1] + [half ** (j - 1) * half for j in range(1, tiers - 1)]
    width = [1] + [up_ports * half ** (j - 1) for j in range(1, tiers)]
    ports = [up_ports] + [half] * max(0, tiers - 2)
    max_leaves = 1 if tiers == 1 else radix * span[-1]
    if tiers > 1:
        span.append(max(n_leaves, max_leaves))
    if n_leaves > max_leaves:
        raise ScenarioError(
            f"{path}.efa.tiers",
            tiers,
            f"a {tiers}-tier {name} fabric of radix-{radix} switches holds {max_leaves} leaves "
            f"of {per_leaf} chips ({max_leaves * per_leaf} chips); the cluster needs "
            f"{n_leaves}: raise efa.tiers or efa.radix",
        )
    leaf_ids = topo.add_nodes(leaf_nodes)
    host_up, host_down, chip_Bps = _host_links(topo, leaf_ids, leaf_of, efa, link_efficiency)
    leaf_o = efa.oversubscription if _at_leaf(efa) else 1.0
    uplink_Bps = per_leaf * chip_Bps / (leaf_o * up_ports)
    level_ids = [leaf_ids]
    ups: list[Int64s] = []
    downs: list[Int64s] = []
    for j in range(tiers - 1):
        n_below = level_ids[j].size
        blocks_above = -(-n_leaves // span[j + 1])
        above = topo.add_nodes(("spine", j + 2, k) for k in range(blocks_above * width[j + 1]))
        level_ids.append(above)
        switch = np.repeat(np.arange(n_below, dtype=np.int64), ports[j])
        port = np.tile(np.arange(ports[j], dtype=np.int64), n_below)
        block, col = switch // width[j], switch % width[j]
        target_block = block * span[j] // span[j + 1]
        target = target_block * width[j + 1] + col + width[j] * port
        top = j == tiers - 2 and not _at_leaf(efa)
        fwd, rev = topo.add_duplex_links(
            level_ids[j][switch],
            above[target],
            capacity_Bps=uplink_Bps / efa.oversubscription if top else uplink_Bps,
            latency_s=SWITCH_HOP_LATENCY_S,
            kind="efa",
        )
        ups.append(fwd.reshape(n_below, ports[j]))
        downs.append(rev.reshape(n_below, ports[j]))
    topo.scaleout = TreeFabric(
        name,
        leaf_of,
        pos,
        per_leaf,
        host_up,
        host_down,
        span=tuple(span),
        width=tuple(width),
        ports=tuple(ports),
        up=tuple(ups),
        down=tuple(downs),
        spread=max(1, min(round(efa.nics / topo.chips_per_instance), up_ports)),
    )
