"""One rank's trace checked and compiled into the arrays a simulation walks.

What a simulator needs of a node is its kind, its dependencies (``data_deps`` and
``ctrl_deps`` alike: ASTRA-sim's feeder enforces both), and for each kind a few
attributes, read with the types ASTRA-sim's feeder reads (any integer member is
accepted for an integer attribute, since writers differ). Everything is checked
here, once, so that a bad trace stops before the simulation with an error naming
the file, the node id and the field: an unknown node type or ``comm_type``, a
communication node with no size or a size over ``MAX_BYTES``, a dependency on a
node that is not in the file (dangling ``ctrl_deps`` may be dropped instead, as
real PyTorch traces need), a duplicate id, a cycle.

The graph keeps, per node index (file order): kind, duration, the compute
node's ``num_ops`` and ``tensor_size``, the collective and its process group, the
peer and tag of a send or receive, and its successors as CSR arrays.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from clustersim.chakra.files import EtFile
from clustersim.chakra.schema import CommType, Node, NodeType
from clustersim.errors import MISSING, ScenarioError

__all__ = [
    "COLLECTIVES",
    "MAX_BYTES",
    "MAX_DURATION_MICROS",
    "MAX_OPS",
    "Kind",
    "RankGraph",
    "build_graph",
]

MAX_BYTES = 2**40
"""A communication node's ``comm_size`` and a node's ``tensor_size``: at most 1 TiB."""
MAX_DURATION_MICROS = 10**12
"""About 11.6 days."""
MAX_OPS = 1e21
"""``num_ops`` of one node (a zettaFLOP)."""


class Kind:
    """Node kinds as the simulator runs them (``RankGraph.kind``)."""

    NOOP = 0  # METADATA: done as soon as its dependencies are
    COMPUTE = 1
    COLLECTIVE = 2
    SEND = 3
    RECV = 4
    MEMORY = 5  # MEM_LOAD / MEM_STORE: a transfer through the rank's HBM


COLLECTIVES: dict[int, str] = {
    CommType.ALL_REDUCE: "all_reduce",
    CommType.REDUCE: "reduce",
    CommType.ALL_GATHER: "all_gather",
    CommType.BROADCAST: "broadcast",
    CommType.ALL_TO_ALL: "all_to_all",
    CommType.REDUCE_SCATTER: "reduce_scatter",
    CommType.REDUCE_SCATTER_BLOCK: "reduce_scatter",
    CommType.BARRIER: "all_reduce",  # a one-byte all-reduce: every member waits for all
    CommType.GATHER: "gather",  # to the group's first rank; comm_size is the gathered buffer
    CommType.SCATTER: "scatter",  # from the group's first rank; comm_size is the whole buffer
}
"""Chakra's collective types and the simulator's collectives."""

_KIND_OF_TYPE = {
    NodeType.METADATA_NODE: Kind.NOOP,
    NodeType.MEM_LOAD_NODE: Kind.MEMORY,
    NodeType.MEM_STORE_NODE: Kind.MEMORY,
    NodeType.COMP_NODE: Kind.COMPUTE,
    NodeType.COMM_SEND_NODE: Kind.SEND,
    NodeType.COMM_RECV_NODE: Kind.RECV,
    NodeType.COMM_COLL_NODE: Kind.COLLECTIVE,
}
_Ints = NDArray[np.int64]


@dataclass(eq=False)
class RankGraph:
    """One rank's trace as arrays indexed by node position (file order)."""

    label: str
    ids: list[int]
    names: list[str]
    kind: NDArray[np.int8]
    duration_us: NDArray[np.float64]
    num_ops: NDArray[np.float64]  # NaN where the node has none
    tensor_size: NDArray[np.float64]  # NaN where the node has none
    nbytes: NDArray[np.float64]
    collective: list[str]  # "" but on collectives
    pg_name: list[str]  # "" but on collectives
    peer: _Ints  # comm_dst of a send, comm_src of a receive; -1 when absent
    tag: _Ints
    indegree: _Ints
    succ_ptr: _Ints
    succ: _Ints
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Process groups a METADATA node declares (``pg_name`` -> ranks)."""
    dropped_ctrl_deps: int = 0

    @property
    def size(self) -> int:
        return len(self.ids)

    def where(self, index: int, key: str) -> str:
        """``label[node ID].key``, for an error about node ``index``."""
        return f"{self.label}[node {self.ids[index]}].{key}"


def _int_attr(node: Node, key: str, label: str, *, required: bool) -> int | None:
    attr = node.attr(key)
    if attr is None:
        if required:
            raise ScenarioError(f"{label}[node {node.id}].{key}", MISSING, "missing")
        return None
    value = attr.value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(
            f"{label}[node {node.id}].{key}", value, f"must be an integer (is {attr.kind})"
        )
    return value


def _size(node: Node, key: str, label: str, *, required: bool) -> float:
    value = _int_attr(node, key, label, required=required)
    if value is None:
        return float("nan")
    if not 0 <= value <= MAX_BYTES:
        raise ScenarioError(f"{label}[node {node.id}].{key}", value, "must be 0 B .. 1 TiB")
    return float(value)


def build_graph(et: EtFile, label: str, *, drop_dangling_ctrl_deps: bool = False) -> RankGraph:
    """Check one rank's trace and compile it (see the module doc)."""
    nodes = et.nodes
    n = len(nodes)
    index: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if index.setdefault(node.id, i) != i:
            raise ScenarioError(f"{label}[node {node.id}].id", node.id, "two nodes have this id")
    kind = np.zeros(n, dtype=np.int8)
    duration = np.zeros(n)
    num_ops = np.full(n, np.nan)
    tensor_size = np.full(n, np.nan)
    nbytes = np.zeros(n)
    collective = [""] * n
    pg_name = [""] * n
    peer = np.full(n, -1, dtype=np.int64)
    tag = np.zeros(n, dtype=np.int64)
    groups: dict[str, tuple[int, ...]] = {}
    src: list[int] = []
    dst: list[int] = []
    dropped = 0
    for i, node in enumerate(nodes):
        k = _KIND_OF_TYPE.get(node.type)  # type: ignore[call-overload]
        if k is None:
            valid = ", ".join(f"{t.value} {t.name}" for t in NodeType if t.value)
            raise ScenarioError(
                f"{label}[node {node.id}].type", node.type, f"unknown node type; valid: {valid}"
            )
        kind[i] = k
        if node.duration_micros > MAX_DURATION_MICROS:
            raise ScenarioError(
                f"{label}[node {node.id}].duration_micros", node.duration_micros, "over 11 days"
            )
        duration[i] = node.duration_micros
        if k == Kind.COMPUTE:
            ops = _int_attr(node, "num_ops", label, required=False)
            if ops is not None:
                if not 0 <= ops <= MAX_OPS:
                    raise ScenarioError(f"{label}[node {node.id}].num_ops", ops, "out of range")
                num_ops[i] = ops
            tensor_size[i] = _size(node, "tensor_size", label, required=False)
        elif k == Kind.MEMORY:
            tensor_size[i] = _size(node, "tensor_size", label, required=False)
        elif k == Kind.COLLECTIVE:
            ct = _int_attr(node, "comm_type", label, required=True)
            op = COLLECTIVES.get(ct) if ct is not None else None
            if op is None:
                known = ", ".join(f"{c.value} {c.name}" for c in CommType if c.value in COLLECTIVES)
                name = CommType(ct).name if ct in set(CommType) else "unknown"
                raise ScenarioError(
                    f"{label}[node {node.id}].comm_type", ct, f"{name} is not simulated; {known}"
                )
            collective[i] = op
            barrier = ct == CommType.BARRIER
            size = _size(node, "comm_size", label, required=not barrier)
            nbytes[i] = 1.0 if barrier else size
            pg = node.attr("pg_name")
            if pg is not None:
                if not isinstance(pg.value, str):
                    raise ScenarioError(f"{label}[node {node.id}].pg_name", pg.value, "not text")
                pg_name[i] = pg.value
        elif k in (Kind.SEND, Kind.RECV):
            key = "comm_dst" if k == Kind.SEND else "comm_src"
            other = _int_attr(node, key, label, required=True)
            assert other is not None
            if other < 0:
                raise ScenarioError(f"{label}[node {node.id}].{key}", other, "not a rank")
            peer[i] = other
            tag[i] = _int_attr(node, "comm_tag", label, required=False) or 0
            nbytes[i] = _size(node, "comm_size", label, required=True)
        elif node.inputs is not None and node.inputs.values:
            groups.update(_metadata_groups(node, label))
        for dep in node.data_deps:
            j = index.get(dep)
            if j is None:
                raise ScenarioError(
                    f"{label}[node {node.id}].data_deps", dep, "no node has this id"
                )
            src.append(j)
            dst.append(i)
        for dep in node.ctrl_deps:
            j = index.get(dep)
            if j is None:
                if drop_dangling_ctrl_deps:
                    dropped += 1
                    continue
                raise ScenarioError(
                    f"{label}[node {node.id}].ctrl_deps",
                    dep,
                    "no node has this id (workload.chakra.drop_dangling_ctrl_deps: true drops "
                    "such dependencies)",
                )
            src.append(j)
            dst.append(i)
    s = np.asarray(src, dtype=np.int64)
    d = np.asarray(dst, dtype=np.int64)
    order = np.argsort(s, kind="stable")
    succ = d[order]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(s, minlength=n), out=ptr[1:])
    indegree = np.bincount(d, minlength=n).astype(np.int64)
    graph = RankGraph(
        label, [nd.id for nd in nodes], [nd.name for nd in nodes], kind, duration, num_ops,
        tensor_size, nbytes, collective, pg_name, peer, tag, indegree, ptr, succ, groups,
        dropped,
    )  # fmt: skip
    _check_acyclic(graph)
    return graph


def _check_acyclic(g: RankGraph) -> None:
    """Kahn's algorithm; a node left over lies on a cycle or after one."""
    remaining = g.indegree.copy()
    ready = list(np.flatnonzero(remaining == 0).tolist())
    ptr, succ = g.succ_ptr.tolist(), g.succ.tolist()
    rem = remaining.tolist()
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for j in succ[ptr[i] : ptr[i + 1]]:
            rem[j] -= 1
            if rem[j] == 0:
                ready.append(j)
    if done == g.size:
        return
    left = {i for i, r in enumerate(rem) if r > 0}
    # Walk back along unfinished predecessors until a node repeats: it is on a cycle.
    preds: dict[int, int] = {}
    for i in left:
        for j in succ[ptr[i] : ptr[i + 1]]:
            if j in left:
                preds.setdefault(j, i)
    node = min(left)
    seen: set[int] = set()
    while node not in seen:
        seen.add(node)
        node = preds[node]
    raise ScenarioError(
        g.where(node, "data_deps"), MISSING, "the dependencies form a cycle through this node"
    )


def _metadata_groups(node: Node, label: str) -> dict[str, tuple[int, ...]]:
    """Process groups in a METADATA node's ``inputs.values``: a list of ``{pg_name, ranks}``
    (JSON, itself maybe inside a JSON string, as PyTorch's trace observer writes it)."""
    assert node.inputs is not None
    where = f"{label}[node {node.id}].inputs.values"
    try:
        value = json.loads(node.inputs.values)
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            value = json.loads(value[0])
    except (ValueError, RecursionError):
        return {}  # not a process-group table: other metadata
    if not isinstance(value, list):
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for item in value:
        if not (isinstance(item, dict) and "pg_name" in item and "ranks" in item):
            continue
        ranks = item["ranks"]
        if not (isinstance(ranks, list) and all(type(r) is int and r >= 0 for r in ranks)):
            raise ScenarioError(where, ranks, "a process group's ranks must be rank numbers")
        out[str(item["pg_name"])] = tuple(ranks)
    return out
