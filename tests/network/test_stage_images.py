"""Folded steps of stages placed alike, given as images of the first stage's (:mod:`.images`):
equal, array for array, to the steps routed from scratch, and refused where the shift
would not carry every link's capacity."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import simpy

from clustersim.network import FlowGroup, Network
from clustersim.network.fabric import Topology, build_topology

STAGES = 3
RANKS_PER_STAGE = 64  # two instances of 16 chips, two ranks per chip
HBM_BPS = 1e12


def _stage_rows(stage: int) -> np.ndarray:
    """Four data-parallel groups of 16 ranks, one per TP index (a stride of 4 ranks)."""
    return np.arange(RANKS_PER_STAGE).reshape(16, 4).T + stage * RANKS_PER_STAGE


def _network(topo: Topology) -> Network:
    chips = [r // 2 for r in range(STAGES * RANKS_PER_STAGE)]
    return Network(simpy.Environment(), topo, chips, hbm_Bps=HBM_BPS)


def _groups(net: Network, stage: int, op: str, algorithm: str) -> list[FlowGroup]:
    net.algorithms[op] = algorithm
    rows = _stage_rows(stage)
    plan = net._plan(op, tuple(rows[0].tolist()), 64e6, replicas=rows)
    send_rows = np.stack([rows.ravel(), rows.ravel() + RANKS_PER_STAGE], axis=1)
    if stage + 1 < STAGES:
        send = net._replica_send_group(int(rows[0, 0]), int(rows[0, 0]) + 64, send_rows)
        return [g for g, _, _ in plan] + [send]
    return [g for g, _, _ in plan]


def _assert_same(a: FlowGroup, b: FlowGroup) -> None:
    np.testing.assert_array_equal(a.links, b.links)
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.hbm_chips, b.hbm_chips)
    assert (a.n_flows, a.latency_s) == (b.n_flows, b.latency_s)
    pairs = a.pairs()  # type: ignore[operator]
    assert pairs.shape == (a.n_flows, 2)
    np.testing.assert_array_equal(pairs, b.pairs())  # type: ignore[operator]


@pytest.mark.parametrize(
    ("op", "algorithm"),
    [
        ("all_reduce", "ring"),
        ("all_reduce", "hierarchical"),
        ("reduce_scatter", "halving_doubling"),
        ("all_gather", "auto"),
    ],
)
def test_images_equal_the_steps_routed_from_scratch(specs: Any, op: str, algorithm: str) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 2 * STAGES)
    assert topo.local_paths is not None and topo.scaleout is not None
    net = _network(topo)
    base = _groups(net, 0, op, algorithm)
    distinct = 0
    for stage in range(1, STAGES):
        imaged = _groups(net, stage, op, algorithm)
        routed = _groups(_network(topo), stage, op, algorithm)
        assert len(imaged) == len(routed) == len(base) - (stage == STAGES - 1)
        for a, b, c in zip(imaged, routed, base, strict=False):
            _assert_same(a, b)
            assert not np.array_equal(a.links, c.links)
        distinct += len({g.links.tobytes() for g in imaged})
    assert net._images.images >= distinct > 0


def test_a_degraded_link_in_a_stage_is_routed_not_imaged(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 2 * STAGES)
    # A torus link of stage 1 (its first instance, chips 32 to 47) at half its capacity.
    topo.set_capacity_factor(topo.links_between([33], [34]), 0.5)
    net = _network(topo)
    _groups(net, 0, "all_reduce", "ring")
    before = net._images.images
    for a, b in zip(
        _groups(net, 1, "all_reduce", "ring"),
        _groups(_network(topo), 1, "all_reduce", "ring"),
        strict=True,
    ):
        _assert_same(a, b)
    assert net._images.images == before  # stage 1 is not stage 0 shifted: it was routed
    _groups(net, 2, "all_reduce", "ring")
    assert net._images.images > before  # stage 2 is stage 0 shifted
