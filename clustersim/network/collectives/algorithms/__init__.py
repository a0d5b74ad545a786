"""The shipped collective algorithms; importing this package registers them.

| name | ops (AR all-reduce, RS reduce-scatter, AG all-gather) | module |
|---|---|---|
| ``ring`` (bidirectional), ``ring_uni`` | AR, RS, AG, broadcast, reduce | :mod:`.ring` |
| ``halving_doubling`` | AR, RS, AG | :mod:`.halving_doubling` |
| ``tree`` (binomial) | AR, broadcast, reduce | :mod:`.tree` |
| ``mesh`` | all | :mod:`.direct` |
| ``pairwise`` | all-to-all | :mod:`.direct` |
| ``hierarchical`` | AR, RS, AG | :mod:`.hierarchical` |
| ``torus`` | AR, RS, AG | :mod:`.torus` |
| ``double_tree``, ``nvls``, ``nvls_tree`` (NCCL's Tree, NVLS, NVLS-tree) | AR | :mod:`.switched` |
| ``ring_channels`` (NCCL's rings across nodes) | RS, AG | :mod:`.switched` |
| ``sharp``, ``nvls_sharp`` (NCCL's CollNet: IB SHARP; with NVLS) | AR | :mod:`.innetwork` |

``auto`` is registered with the registry (:mod:`clustersim.network.collectives.registry`).
"""

from __future__ import annotations

from clustersim.network.collectives.algorithms import (
    direct,
    halving_doubling,
    hierarchical,
    innetwork,
    ring,
    switched,
    torus,
    tree,
)

__all__ = [
    "direct",
    "halving_doubling",
    "hierarchical",
    "innetwork",
    "ring",
    "switched",
    "torus",
    "tree",
]
