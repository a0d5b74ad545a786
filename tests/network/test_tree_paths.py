"""The bulk routes of a tree fabric (shifts and masks for powers of two, a table of the
subtree hashes, one gather per tier) are the module's routing rule, pair by pair."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_net_fabrics import build

from clustersim.network.fabric import TreeFabric, fabrics
from clustersim.network.fabric.topology import ecmp_hash

FABRICS = [
    ("fat_tree", 8, 3, 4, 1.0),  # radix, tiers, NICs per instance, oversubscription
    ("fat_tree", 12, 3, 16, 2.0),
    ("fat_tree", 6, 4, 2, 1.0),
    ("fat_tree", 10, 3, 8, 1.5),
    ("rail", 16, 3, 16, 1.0),
    ("rail", 8, 4, 16, 2.0),
    ("nonblocking", 64, 1, 16, 1.0),
]


def rule(tree: TreeFabric, s: int, d: int, offset: int) -> list[int]:
    """The path of ``s -> d`` as :mod:`~clustersim.network.fabric.fabrics` states it: up to
    the lowest tier whose subtree holds both leaves, along path ``(slot of d + hash(subtrees)
    + offset) mod paths``, then down (padded with -1)."""
    ls, ld = int(tree.leaf_of[s]), int(tree.leaf_of[d])
    m = next(j for j in range(tree.levels) if ls // tree.span[j] == ld // tree.span[j])
    width = tree.width[m]
    p = 0
    if width > 1:
        salt = int(ecmp_hash([ls // tree.span[m]], [ld // tree.span[m]])[0])
        p = (ld * tree.per_leaf + int(tree.pos[d]) + salt + offset) % width
    col = [p % tree.width[j] for j in range(m)]
    port = [(p // tree.width[j]) % tree.ports[j] for j in range(m)]
    ups = [int(tree.up[j][ls // tree.span[j] * tree.width[j] + col[j], port[j]]) for j in range(m)]
    downs = [
        int(tree.down[j][ld // tree.span[j] * tree.width[j] + col[j], port[j]])
        for j in reversed(range(m))
    ]
    path = [int(tree.host_up[s]), *ups, *downs, int(tree.host_down[d])]
    return path + [-1] * (2 * tree.levels - len(path))


@pytest.mark.parametrize("table", [True, False])  # the subtrees' hashes kept, or not
@pytest.mark.parametrize("case", FABRICS)
def test_bulk_paths_follow_the_rule(
    specs: Any, monkeypatch: pytest.MonkeyPatch, table: bool, case: tuple[Any, ...]
) -> None:
    fabric, radix, tiers, nics, o = case
    if not table:
        monkeypatch.setattr(fabrics, "_SALT_TABLE", 0)
    topo = build(specs, 24, fabric=fabric, radix=radix, tiers=tiers, nics=nics, oversubscription=o)
    tree = topo.scaleout
    assert isinstance(tree, TreeFabric)
    rng = np.random.default_rng(radix * tiers)
    n = topo.n_chips
    src = rng.integers(0, n, 1200)
    dst = np.concatenate([rng.integers(0, n, 800), (src[800:] + rng.integers(1, 40, 400)) % n])
    far = (src + n // 2) % n  # every pair of these turns at the top
    for s, d in [(src, dst), (src, far)]:
        for offset in (None, rng.integers(0, 4, s.size)):
            matrix, ok, turn = tree.paths_turning(s, d, None, offset)
            assert ok.all()
            assert np.array_equal((matrix >= 0).sum(axis=1), 2 * turn + 2)
            shift = np.zeros(s.size, dtype=np.int64) if offset is None else offset
            expected = [rule(tree, a, b, c) for a, b, c in zip(s, d, shift, strict=True)]
            assert matrix.tolist() == expected
            assert np.array_equal(tree.paths(s, d, None, offset)[0], matrix)
    # With links down: the paths that are up stay, the others take paths that are up.
    usable = rng.random(topo.n_links) > 0.02
    usable[tree.host_up] = usable[tree.host_down] = True
    matrix, ok = tree.paths(src, dst, usable)
    whole, _ = tree.paths(src, dst, None)
    up = usable[np.where(whole >= 0, whole, 0)].all(axis=1)
    assert np.array_equal(matrix[up], whole[up])
    assert usable[np.where(matrix >= 0, matrix, 0)][ok].all()
