"""``clustersim export chakra``: a scenario's training step written as Chakra traces.

The simulator builds one program per pipeline stage (TP, CP and DP peers run the
same one); each rank's trace is its stage's program with the rank's groups and
peers filled in, one node per instruction, in program order. The dependencies
say what the engine (:mod:`clustersim.sim.engine`) does with that order: an
instruction starts when the last blocking one before it has ended (a compute
op, a blocking collective, a receive); a send and an asynchronous collective
block nothing, and a ``WAIT_ASYNC`` makes the next instruction depend on the
asynchronous collectives it waits for (all of them, or the oldest of one
group's, leaving ``tag`` in flight). Those are ``data_deps``.

Attributes are written with the types ASTRA-sim's feeder reads: ``is_cpu_op``
(bool) on every node; on compute nodes ``duration_micros`` (the chip model's
time, rounded to the microsecond the field holds), ``num_ops`` (int64: the
op's tensor FLOPs and engine element operations) and ``tensor_size`` (uint64:
its HBM bytes); on collectives ``comm_type``, ``comm_size`` (int64) and
``pg_name`` (string, a key of ``comm_group.json``); on sends and receives
``comm_dst`` / ``comm_src``, ``comm_tag`` (int32) and ``comm_size`` (int64). A
process group is one role's group of ranks (``tp``, ``dp``...), so two roles over
the same ranks are two groups, as they are two NCCL communicators.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from clustersim.chakra.files import EtFile, encode_file
from clustersim.chakra.schema import Attr, CommType, GlobalMetadata, Node, NodeType
from clustersim.errors import ScenarioError
from clustersim.sim.engine import CompiledProgram
from clustersim.sim.result import Plan
from clustersim.trace.io import atomic_write_bytes, atomic_write_text
from clustersim.workload import Layout
from clustersim.workload.program import Kind

__all__ = ["CHAKRA_VERSION", "ExportSummary", "export_chakra", "rank_trace", "slug"]

CHAKRA_VERSION = "0.0.4"
"""``GlobalMetadata.version``: the schema version ASTRA-sim's examples carry."""
COMM_TYPES = {
    "all_reduce": CommType.ALL_REDUCE,
    "reduce_scatter": CommType.REDUCE_SCATTER,
    "all_gather": CommType.ALL_GATHER,
    "broadcast": CommType.BROADCAST,
    "reduce": CommType.REDUCE,
    "all_to_all": CommType.ALL_TO_ALL,
}
_CPU = Attr("is_cpu_op", "bool", False)


@dataclass
class ExportSummary:
    """What an export wrote."""

    files: list[Path]
    groups: Path
    ranks: int
    nodes: int
    bytes: int


class _Groups:
    """Process group ids in order of first use: ``(role, ranks) -> "1", "2", ...``."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, tuple[int, ...]], str] = {}

    def name(self, role: str, ranks: tuple[int, ...]) -> str:
        key = (role, ranks)
        gid = self.ids.get(key)
        if gid is None:
            gid = self.ids[key] = str(len(self.ids) + 1)
        return gid

    def table(self) -> dict[str, list[int]]:
        return {gid: list(ranks) for (_, ranks), gid in self.ids.items()}


def rank_trace(compiled: CompiledProgram, layout: Layout, rank: int, groups: _Groups) -> EtFile:
    """Rank ``rank``'s trace of its stage's compiled program (see the module doc)."""
    prog = compiled.program
    durations = compiled.durations_s.tolist()
    nodes: list[Node] = []
    cursor: list[int] = []  # what the next instruction waits for
    pending: list[tuple[int, str, str]] = []  # async collectives in flight: (id, group, op)
    tp_i, cp_i, dp_i, pp_i = layout.coords(rank)
    for k, ins in enumerate(prog.instrs):
        node = Node(id=k, name=ins.name, data_deps=list(cursor))
        kind = ins.kind
        if kind == Kind.COMPUTE:
            work = ins.work
            assert work is not None
            ops = work.tensor_flops + work.vector_ops + work.scalar_ops + work.gpsimd_ops
            node.type = NodeType.COMP_NODE
            node.duration_micros = round(durations[k] * 1e6)
            node.attrs = [
                _CPU,
                Attr("num_ops", "int64", round(ops)),
                Attr("tensor_size", "uint64", round(work.hbm_bytes)),
            ]
            cursor = [k]
        elif kind in (Kind.COLLECTIVE, Kind.ASYNC_COLLECTIVE):
            members = layout.group(ins.group, rank)
            node.type = NodeType.COMM_COLL_NODE
            node.attrs = [
                _CPU,
                Attr("comm_type", "int64", int(COMM_TYPES[ins.collective])),
                Attr("comm_size", "int64", round(ins.nbytes)),
                Attr("pg_name", "string", groups.name(ins.group, members)),
            ]
            if kind == Kind.COLLECTIVE:
                cursor = [k]
            else:
                pending.append((k, ins.group, ins.collective))
        elif kind in (Kind.SEND, Kind.RECV):
            peer = layout.rank_of(tp_i, cp_i, dp_i, pp_i + ins.peer)
            send = kind == Kind.SEND
            node.type = NodeType.COMM_SEND_NODE if send else NodeType.COMM_RECV_NODE
            node.attrs = [
                _CPU,
                Attr("comm_dst" if send else "comm_src", "int32", peer),
                Attr("comm_tag", "int32", ins.tag),
                Attr("comm_size", "int64", round(ins.nbytes)),
            ]
            if not send:
                cursor = [k]
        else:  # WAIT_ASYNC: no node; what follows waits for the collectives it names
            if ins.group:
                mine = [p for p in pending if (p[1], p[2]) == (ins.group, ins.collective)]
                due = mine[: max(len(mine) - ins.tag, 0)]
            else:
                due = list(pending)
            pending = [p for p in pending if p not in due]
            cursor = sorted({*cursor, *(p[0] for p in due)})
            continue
        nodes.append(node)
    return EtFile(GlobalMetadata(version=CHAKRA_VERSION), _renumber(nodes))


def _renumber(nodes: list[Node]) -> list[Node]:
    """Ids 0..n-1 in file order (a WAIT_ASYNC left a gap)."""
    new = {node.id: i for i, node in enumerate(nodes)}
    for node in nodes:
        node.id = new[node.id]
        node.data_deps = [new[d] for d in node.data_deps]
    return nodes


def export_chakra(
    pl: Plan,
    compiled: list[CompiledProgram],
    out: Path,
    prefix: str,
    *,
    ranks: Iterable[int] | None = None,
    compress: bool = False,
) -> ExportSummary:
    """Write ``out/PREFIX.{rank}.et`` (``.et.gz`` with ``compress``) for ``ranks`` (all by
    default) and ``out/comm_group.json`` with every group of the step."""
    layout = pl.layout
    chosen = sorted(set(range(layout.ranks) if ranks is None else ranks))
    bad = [r for r in chosen if not 0 <= r < layout.ranks]
    if bad:
        raise ScenarioError("--rank", bad[0], f"the scenario has ranks 0..{layout.ranks - 1}")
    if out.exists() and not out.is_dir():
        raise ScenarioError("--out", str(out), "exists and is not a directory")
    groups = _Groups()
    files: list[Path] = []
    nodes = written = 0
    suffix = ".et.gz" if compress else ".et"
    for rank in range(layout.ranks):  # every rank, so that the group ids do not depend on --rank
        et = rank_trace(compiled[layout.stage(rank)], layout, rank, groups)
        if rank not in chosen:
            continue
        data = encode_file(et, compress=compress)
        path = out / f"{prefix}.{rank}{suffix}"
        atomic_write_bytes(path, data)
        files.append(path)
        nodes += len(et.nodes)
        written += len(data)
    table = out / "comm_group.json"
    rows = [f"  {json.dumps(gid)}: {json.dumps(ranks)}" for gid, ranks in groups.table().items()]
    atomic_write_text(table, "{\n" + ",\n".join(rows) + "\n}\n")
    return ExportSummary(files, table, len(chosen), nodes, written)


def slug(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "._-" else "-" for c in name).strip("-.")
    return keep[:80] or "trace"
