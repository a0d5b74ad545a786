"""The protobuf wire format of Chakra's messages, read and written in pure Python.

A small codec rather than the ``protobuf`` runtime with generated classes: the
trace messages use a handful of wire rules, and owning them keeps the simulator
free of a dependency whose versions the reference package pins (``mlc-chakra``
needs protobuf >= 6.31.1 and pulls HolisticTraceAnalysis), and lets every
malformed byte become an error that names where it is. The tests hold it to
``mlc-chakra``'s decoder on the shipped samples and on generated traces.

Proto3 rules kept here: scalars equal to zero are left out when writing and read
as zero when absent; a member of a oneof (an attribute's value) is written even
when zero (``comm_type`` ALL_REDUCE is ``48 00``); repeated numbers are written
packed and read packed or not; unknown fields are skipped. A varint longer than
ten bytes, a length past its message, a field with the wrong wire type and text
that is not UTF-8 are :class:`WireError`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from clustersim.chakra.schema import ATTR_KINDS, Attr, GlobalMetadata, IOInfo, Node

__all__ = [
    "WireError",
    "decode_metadata",
    "decode_node",
    "encode_metadata",
    "encode_node",
    "read_varint",
    "write_varint",
]

_U64 = (1 << 64) - 1
_MAX_VARINT_BYTES = 10


class WireError(Exception):
    """Bytes that are not the message they should be; ``offset`` is where (in the buffer)."""

    def __init__(self, problem: str, offset: int) -> None:
        super().__init__(problem)
        self.problem = problem
        self.offset = offset


# -- primitives ----------------------------------------------------------------------------


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the offset after it; at most ten bytes, below 2**64."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
    start = pos
    result = shift = 0
    while True:
        if pos >= end:
            raise WireError("truncated: the data ends inside a varint", start)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result > _U64:
                raise WireError("a varint above 2**64", start)
            return result, pos
        shift += 7
        if pos - start >= _MAX_VARINT_BYTES:
            raise WireError("a varint that does not end (more than 10 bytes)", start)


def write_varint(out: bytearray, value: int) -> None:
    """Append ``value`` (0 <= value < 2**64) as a varint."""
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A length-delimited field's payload: its start and end."""
    n, pos = read_varint(buf, pos, end)
    if pos + n > end:
        raise WireError(f"truncated: a field of {n} bytes runs past the message's end", pos)
    return pos, pos + n


def _text(buf: bytes, a: int, b: int) -> str:
    try:
        return buf[a:b].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("text that is not UTF-8", a) from None


def _skip(buf: bytes, pos: int, end: int, wire: int) -> int:
    if wire == 0:
        return read_varint(buf, pos, end)[1]
    if wire == 2:
        return _length(buf, pos, end)[1]
    size = {1: 8, 5: 4}.get(wire)
    if size is None:
        raise WireError(f"wire type {wire} is not used by this schema (garbage?)", pos)
    if pos + size > end:
        raise WireError("truncated: the data ends inside a fixed-size field", pos)
    return pos + size


def _key(buf: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, offset after the key)."""
    key = buf[pos]
    if key < 0x80:
        pos += 1
    else:
        key, pos = read_varint(buf, pos, end)
    if key >> 3 == 0:
        raise WireError("field number 0 (garbage?)", pos)
    return key >> 3, key & 7, pos


def _wrong(number: int, wire: int, want: int, pos: int) -> WireError:
    return WireError(f"field {number} has wire type {wire}, expected {want}", pos)


def _varints(buf: bytes, a: int, b: int, into: list[int]) -> None:
    while a < b:
        value, a = read_varint(buf, a, b)
        into.append(value)


# -- attributes ----------------------------------------------------------------------------

# kind -> (field number of the scalar, wire type, decode of one raw value, encode of one)
_FIXED = {
    "double": "<d",
    "float": "<f",
    "fixed32": "<I",
    "fixed64": "<Q",
    "sfixed32": "<i",
    "sfixed64": "<q",
}
_VARINT_DECODE: dict[str, Callable[[int], Any]] = {
    "int32": lambda v: _signed(v, 32),
    "int64": lambda v: _signed(v, 64),
    "uint32": lambda v: v & 0xFFFFFFFF,
    "uint64": lambda v: v,
    "sint32": _unzigzag,
    "sint64": _unzigzag,
    "bool": bool,
}
_VARINT_ENCODE: dict[str, Callable[[Any], int]] = {
    "int32": lambda v: int(v) & _U64,
    "int64": lambda v: int(v) & _U64,
    "uint32": lambda v: int(v) & 0xFFFFFFFF,
    "uint64": lambda v: int(v) & _U64,
    "sint32": lambda v: _zigzag(int(v)) & _U64,
    "sint64": lambda v: _zigzag(int(v)) & _U64,
    "bool": lambda v: 1 if v else 0,
}
_KIND_OF_FIELD = {3 + 2 * i: kind for i, kind in enumerate(ATTR_KINDS)}
_FIELD_OF_KIND = {kind: number for number, kind in _KIND_OF_FIELD.items()}


def _scalar(
    kind: str, buf: bytes, pos: int, end: int, wire: int, *, number: int = 1
) -> tuple[Any, int]:
    if kind in _VARINT_DECODE:
        if wire != 0:
            raise _wrong(number, wire, 0, pos)
        raw, pos = read_varint(buf, pos, end)
        return _VARINT_DECODE[kind](raw), pos
    if kind in _FIXED:
        fmt = _FIXED[kind]
        size = struct.calcsize(fmt)
        want = 1 if size == 8 else 5
        if wire != want:
            raise _wrong(number, wire, want, pos)
        if pos + size > end:
            raise WireError("truncated: the data ends inside a fixed-size field", pos)
        return struct.unpack_from(fmt, buf, pos)[0], pos + size
    if wire != 2:
        raise _wrong(number, wire, 2, pos)
    a, b = _length(buf, pos, end)
    return (_text(buf, a, b) if kind == "string" else bytes(buf[a:b])), b


def _list(kind: str, buf: bytes, a: int, b: int) -> list[Any]:
    """A ``*List`` message: ``repeated values = 1`` (numbers packed or not)."""
    out: list[Any] = []
    while a < b:
        number, wire, a = _key(buf, a, b)
        if number != 1:
            a = _skip(buf, a, b, wire)
            continue
        if wire == 2 and kind not in ("string", "bytes"):  # packed
            c, d = _length(buf, a, b)
            while c < d:
                value, c = _scalar(kind, buf, c, d, 0 if kind in _VARINT_DECODE else _fw(kind))
                out.append(value)
            a = d
        else:
            value, a = _scalar(kind, buf, a, b, wire)
            out.append(value)
    return out


def _fw(kind: str) -> int:
    return 1 if struct.calcsize(_FIXED[kind]) == 8 else 5


_ATTR_CACHE: dict[bytes, Attr] = {}
_ATTR_CACHE_SIZE = 1 << 16


def _cached_attr(buf: bytes, a: int, b: int) -> Attr:
    """The attribute in ``buf[a:b]``, shared with every node that holds the same bytes:
    traces repeat a few attributes (``is_cpu_op``, ``comm_type``, ``pg_name``...) on
    every node, and an :class:`Attr` is immutable."""
    raw = buf[a:b]
    attr = _ATTR_CACHE.get(raw)
    if attr is None:
        attr = _decode_attr(raw, 0, b - a)
        if len(_ATTR_CACHE) >= _ATTR_CACHE_SIZE:
            _ATTR_CACHE.clear()
        _ATTR_CACHE[raw] = attr
    return attr


def _decode_attr(buf: bytes, a: int, b: int) -> Attr:
    name = doc = kind = ""
    value: Any = None
    while a < b:
        number, wire, a = _key(buf, a, b)
        if number in (1, 2):
            if wire != 2:
                raise _wrong(number, wire, 2, a)
            if a < b and buf[a] < 0x80:
                c = a + 1
                a = c + buf[a]
                if a > b:
                    raise WireError("truncated: a field runs past the message's end", c)
            else:
                c, a = _length(buf, a, b)
            if number == 1:
                name = _text(buf, c, a)
            else:
                doc = _text(buf, c, a)
            continue
        if number > 32:
            a = _skip(buf, a, b, wire)
            continue
        if number % 2:  # a scalar member
            kind = _KIND_OF_FIELD[number]
            if wire == 0 and kind in _VARINT_DECODE:
                if a < b and buf[a] < 0x80:
                    raw = buf[a]
                    a += 1
                else:
                    raw, a = read_varint(buf, a, b)
                value = _VARINT_DECODE[kind](raw)
            else:
                value, a = _scalar(kind, buf, a, b, wire, number=number)
        else:
            kind = _KIND_OF_FIELD[number - 1]
            if wire != 2:
                raise _wrong(number, wire, 2, a)
            c, a = _length(buf, a, b)
            value, kind = tuple(_list(kind, buf, c, a)), f"{kind}_list"
    return Attr(name, kind, value, doc)


def _encode_attr(attr: Attr) -> bytes:
    out = bytearray()
    if attr.name:
        _put_text(out, 1, attr.name)
    if attr.doc_string:
        _put_text(out, 2, attr.doc_string)
    is_list = attr.kind.endswith("_list")
    kind = attr.kind[: -len("_list")] if is_list else attr.kind
    number = _FIELD_OF_KIND.get(kind)
    if number is None:
        raise ValueError(f"unknown attribute kind {attr.kind!r}")
    if not is_list:
        _put_scalar(out, number, kind, attr.value)
        return bytes(out)
    body = bytearray()
    if kind in ("string", "bytes"):
        for value in attr.value:
            _put_scalar(body, 1, kind, value)
    elif attr.value:  # packed
        packed = bytearray()
        for value in attr.value:
            if kind in _VARINT_ENCODE:
                write_varint(packed, _VARINT_ENCODE[kind](value))
            else:
                packed += struct.pack(_FIXED[kind], value)
        _put_bytes(body, 1, bytes(packed))
    _put_bytes(out, number + 1, bytes(body))
    return bytes(out)


def _put_scalar(out: bytearray, number: int, kind: str, value: Any) -> None:
    if kind in _VARINT_ENCODE:
        write_varint(out, number << 3)
        write_varint(out, _VARINT_ENCODE[kind](value))
    elif kind in _FIXED:
        fmt = _FIXED[kind]
        write_varint(out, number << 3 | (1 if struct.calcsize(fmt) == 8 else 5))
        out += struct.pack(fmt, value)
    elif kind == "string":
        _put_text(out, number, value)
    else:
        _put_bytes(out, number, bytes(value))


def _put_bytes(out: bytearray, number: int, data: bytes) -> None:
    write_varint(out, number << 3 | 2)
    write_varint(out, len(data))
    out += data


def _put_text(out: bytearray, number: int, text: str) -> None:
    _put_bytes(out, number, text.encode("utf-8"))


def _put_uint(out: bytearray, number: int, value: int) -> None:
    if value:
        write_varint(out, number << 3)
        write_varint(out, value & _U64)


# -- messages ------------------------------------------------------------------------------


def _decode_io(buf: bytes, a: int, b: int) -> IOInfo:
    io = IOInfo()
    while a < b:
        number, wire, a = _key(buf, a, b)
        if number in (1, 2, 3):
            if wire != 2:
                raise _wrong(number, wire, 2, a)
            c, a = _length(buf, a, b)
            text = _text(buf, c, a)
            if number == 1:
                io.values = text
            elif number == 2:
                io.shapes = text
            else:
                io.types = text
        else:
            a = _skip(buf, a, b, wire)
    return io


def decode_node(buf: bytes, pos: int, end: int) -> Node:
    """The ``Node`` in ``buf[pos:end]``.

    The hot loop of reading a trace (a 200,000-node file is 200,000 calls): one-byte
    keys and varints are read inline, the general forms through :func:`read_varint`.
    """
    node = Node()
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            if pos < end and buf[pos] < 0x80:
                value = buf[pos]
                pos += 1
            else:
                value, pos = read_varint(buf, pos, end)
            if number == 1:
                node.id = value
            elif number == 3:
                node.type = _signed(value, 32)
            elif number == 7:
                node.duration_micros = value
            elif number == 6:
                node.start_time_micros = value
            elif number == 5:
                node.data_deps.append(value)
            elif number == 4:
                node.ctrl_deps.append(value)
            elif number in (2, 8, 9, 10):
                raise _wrong(number, wire, 2, pos)
            elif number == 0:
                raise WireError("field number 0 (garbage?)", pos)
            continue
        if wire != 2:
            if number in _NODE_FIELDS or number == 0:
                raise _wrong(number, wire, 2 if number in (2, 4, 5, 8, 9, 10) else 0, pos)
            pos = _skip(buf, pos, end, wire)
            continue
        if pos < end and buf[pos] < 0x80:
            a = pos + 1
            pos = a + buf[pos]
            if pos > end:
                raise WireError("truncated: a field runs past the message's end", a)
        else:
            a, pos = _length(buf, pos, end)
        if number == 10:
            node.attrs.append(_cached_attr(buf, a, pos))
        elif number == 5:
            _varints(buf, a, pos, node.data_deps)
        elif number == 2:
            node.name = _text(buf, a, pos)
        elif number == 4:
            _varints(buf, a, pos, node.ctrl_deps)
        elif number == 8:
            node.inputs = _decode_io(buf, a, pos)
        elif number == 9:
            node.outputs = _decode_io(buf, a, pos)
        elif number in (1, 3, 6, 7) or number == 0:
            raise _wrong(number, wire, 0, a)
    return node


_NODE_FIELDS = frozenset(range(1, 11))


def encode_node(node: Node) -> bytes:
    """``node`` serialised as protobuf writes it (fields in number order, deps packed)."""
    out = bytearray()
    _put_uint(out, 1, node.id)
    if node.name:
        _put_text(out, 2, node.name)
    _put_uint(out, 3, node.type)
    for number, deps in ((4, node.ctrl_deps), (5, node.data_deps)):
        if deps:
            packed = bytearray()
            for dep in deps:
                write_varint(packed, dep)
            _put_bytes(out, number, bytes(packed))
    _put_uint(out, 6, node.start_time_micros)
    _put_uint(out, 7, node.duration_micros)
    for number, io in ((8, node.inputs), (9, node.outputs)):
        if io is not None:
            body = bytearray()
            for sub, text in ((1, io.values), (2, io.shapes), (3, io.types)):
                if text:
                    _put_text(body, sub, text)
            _put_bytes(out, number, bytes(body))
    for attr in node.attrs:
        _put_bytes(out, 10, _encode_attr(attr))
    return bytes(out)


def decode_metadata(buf: bytes, pos: int, end: int) -> GlobalMetadata:
    """The ``GlobalMetadata`` in ``buf[pos:end]``."""
    meta = GlobalMetadata()
    while pos < end:
        number, wire, pos = _key(buf, pos, end)
        if number in (1, 2):
            if wire != 2:
                raise _wrong(number, wire, 2, pos)
            a, pos = _length(buf, pos, end)
            if number == 1:
                meta.version = _text(buf, a, pos)
            else:
                meta.attrs.append(_decode_attr(buf, a, pos))
        else:
            pos = _skip(buf, pos, end, wire)
    return meta


def encode_metadata(meta: GlobalMetadata) -> bytes:
    out = bytearray()
    if meta.version:
        _put_text(out, 1, meta.version)
    for attr in meta.attrs:
        _put_bytes(out, 2, _encode_attr(attr))
    return bytes(out)
