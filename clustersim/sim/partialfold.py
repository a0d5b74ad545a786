"""Whether a folded run may stand for every group: the groups split across domains alike.

Folding (``sim.folding``) simulates one representative group of each kind per stage
and takes every other group of the kind to run alike. That holds only where every
group of a kind (and every pair of ranks a pipeline send joins) is split across the
scale-up domains (an instance, an UltraServer, an NVL72 rack) alike: the same members
share a domain in each. A tp of 16 on racks of 72 GPUs puts some TP groups in one rack
and others across two, whose collectives cross the network; a partly filled last rack
(``cluster.domain_fill: last``) holds fewer ranks than the others. That is checked, not
assumed; where it fails, the run is not folded (``fidelity: auto`` simulates every rank,
a forced ``folded`` is refused) and the summary says why (``fold_refused``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from clustersim.scenario import Resolved
from clustersim.sim.folding import replica_groups, replica_pairs
from clustersim.workload import Layout

__all__ = ["GROUP_KINDS", "partial_fold_refusal"]

GROUP_KINDS = (
    "tp", "cp", "dp", "dp_cp", "dp_shard", "dp_replicate",
    "ep", "etp", "edp", "edp_shard", "ep_node", "ep_cross",
)  # fmt: skip
"""The replica groups a folded step runs (``sim.folding.replica_groups``)."""


def _pattern(domains: NDArray[np.int64]) -> NDArray[np.int64]:
    """Each member's domain as its rank among its row's distinct domains (row by row)."""
    order = np.argsort(domains, axis=1, kind="stable")
    ordered = np.take_along_axis(domains, order, axis=1)
    new = np.ones(ordered.shape, dtype=np.int64)
    new[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    labels = np.empty_like(ordered)
    np.put_along_axis(labels, order, np.cumsum(new, axis=1) - 1, axis=1)
    return labels


def _alike(rows: NDArray[np.int64], ranks_per_domain: int) -> bool:
    """Whether every row of ranks is split across domains as the first row is."""
    if rows.shape[0] < 2 or rows.shape[1] < 2:
        return True
    domains = rows // ranks_per_domain
    # Rows whose domains are the first row's shifted by a constant are alike: the common
    # case, checked without sorting (a million-chip stage has some 10^5 rows a kind).
    shift = domains - domains[:, :1]
    if bool((shift == shift[0]).all()):
        return True
    labels = _pattern(domains)
    return bool((labels == labels[0]).all())


def partial_fold_refusal(res: Resolved, layout: Layout) -> str | None:
    """Why a folded run of ``res`` would not stand for every group (see the module doc);
    None where every group is split across the scale-up domains alike."""
    us = res.instance.ultraserver
    per_domain = (us.instances if us is not None else 1) * res.instance.chips * res.ranks_per_chip
    partial = us is not None and us.last_partial and res.scenario.cluster.count % us.instances
    why = " (the last one is partly filled)" if partial else ""
    # Stages a whole number of domains apart split their groups alike: stage 0 stands for all.
    stages = 1 if layout.ranks_per_stage % per_domain == 0 else layout.pp
    for stage in range(stages):
        for kind in GROUP_KINDS:
            if not _alike(replica_groups(layout, kind, stage), per_domain):
                return (
                    f"the {kind} groups of stage {stage} are not split across the scale-up "
                    f"domains alike{why}"
                )
        if stage + 1 < layout.pp and not _alike(replica_pairs(layout, stage, 1), per_domain):
            return (
                f"the pipeline sends of stage {stage} are not split across the scale-up "
                f"domains alike{why}"
            )
    return None
