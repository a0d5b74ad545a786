"""Chakra trace files: ``[varint32 length][GlobalMetadata]`` then ``[varint32 length][Node]``
repeated to the end, raw or gzip-compressed (recognised by its magic bytes, as
Chakra's Python readers do).

Reading is bounded before anything is built: a file holds at most
``MAX_FILE_BYTES`` (after decompression, counted as it inflates, so a gzip bomb
stops at the limit) and ``MAX_NODES`` nodes. Every malformed record is a
:class:`~clustersim.errors.ScenarioError` that names the file, the record and
its byte offset.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from clustersim.chakra.codec import (
    WireError,
    decode_metadata,
    decode_node,
    encode_metadata,
    encode_node,
    read_varint,
    write_varint,
)
from clustersim.chakra.schema import GlobalMetadata, Node
from clustersim.errors import MISSING, ScenarioError

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_NODES",
    "MAX_RECORD_BYTES",
    "EtFile",
    "decode_file",
    "encode_file",
    "read_file",
]

MAX_FILE_BYTES = 512 * 2**20
"""A trace file's bytes, decompressed: 512 MiB, about 8 million nodes of a PyTorch trace."""
MAX_NODES = 10_000_000
"""Nodes in one file."""
MAX_RECORD_BYTES = 64 * 2**20
"""One node or the metadata (a custom collective's metadata carries its whole algorithm)."""
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 4 * 2**20


@dataclass
class EtFile:
    """One rank's trace: its metadata and its nodes in file order."""

    metadata: GlobalMetadata
    nodes: list[Node] = field(default_factory=list)


def read_file(path: Path, label: str | None = None, *, max_bytes: int = MAX_FILE_BYTES) -> EtFile:
    """Read and decode ``path``; errors name it as ``label`` (default: its name)."""
    name = label or path.name
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head == _GZIP_MAGIC:
                data = _inflate(fh.read(max_bytes + 1), name, max_bytes)
            else:
                data = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise ScenarioError(name, str(path), "trace file not found") from None
    except OSError as exc:
        raise ScenarioError(name, str(path), f"cannot read the trace: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise ScenarioError(name, MISSING, f"larger than {max_bytes / 2**20:g} MiB")
    return decode_file(data, name)


def _inflate(raw: bytes, name: str, max_bytes: int) -> bytes:
    """Gunzip ``raw`` (one or more members); stop once more than ``max_bytes`` come out."""
    out = bytearray()
    rest = raw
    try:
        while rest:
            d = zlib.decompressobj(wbits=31)
            pending = rest
            while pending:
                out += d.decompress(pending, _CHUNK)
                if len(out) > max_bytes:
                    raise ScenarioError(
                        name, MISSING, f"decompresses to more than {max_bytes / 2**20:g} MiB"
                    )
                pending = d.unconsumed_tail
            while not d.eof:  # output still buffered inside the decompressor
                chunk = d.decompress(b"", _CHUNK)
                if not chunk:
                    break
                out += chunk
                if len(out) > max_bytes:
                    raise ScenarioError(
                        name, MISSING, f"decompresses to more than {max_bytes / 2**20:g} MiB"
                    )
            if not d.eof:
                raise ScenarioError(name, MISSING, "truncated gzip data")
            rest = d.unused_data
    except zlib.error as exc:
        raise ScenarioError(name, MISSING, f"corrupt gzip data ({exc})") from None
    return bytes(out)


def decode_file(data: bytes, name: str, *, max_nodes: int = MAX_NODES) -> EtFile:
    """Decode a whole (decompressed) trace file."""
    end = len(data)
    if end == 0:
        raise ScenarioError(name, MISSING, "empty file: no GlobalMetadata record")
    pos, record = 0, 0
    meta: GlobalMetadata | None = None
    nodes: list[Node] = []
    append = nodes.append
    try:
        while pos < end:
            start = pos
            size, pos = read_varint(data, pos, end)
            if size > MAX_RECORD_BYTES:
                raise WireError(f"a record of {size:,} bytes (at most {MAX_RECORD_BYTES:,})", start)
            if pos + size > end:
                raise WireError(
                    f"truncated: the record says {size:,} bytes, {end - pos:,} are left", start
                )
            if meta is None:
                meta = decode_metadata(data, pos, pos + size)
            else:
                if len(nodes) >= max_nodes:
                    raise ScenarioError(name, MISSING, f"more than {max_nodes:,} nodes")
                append(decode_node(data, pos, pos + size))
            pos += size
            record += 1
    except WireError as exc:
        what = "GlobalMetadata" if record == 0 else f"node record {record - 1}"
        raise ScenarioError(
            f"{name}[{what}, byte {exc.offset}]", MISSING, f"not a Chakra trace: {exc.problem}"
        ) from None
    assert meta is not None
    return EtFile(meta, nodes)


def encode_file(et: EtFile, *, compress: bool = False) -> bytes:
    """The bytes of a trace file (gzip-compressed with ``compress``, deterministically:
    no name and no time in the header)."""
    out = bytearray()
    for body in (encode_metadata(et.metadata), *map(encode_node, et.nodes)):
        write_varint(out, len(body))
        out += body
    if not compress:
        return bytes(out)
    return gzip.compress(bytes(out), compresslevel=6, mtime=0)
