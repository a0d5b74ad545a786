"""The link table: one row per link of the topology, with its utilisation over the run.

``clustersim run`` writes it as ``links.parquet`` beside ``trace.parquet``; the
report draws it on the topology. Columns (:data:`LINK_COLUMNS`):

- ``link``, ``kind``: the link's name (``chip0->chip1``, ``chip3:local``,
  ``leaf2->spine2_5``) and kind (``local``, ``neuronlink``, ``switch``, ``efa``);
- ``tier``: the role of the link, for grouping: ``local`` (on-chip DMA), ``torus x``
  (``y``, ``z``) for torus links, else ``<source type>-><target type>`` such as
  ``chip->switch``, ``chip->leaf``, ``leaf->spine2`` or ``spine2->leaf``;
- ``src``, ``dst``: the endpoint nodes' names; ``src_chip``, ``dst_chip``: their
  chip indices, -1 for switches;
- ``capacity_Bps`` (current, per direction), ``bytes`` carried, ``mean_util``
  (time-weighted mean of load / capacity over the run) and ``peak_util``, both in
  [0, 1];
- ``src_x``, ``src_y``, ``src_z``, ``src_domain`` and the same for ``dst``: torus
  coordinates of the endpoint chips within their scale-up domain, and the domain;
  -1 where the endpoint is not a chip or the fabric is not a torus (unused axes of
  a 2D torus are 0).

In a folded run only the representative groups' links carry traffic (with every
replica's flows on them); their images under the fabric's symmetry show zero.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from clustersim.trace.io import write_parquet

if TYPE_CHECKING:
    from clustersim.network.fabric import Topology
    from clustersim.network.flows import LinkUtilisation

__all__ = ["LINK_COLUMNS", "LINK_TABLE", "link_frame", "write_link_table"]

LINK_TABLE = "links.parquet"
"""File name of the link table in a result directory."""

LINK_COLUMNS: tuple[str, ...] = (
    "link", "kind", "tier", "src", "dst", "src_chip", "dst_chip", "capacity_Bps", "bytes",
    "mean_util", "peak_util", "src_x", "src_y", "src_z", "src_domain", "dst_x", "dst_y",
    "dst_z", "dst_domain",
)  # fmt: skip
_AXES = ("x", "y", "z")


def _node_types(topology: Topology) -> tuple[list[str], NDArray[np.int64]]:
    """Distinct node types (``chip``, ``switch``, ``leaf``, ``spine2``, ...) and each node's."""
    from clustersim.network.graphs import GraphTopology

    types: list[str] = []
    index: dict[str, int] = {}
    codes = np.empty(topology.n_nodes, dtype=np.int64)
    # An imported graph names its nodes freely: their kinds are their types.
    kinds = topology.node_kinds if isinstance(topology, GraphTopology) else None
    for i in range(topology.n_nodes):
        node = topology.node(i)
        name = kinds[i] if kinds is not None else str(node[0])
        if kinds is None and name == "spine" and len(node) > 1:
            name += str(node[1])  # the tier of a Clos spine
        code = index.get(name)
        if code is None:
            code = index[name] = len(types)
            types.append(name)
        codes[i] = code
    return types, codes


def _tiers(
    topology: Topology, u: NDArray[np.int64], v: NDArray[np.int64], coords: NDArray[np.int64]
) -> pd.Categorical[str]:
    """The ``tier`` column: ``local``, ``torus x|y|z``, else ``<type>-><type>`` of the endpoints."""
    types, code = _node_types(topology)
    nt = len(types)
    pair = code[u] * nt + code[v]
    labels = [f"{a}->{b}" for a in types for b in types]
    extra = ["local", *(f"torus {a}" for a in _AXES)]
    pair[u == v] = nt * nt
    n = topology.n_chips
    torus = (u != v) & (u < n) & (v < n) & (topology.kinds == "neuronlink")
    if topology.chip_coords is not None and torus.any():
        rows = np.flatnonzero(torus)
        differs = coords[u[rows]] != coords[v[rows]]
        axis = np.argmax(differs, axis=1)
        pair[rows] = nt * nt + 1 + np.minimum(axis, len(_AXES) - 1)
    all_labels = labels + extra
    used = np.unique(pair)
    remap = np.full(len(all_labels), -1, dtype=np.int64)
    remap[used] = np.arange(used.size)
    codes: NDArray[np.int64] = remap[pair]
    categories = pd.Index([all_labels[i] for i in used.tolist()], dtype=str)
    return pd.Categorical.from_codes(codes, categories=categories)


def link_frame(topology: Topology, util: LinkUtilisation) -> pd.DataFrame:
    """The link table (:data:`LINK_COLUMNS`) of ``topology`` with the utilisation ``util``
    (from :meth:`~clustersim.network.flows.flownetwork.FlowNetwork.link_utilisation`)."""
    from clustersim.network.fabric import node_name  # the link names' own spelling

    n_links, n_chips = topology.n_links, topology.n_chips
    if util.mean.size != n_links:
        raise ValueError(f"utilisation of {util.mean.size} links for {n_links} links")
    u = np.asarray(topology.link_u, dtype=np.int64)
    v = np.asarray(topology.link_v, dtype=np.int64)
    node_names = np.asarray(
        [node_name(topology.node(i)) for i in range(topology.n_nodes)], dtype=object
    )
    # Per node: x, y, z, domain (-1 where unknown); chips are the first n_chips nodes.
    geo = np.full((topology.n_nodes, 4), -1, dtype=np.int64)
    coords = np.zeros((n_chips, 3), dtype=np.int64)
    if topology.chip_coords is not None:
        rank = min(topology.chip_coords.shape[1], 3)
        coords[:, :rank] = topology.chip_coords[:, :rank]
        geo[:n_chips, :3] = coords
    geo[:n_chips, 3] = topology.chip_domain
    src_chip = np.where(u < n_chips, u, -1)
    dst_chip = np.where(v < n_chips, v, -1)
    cols: dict[str, object] = {
        "link": np.asarray(util.names, dtype=object),
        "kind": pd.Categorical(np.asarray(util.kinds, dtype=object)),
        "tier": _tiers(topology, u, v, coords),
        "src": node_names[u],
        "dst": node_names[v],
        "src_chip": src_chip,
        "dst_chip": dst_chip,
        "capacity_Bps": np.asarray(util.capacity_Bps, dtype=np.float64),
        "bytes": np.asarray(util.bytes, dtype=np.float64),
        "mean_util": np.clip(np.nan_to_num(util.mean), 0.0, 1.0),
        "peak_util": np.clip(np.nan_to_num(util.peak), 0.0, 1.0),
    }
    for side, ends in (("src", u), ("dst", v)):
        for j, axis in enumerate((*_AXES, "domain")):
            cols[f"{side}_{axis}"] = geo[ends, j]
    return pd.DataFrame(cols, columns=list(LINK_COLUMNS))


def write_link_table(path: Path, frame: pd.DataFrame) -> None:
    """Write the link table to ``path`` (Parquet, atomically)."""
    missing = [c for c in LINK_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"link table lacks columns {missing}")
    write_parquet(path, frame)
