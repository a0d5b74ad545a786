"""Chakra execution traces (MLCommons' ``et_def.proto``): the schema, a pure-Python
codec of its protobuf messages, trace files (raw or gzip) and the checks that turn
one file per rank into a dependency graph the simulator can run."""

from clustersim.chakra.files import EtFile, decode_file, encode_file, read_file
from clustersim.chakra.schema import Attr, CommType, GlobalMetadata, IOInfo, Node, NodeType

__all__ = [
    "Attr",
    "CommType",
    "EtFile",
    "GlobalMetadata",
    "IOInfo",
    "Node",
    "NodeType",
    "decode_file",
    "encode_file",
    "read_file",
]
