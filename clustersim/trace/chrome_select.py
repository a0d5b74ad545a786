"""What the Chrome trace (:mod:`clustersim.trace.chrome`) selects and pairs: the
representative ranks it shows, each op's communication group, the p2p sends matched
to their receives, and the members of each collective instance."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
import pandas as pd
from pandas.api.types import CategoricalDtype

__all__ = [
    "RankLayout",
    "collective_instances",
    "group_of",
    "labels",
    "p2p_pairs",
    "representative_ranks",
]

# p2p op names end in what travels; activations go to the next stage, gradients back.
_P2P_DIRECTION = {"act": +1, "grad": -1}


class RankLayout(Protocol):
    """What the writer needs to know about the parallel layout (``workload.Layout`` fits)."""

    @property
    def ranks(self) -> int: ...

    def stage(self, rank: int) -> int: ...

    def group(self, name: str, rank: int) -> tuple[int, ...]: ...


def representative_ranks(
    layout: RankLayout, max_ranks: int, available: Iterable[int] | None = None
) -> list[int]:
    """Up to ``max_ranks`` ranks: the lowest ranks of every stage, the stages taken in turn.

    Ranks are numbered with TP fastest, so a stage's first ranks are one TP group
    (then the next DP replica): their collectives and sends link to each other.
    ``available`` limits the choice (a folded run traces one rank per stage).
    """
    pool = sorted(set(available)) if available is not None else range(layout.ranks)
    by_stage: dict[int, list[int]] = {}
    for r in pool:
        by_stage.setdefault(layout.stage(r), []).append(r)
    stages = [by_stage[s] for s in sorted(by_stage)]
    picked: list[int] = []
    depth = 0
    while len(picked) < max_ranks and any(depth < len(s) for s in stages):
        for ranks in stages:
            if depth < len(ranks) and len(picked) < max_ranks:
                picked.append(ranks[depth])
        depth += 1
    return sorted(picked)


def group_of(resource: str) -> str:
    """The parallel group of a trace resource: the part before its colon (``tp`` for a
    TP group's collectives), ``dp`` for every data-parallel group (``dp_cp``,
    ``dp_shard``, ``dp_replicate``), ``pp`` for point-to-point transfers, and ``""``
    for a resource of no group."""
    if resource == "p2p":
        return "pp"
    group = resource.split(":", 1)[0] if ":" in resource else ""
    return "dp" if group.startswith("dp_") else group  # dp_cp, dp_shard, dp_replicate


def labels(col: pd.Series[Any]) -> np.ndarray:
    """A string column as an object array of ``str``, fast for categoricals (the trace's)."""
    if isinstance(col.dtype, CategoricalDtype):
        names = np.array([str(c) for c in col.cat.categories] + [""], dtype=object)
        return names[col.cat.codes.to_numpy()]  # code -1 (missing) picks the trailing ""
    return np.array([str(v) for v in col.tolist()], dtype=object)


def _groups(frame: pd.DataFrame) -> np.ndarray:
    """The communication group of each row (``tp``, ``dp``, ``pp`` for p2p...), or ``""``."""
    res = frame["resource"].astype("category")
    names = np.array([group_of(str(c)) for c in res.cat.categories] + [""], dtype=object)
    return names[res.cat.codes.to_numpy()]  # code -1 (missing) picks the trailing ""


def p2p_pairs(frame: pd.DataFrame, layout: RankLayout) -> pd.DataFrame:
    """Match p2p sends to their receives: columns ``send`` and ``recv`` (row labels of ``frame``).

    The k-th send of an op and microbatch from rank r pairs with the k-th receive
    of the same microbatch on the peer stage, which shares r's other coordinates.
    """
    p2p = frame[frame["resource"] == "p2p"]
    empty = pd.DataFrame({"send": pd.Series(dtype="int64"), "recv": pd.Series(dtype="int64")})
    if p2p.empty:
        return empty
    parts = [op.split(".") for op in labels(p2p["op"]).tolist()]
    kind = pd.Series([p[-2] if len(p) > 1 else "" for p in parts], index=p2p.index)
    what = pd.Series([p[-1] for p in parts], index=p2p.index)
    sends = p2p[kind == "send"].copy()
    recvs = p2p[kind == "recv"].copy()
    if sends.empty or recvs.empty:
        return empty
    sends["what"] = what[sends.index]
    recvs["what"] = what[recvs.index]
    peers = []
    for rank, w in zip(sends["rank"].tolist(), sends["what"].tolist(), strict=True):
        step = _P2P_DIRECTION.get(w, 0)
        group = layout.group("pp", rank)
        target = layout.stage(rank) + step
        peers.append(group[target] if step and 0 <= target < len(group) else -1)
    sends["peer"] = peers
    sends["occ"] = sends.groupby(["rank", "what", "step", "microbatch"], observed=True).cumcount()
    recvs["occ"] = recvs.groupby(["rank", "what", "step", "microbatch"], observed=True).cumcount()
    left = sends.reset_index(names="send")[["send", "peer", "what", "step", "microbatch", "occ"]]
    right = recvs.reset_index(names="recv")[["recv", "rank", "what", "step", "microbatch", "occ"]]
    merged = left.merge(
        right,
        left_on=["peer", "what", "step", "microbatch", "occ"],
        right_on=["rank", "what", "step", "microbatch", "occ"],
    )
    return merged[["send", "recv"]].reset_index(drop=True)


def collective_instances(frame: pd.DataFrame, layout: RankLayout) -> pd.Series[int]:
    """An instance id per collective row (rows of ``frame`` whose resource is ``group:op``).

    Members of a group issue their collectives over that group in the same order,
    so the k-th collective of group g in a step is the same instance on every member.
    """
    res = frame["resource"].astype("category")
    is_coll_cat = np.array([":" in str(c) for c in res.cat.categories] + [False])
    is_coll = is_coll_cat[res.cat.codes.to_numpy()]
    coll = frame[is_coll]
    if coll.empty:
        return pd.Series(dtype="int64")
    group = _groups(coll)
    leaders: dict[tuple[str, int], int] = {}
    leader = []
    for g, r in zip(group.tolist(), coll["rank"].tolist(), strict=True):
        lead = leaders.get((g, r))
        if lead is None:
            lead = leaders[(g, r)] = layout.group(g, r)[0]
        leader.append(lead)
    keys = pd.DataFrame(
        {"group": group, "leader": leader, "step": coll["step"].to_numpy()},
        index=coll.index,
    )
    keys["rank"] = coll["rank"].to_numpy()
    keys["start"] = coll["start_s"].to_numpy()
    keys = keys.sort_values(["rank", "start"], kind="stable")
    keys["k"] = keys.groupby(["rank", "group", "step"]).cumcount()
    ids = keys.groupby(["group", "leader", "step", "k"], sort=False).ngroup()
    return ids.reindex(coll.index).astype("int64")
