"""A workload's traces: one file per rank found by prefix, read, checked and compiled,
with the process groups their collectives name.

Rank r's file is ``PREFIX.r.et`` (or ``PREFIX.r.et.gz``). The files must be
exactly the cluster's ranks, unless one file is replicated on every rank (SPMD).
A collective's ``pg_name`` names a group of ASTRA-sim's ``comm_group.json``
(``{"1": [0, 1, 2, 3], ...}``) or of a METADATA node; ``""`` and ``"0"`` are every
rank unless a group redefines them. Everything a simulation would trip over is
checked here: a ``pg_name`` with no group, a group with ranks outside the
cluster or without the rank that uses it, a send or receive to no rank.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from clustersim.chakra.files import read_file
from clustersim.chakra.graph import Kind, RankGraph, build_graph
from clustersim.errors import MISSING, ScenarioError

__all__ = ["MAX_GROUP_FILE_BYTES", "MAX_TOTAL_NODES", "Traces", "load_traces", "rank_file"]

MAX_GROUP_FILE_BYTES = 16 * 2**20
MAX_TOTAL_NODES = 50_000_000
"""Nodes of all ranks' files together."""
ALL_RANKS = ("", "0")


@dataclass
class Traces:
    """Per rank: its graph (one object for every rank when replicated) and the
    process group of each node (-1 off collectives); and the groups themselves."""

    graphs: list[RankGraph]
    pg: list[list[int]]
    groups: list[tuple[int, ...]]
    group_names: list[str]
    files: int

    @property
    def nodes(self) -> int:
        """Nodes of every rank's trace."""
        return sum(g.size for g in self.graphs)


def rank_file(prefix: str, rank: int) -> Path | None:
    """Rank ``rank``'s file of ``prefix``: ``.et``, else ``.et.gz``; None if neither exists."""
    for suffix in (".et", ".et.gz"):
        path = Path(f"{prefix}.{rank}{suffix}")
        if path.is_file():
            return path
    return None


def _count_files(prefix: str) -> int:
    base = Path(prefix)
    pattern = re.compile(re.escape(base.name) + r"\.(\d+)\.et(\.gz)?$")
    try:
        names = [p.name for p in base.parent.iterdir()] if base.parent.is_dir() else []
    except OSError:
        return 0
    return len({m.group(1) for n in names if (m := pattern.match(n))})


def load_traces(
    prefix: str,
    ranks: int,
    *,
    replicate: bool = False,
    comm_groups: str | None = None,
    drop_dangling_ctrl_deps: bool = False,
    where: str = "workload.chakra",
) -> Traces:
    """Read and check the traces of ``ranks`` ranks (see the module doc)."""
    found = _count_files(prefix)
    if replicate:
        path = rank_file(prefix, 0)
        if path is None:
            raise ScenarioError(f"{where}.prefix", prefix, "no trace file PREFIX.0.et")
        paths = [path]
    else:
        paths = []
        for r in range(ranks):
            path = rank_file(prefix, r)
            if path is None:
                raise ScenarioError(
                    f"{where}.prefix",
                    prefix,
                    f"the cluster has {ranks} ranks but there is no PREFIX.{r}.et "
                    f"({found} rank files found; replicate: true runs rank 0's on every rank)",
                )
            paths.append(path)
        if found > ranks:
            raise ScenarioError(
                f"{where}.prefix",
                prefix,
                f"{found} rank files for a cluster of {ranks} ranks: the ranks and the files "
                "must match one to one",
            )
    graphs: list[RankGraph] = []
    total = 0
    for path in paths:
        et = read_file(path)
        total += len(et.nodes) * (ranks if replicate else 1)
        if total > MAX_TOTAL_NODES:
            raise ScenarioError(f"{where}.prefix", prefix, f"over {MAX_TOTAL_NODES:,} nodes in all")
        graphs.append(build_graph(et, path.name, drop_dangling_ctrl_deps=drop_dangling_ctrl_deps))
    if replicate:
        graphs = graphs * ranks
    table = _group_table(comm_groups, graphs, ranks, where)
    return _resolve_groups(graphs, table, ranks, len(paths))


def _group_table(
    comm_groups: str | None, graphs: list[RankGraph], ranks: int, where: str
) -> dict[str, tuple[int, ...]]:
    table: dict[str, tuple[int, ...]] = {}
    for g in dict.fromkeys(graphs):  # METADATA groups, then the group file's over them
        table.update(g.groups)
    if comm_groups is not None:
        table.update(read_comm_groups(Path(comm_groups), f"{where}.comm_groups"))
    for name, members in table.items():
        bad = [m for m in members if m >= ranks]
        if bad or len(set(members)) != len(members) or not members:
            why = f"ranks {bad[:4]} outside 0..{ranks - 1}" if bad else "empty or repeated ranks"
            raise ScenarioError(f"{where}.comm_groups[{name!r}]", list(members)[:8], why)
    return table


def read_comm_groups(path: Path, where: str) -> dict[str, tuple[int, ...]]:
    """ASTRA-sim's ``comm_group.json``: ``{"1": [0, 1, 2, 3], ...}``."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_GROUP_FILE_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(where, str(path), f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_GROUP_FILE_BYTES:
        raise ScenarioError(where, str(path), f"larger than {MAX_GROUP_FILE_BYTES >> 20} MiB")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ScenarioError(where, str(path), f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(where, str(path), 'expected {"1": [0, 1, ...], ...}')
    out: dict[str, tuple[int, ...]] = {}
    for name, members in data.items():
        if not (isinstance(members, list) and all(type(m) is int and m >= 0 for m in members)):
            raise ScenarioError(f"{where}[{name!r}]", members, "must be a list of ranks")
        out[str(name)] = tuple(members)
    return out


def _resolve_groups(
    graphs: list[RankGraph], table: dict[str, tuple[int, ...]], ranks: int, files: int
) -> Traces:
    everyone = tuple(range(ranks))
    ids: dict[str, int] = {}
    groups: list[tuple[int, ...]] = []
    names: list[str] = []
    pgs: dict[int, list[int]] = {}  # per distinct graph object
    out_pg: list[list[int]] = []
    for rank, g in enumerate(graphs):
        pg = pgs.get(id(g))
        if pg is None:
            pg = pgs[id(g)] = [-1] * g.size
            for i in range(g.size):
                if g.kind[i] != Kind.COLLECTIVE:
                    continue
                name = g.pg_name[i]
                gid = ids.get(name)
                if gid is None:
                    members = table.get(name)
                    if members is None:
                        if name not in ALL_RANKS:
                            known = ", ".join(repr(k) for k in sorted(table)[:8]) or "none"
                            raise ScenarioError(
                                g.where(i, "pg_name"),
                                name,
                                f"no process group has this name (groups: {known}; give "
                                "workload.chakra.comm_groups)",
                            )
                        members = everyone
                    gid = ids[name] = len(groups)
                    groups.append(members)
                    names.append(name or "0")
                pg[i] = gid
            for i in range(g.size):
                if g.kind[i] in (Kind.SEND, Kind.RECV) and g.peer[i] >= ranks:
                    key = "comm_dst" if g.kind[i] == Kind.SEND else "comm_src"
                    raise ScenarioError(
                        g.where(i, key), int(g.peer[i]), f"no such rank (0..{ranks - 1})"
                    )
        for gid in dict.fromkeys(x for x in pg if x >= 0):
            if rank not in groups[gid]:
                i = pg.index(gid)
                raise ScenarioError(
                    g.where(i, "pg_name"),
                    names[gid],
                    f"rank {rank} runs this collective but its group {list(groups[gid])[:8]} "
                    "does not hold it",
                )
        out_pg.append(pg)
    if not graphs:
        raise ScenarioError("workload.chakra", MISSING, "no ranks")
    return Traces(graphs, out_pg, groups, names, files)
