"""NCCL's channel rings and double trees on nodes of unequal sizes (a partly filled
last NVL72 rack): as many channels as the smallest node has ranks."""

from __future__ import annotations

from collections import Counter

import pytest

from clustersim.network.collectives import GroupInfo
from clustersim.network.collectives.algorithms.switched import double_tree, ring_channels
from clustersim.network.runtimes.nccl import NcclRuntime, nccl_tables

# positions 0-2 on node 0, 3-5 on node 1, 6-7 on node 2
UNEQUAL = GroupInfo.of(range(8), [0, 0, 0, 1, 1, 1, 2, 2])
N = 8 * 2.0**20


def _crossing(pairs: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    node = UNEQUAL.domain
    return [(a, b) for a, b in pairs if node[a] != node[b]]


def test_channel_rings_run_as_many_channels_as_the_smallest_node_has_ranks() -> None:
    (step,) = ring_channels("all_gather", 8, N, UNEQUAL)
    assert step.bytes_per_flow == N / 2 / 8  # two channels, each n / 2 round the ring
    assert len(step.pairs) == 2 * 8  # each channel a ring through every rank
    for k in range(2):
        ring = step.pairs[8 * k : 8 * (k + 1)]
        assert sorted(a for a, _ in ring) == list(range(8))
        assert sorted(b for _, b in ring) == list(range(8))
    # every rank leaves its node at most once over both channels: the NICs of two ranks
    # of each node carry the traffic between nodes
    out = Counter(a for a, _ in _crossing(step.pairs))
    assert len(_crossing(step.pairs)) == 2 * 3 and max(out.values()) == 1


def test_double_trees_rotate_over_the_smallest_node() -> None:
    (step,) = double_tree("all_reduce", 8, N, UNEQUAL)
    assert step.bytes_per_flow == N / 2 / 2
    assert step.hops[0] == 2 * (3 - 1)  # the longest chain, a node of three


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_the_tuning_prices_channel_rings_at_the_smallest_nodes_nics(op: str) -> None:
    rt = NcclRuntime(intra_Bps=400e9, inter_Bps=50e9, net_latency_s=5e-6, nvls=False,
                     nvls_efficiency=0.8)  # fmt: skip
    algo, _ = rt.choose(op, 8, N, UNEQUAL, "ring")
    assert algo == "ring_channels"
    wire = rt.predict_s(op, 8, N, UNEQUAL, ("ring", "Simple")) - rt.predict_s(
        op, 8, 0.0, UNEQUAL, ("ring", "Simple")
    )
    bus = min(400e9, 50e9 * 2) * nccl_tables().bandwidth_factor["ring"]["Simple"]
    assert wire == pytest.approx(N * 7 / 8 / bus, rel=1e-12)  # two NICs a node, not three
