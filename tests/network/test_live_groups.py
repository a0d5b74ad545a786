"""The groups in flight (``network.live``): the links two groups share, and the components
a joining group touches, against a brute-force intersection."""

from __future__ import annotations

import numpy as np
import pytest

from clustersim.network.flows import Component, FlowGroup, LiveGroups
from clustersim.network.flows import live as live_module
from clustersim.network.flows.live import BLOCK


def _group(links: np.ndarray) -> FlowGroup:
    links = np.unique(links).astype(np.int64)
    return FlowGroup(links, np.ones(links.size), n_flows=1, latency_s=0.0)


@pytest.mark.parametrize("whole", [True, False])  # every link compared, or those in blocks
@pytest.mark.parametrize("size", [400, 40 * BLOCK])  # one block; groups over many blocks
def test_shared_links_and_touched_components_match_a_brute_force(
    monkeypatch: pytest.MonkeyPatch, size: int, whole: bool
) -> None:
    monkeypatch.setattr(live_module, "_WHOLE_UP_TO", 1 << 30 if whole else 0)
    rng = np.random.default_rng(7)
    wide = size > BLOCK
    groups = [
        _group(rng.integers(0, size, rng.integers(0, 30 * (1 + 30 * wide)))) for _ in range(60)
    ]
    groups += [_group(np.arange(i * 5, i * 5 + 5)) for i in range(20)]  # disjoint runs
    if wide:  # runs of whole blocks, some apart, some meeting
        groups += [_group(np.arange(i * BLOCK // 2, i * BLOCK // 2 + BLOCK, 3)) for i in range(20)]
    live = LiveGroups(size)
    comps = [Component(i) for i in range(len(groups))]
    for g, c in zip(groups[::2], comps[::2], strict=True):
        live.add(g, c)  # half the groups in flight, each in a component of its own
    for g in groups:
        want = [
            c for o, c in zip(groups[::2], comps[::2], strict=True)
            if o.links.size and g.links.size and np.intersect1d(o.links, g.links).size
        ]  # fmt: skip
        assert live.touched(g) == sorted(want, key=lambda c: c.ident)
        for o in groups[::3]:
            shared = live.common(g, o)
            both = np.intersect1d(g.links, o.links)
            assert np.array_equal(shared.links, both)
            for side in (g, o):
                assert np.array_equal(side.links[shared.at(side)], both)
