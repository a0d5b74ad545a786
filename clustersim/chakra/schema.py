"""The Chakra execution-trace schema (``et_def.proto``, package ``ChakraProtoMsg``) as
Python types: node and collective types, attributes, nodes and the file's metadata.

Only the messages a trace file holds are modelled. Field numbers live in
:mod:`clustersim.chakra.codec`, beside the code that reads and writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

__all__ = [
    "ATTR_KINDS",
    "Attr",
    "CommType",
    "GlobalMetadata",
    "IOInfo",
    "Node",
    "NodeType",
]


class NodeType(IntEnum):
    """``NodeType`` of et_def.proto."""

    INVALID_NODE = 0
    METADATA_NODE = 1
    MEM_LOAD_NODE = 2
    MEM_STORE_NODE = 3
    COMP_NODE = 4
    COMM_SEND_NODE = 5
    COMM_RECV_NODE = 6
    COMM_COLL_NODE = 7


class CommType(IntEnum):
    """``CollectiveCommType`` of et_def.proto (the ``comm_type`` attribute of COMM_COLL)."""

    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


ATTR_KINDS: tuple[str, ...] = (
    "double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
    "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes",
)  # fmt: skip
"""The scalar members of ``AttributeProto``'s value oneof, in field order (3, 5, ... 31);
each has a list member (``int64_list`` ...) one field number up."""


@dataclass(frozen=True, slots=True)
class Attr:
    """One ``AttributeProto``: a name and one member of the value oneof.

    ``kind`` names the member (``int64``, ``bool_list``, ``string``...), so a writer
    puts back exactly the type it read: ASTRA-sim reads ``comm_type`` as an int64 and
    ``comm_src`` as an int32, and finds nothing under any other member. ``value`` is
    an int, float, bool, str or bytes, or a tuple of one of them for a ``*_list``.
    Immutable: a reader shares one instance among the nodes that hold the same bytes.
    """

    name: str
    kind: str
    value: Any
    doc_string: str = ""


@dataclass(slots=True)
class IOInfo:
    """``IOInfo``: a node's inputs or outputs as the PyTorch converter writes them."""

    values: str = ""
    shapes: str = ""
    types: str = ""


@dataclass(slots=True)
class Node:
    """One ``Node``. Proto3 leaves zero scalars out of the bytes: a missing field reads
    as 0 (node id 0 has no field 1)."""

    id: int = 0
    name: str = ""
    type: int = 0
    ctrl_deps: list[int] = field(default_factory=list)
    data_deps: list[int] = field(default_factory=list)
    start_time_micros: int = 0
    duration_micros: int = 0
    inputs: IOInfo | None = None
    outputs: IOInfo | None = None
    attrs: list[Attr] = field(default_factory=list)

    def attr(self, name: str) -> Attr | None:
        """The first attribute called ``name``, or None."""
        for a in self.attrs:
            if a.name == name:
                return a
        return None


@dataclass(slots=True)
class GlobalMetadata:
    """``GlobalMetadata``: the first record of a file. A writer always sets ``version``:
    an empty message is the single byte 0x00, which Python readers take for the end."""

    version: str = ""
    attrs: list[Attr] = field(default_factory=list)
