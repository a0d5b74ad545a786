"""The pure-Python codec against the wire bytes, proto3's rules and mlc-chakra's decoder."""

from __future__ import annotations

import contextlib
import gzip
import random
from pathlib import Path

import pytest

from clustersim.chakra import (
    Attr,
    EtFile,
    GlobalMetadata,
    IOInfo,
    Node,
    NodeType,
    decode_file,
    encode_file,
    read_file,
)
from clustersim.chakra.codec import decode_node, encode_node
from clustersim.errors import ScenarioError
from tests.chakra_et.helpers import ASTRA, mlc, mlc_decode

SAMPLES = sorted(ASTRA.rglob("*.et"))


def test_samples_decode_and_encode_to_the_same_bytes() -> None:
    assert len(SAMPLES) == 40
    for path in SAMPLES:
        assert encode_file(read_file(path)) == path.read_bytes(), path.name


def test_proto3_zero_rules() -> None:
    """Rank 0's microbenchmark node: no field 1 (id 0), comm_type 0 written as 48 00,
    is_cpu_op false as d8 01 00."""
    raw = (ASTRA / "all_reduce" / "all_reduce.0.et").read_bytes()
    et = decode_file(raw, "x")
    node = et.nodes[0]
    assert (node.id, node.type) == (0, NodeType.COMM_COLL_NODE)
    assert [(a.name, a.kind, a.value) for a in node.attrs] == [
        ("is_cpu_op", "bool", False),
        ("comm_type", "int64", 0),
        ("comm_size", "int64", 1 << 20),
    ]
    body = encode_node(node)
    assert body[0] != 0x08  # no id field
    assert b"\x48\x00" in body and b"\xd8\x01\x00" in body
    assert et.metadata.version == "0.0.4"


def test_every_attribute_kind_round_trips() -> None:
    attrs = [
        Attr("d", "double", -1.5),
        Attr("f", "float", 0.25),
        Attr("i32", "int32", -7),
        Attr("i64", "int64", -(2**40)),
        Attr("u32", "uint32", 2**32 - 1),
        Attr("u64", "uint64", 2**64 - 1),
        Attr("s32", "sint32", -3),
        Attr("s64", "sint64", -(2**50)),
        Attr("fx32", "fixed32", 9),
        Attr("fx64", "fixed64", 2**60),
        Attr("sf32", "sfixed32", -9),
        Attr("sf64", "sfixed64", -(2**60)),
        Attr("b", "bool", True),
        Attr("s", "string", "é"),
        Attr("y", "bytes", b"\x00\xff"),
        Attr("il", "int64_list", (1, -2, 3)),
        Attr("bl", "bool_list", (True, False)),
        Attr("sl", "string_list", ("a", "")),
        Attr("dl", "double_list", (0.5, 2.0)),
        Attr("zero", "int32", 0),
    ]
    node = Node(
        0, "n", NodeType.COMP_NODE, [3, 1], [2**33], 5, 6, IOInfo("v", "s", "t"), IOInfo(), attrs
    )
    body = encode_node(node)
    assert decode_node(body, 0, len(body)) == node


@mlc
def test_mlc_chakra_reads_what_we_read_and_write(tmp_path: Path) -> None:
    nodes = [
        Node(
            i,
            f"n{i}",
            NodeType.COMP_NODE if i % 2 else NodeType.COMM_COLL_NODE,
            ctrl_deps=[i - 1] if i else [],
            data_deps=list(range(max(0, i - 3), i)),
            duration_micros=i * 7,
            attrs=[
                Attr("is_cpu_op", "bool", False),
                Attr("comm_type", "int64", i % 10),
                Attr("tensor_size", "uint64", i * 2**30),
                Attr("comm_src", "int32", -i),
            ],
        )
        for i in range(50)
    ]
    ours = tmp_path / "ours.et"
    ours.write_bytes(encode_file(EtFile(GlobalMetadata("0.0.4"), nodes)))
    for path in [*SAMPLES[:3], SAMPLES[-1], ours]:
        meta, theirs = mlc_decode(path)
        mine = read_file(path)
        assert meta.version == mine.metadata.version
        assert len(theirs) == len(mine.nodes)
        for t, m in zip(theirs, mine.nodes, strict=True):
            assert (t.id, t.name, t.type, t.duration_micros) == (
                m.id,
                m.name,
                m.type,
                m.duration_micros,
            )
            assert (list(t.ctrl_deps), list(t.data_deps)) == (m.ctrl_deps, m.data_deps)
            for ta, ma in zip(t.attr, m.attrs, strict=True):
                assert ta.WhichOneof("value") == f"{ma.kind}_val" and ta.name == ma.name
                assert getattr(ta, f"{ma.kind}_val") == ma.value


def _small() -> bytes:
    return (ASTRA / "custom_ring_allreduce" / "custom_allreduce.0.et").read_bytes()


def test_truncated_files_name_the_record() -> None:
    raw = _small()
    for cut in (1, 5, 100, len(raw) - 1):
        with pytest.raises(ScenarioError, match=r"^f\.et\[.*byte \d+\]: not a Chakra trace"):
            decode_file(raw[:cut], "f.et")


def test_a_varint_that_does_not_end() -> None:
    with pytest.raises(ScenarioError, match="does not end"):
        decode_file(b"\x02\x0a\x00" + b"\xff" * 12, "f.et")


def test_garbage_is_refused_not_crashed_on() -> None:
    rng = random.Random(0)
    raw = bytearray(_small())
    for _ in range(300):
        junk = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            junk[rng.randrange(len(junk))] = rng.randrange(256)
        with contextlib.suppress(ScenarioError):
            decode_file(bytes(junk), "f.et")
    for _ in range(100):
        with contextlib.suppress(ScenarioError):
            decode_file(bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))), "g.et")


def test_gzip_is_read_and_bombs_are_stopped(tmp_path: Path) -> None:
    raw = _small()
    path = tmp_path / "a.et"
    path.write_bytes(gzip.compress(raw))
    assert encode_file(read_file(path)) == raw
    bomb = tmp_path / "bomb.et"
    bomb.write_bytes(gzip.compress(b"\x00" * (64 * 2**20)))
    with pytest.raises(ScenarioError, match="decompresses to more than 1 MiB"):
        read_file(bomb, max_bytes=2**20)
    path.write_bytes(gzip.compress(raw)[:-10])
    with pytest.raises(ScenarioError, match="truncated gzip"):
        read_file(path)
    with pytest.raises(ScenarioError, match=r"larger than 0\.0078125 MiB"):
        read_file(ASTRA / "custom_ring_allreduce" / "custom_allreduce.1.et", max_bytes=2**13)
