"""Hierarchical collectives: inside each scale-up domain, then across, then inside again.

A scale-up domain is an instance, or an UltraServer of instances joined by
NeuronLink (:class:`~..groups.GroupInfo`). The group must hold the same number
``L >= 2`` of ranks in each of ``D >= 2`` domains; a rank's *local index* is its
order among its domain's ranks in the group. With an ``n``-byte buffer:

- all-reduce: reduce-scatter of n inside every domain at once (NeuronLink);
  all-reduce of the n/L shard among the D ranks of each local index at once
  (EFA); all-gather of n inside every domain;
- reduce-scatter: the first two phases, with a reduce-scatter across;
- all-gather: all-gather of n/L across, then of n inside.

Each phase runs :func:`phase_algorithm`: inside the domains, ``mesh`` below
the Neuron runtime's 1 MB and a ring (in group order) from there up, at every
size; across them, what ``auto`` picks for the shard (``mesh``,
``halving_doubling`` or ``ring`` on D ranks). The time is the sum of those
algorithms' costs on the domain fabric and on the scale-out one. With a ring
inside (``a1``, ``b1``) and across (``a2``, ``b2``):
``T = 2 T_rs(L, n; a1, b1) + T_ar(D, n/L; a2, b2)``: EFA carries n/L per rank,
not the ~2n of a flat ring. Groups that are not spread like this fall back to
``ring``.

Why no halving-doubling inside. The Neuron runtime's size rule (mesh below 1 MB,
recursive halving-doubling to 56 MB, rings above; ``neuron-runtime/about/
collectives.rst``) is documented for a collective; which algorithm the
in-instance phases of a collective across instances run is not. The measured
curve answers it: nccom-test's all-reduce over 2 x trn1.32xlarge (64 ranks) is
one latency and one rate from 4 MiB to 1 GiB (about 1.4 ms + n / 24 GB/s), flat
from 1 MiB to 4 MiB, with no step at 56 MB. Halving-doubling inside up to 56 MB
and rings above step there (by +36% at 16 MiB and -15% at 64 MiB after the fit),
and so does the rule applied to the phases' shards (n / L, which moves the steps
to 32 MiB and 1.8 GB: rms 49% after the fit); a ring inside from 1 MB up, each of
its 2(L - 1) steps paying the runtime's handshake (:mod:`..costs`), fits every
measured size within 9% with the same constants that fit the one-instance curve. No public
source found says which algorithm the in-instance phases run: the Neuron pages on
inter-node collectives (``neuron-runtime/explore/internode-collective-comm.rst``)
are recalled to describe a phase inside each node joined over EFA, with no size
rule of its own; that is a recollection, not re-read, so the ring here rests on
that curve's shape alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from clustersim.network.collectives.groups import GroupInfo
from clustersim.network.collectives.registry import (
    Step,
    StepArrays,
    choose,
    collective_step_arrays,
    collective_steps,
    register_algorithm,
)

__all__ = [
    "hierarchical",
    "hierarchical_arrays",
    "is_hierarchical",
    "parallel_steps",
    "phase_algorithm",
]


def is_hierarchical(p: int, info: GroupInfo) -> bool:
    """Whether the group spans several domains with the same number (> 1) of ranks in each."""
    del p
    sizes = info.domain_sizes()
    return len(sizes) > 1 and sizes[0] > 1 and len(set(sizes)) == 1


def parallel_steps(steps: Sequence[Step], groups: Sequence[Sequence[int]]) -> list[Step]:
    """``steps`` (over positions ``0..q-1``) run at once in every group of ``q`` positions.

    A step's pairs list every group's in turn (the first group's pairs, then the
    second's, ...). The mapping is one numpy gather per step: the inner and outer
    phases of a data-parallel group of 10^4 ranks hold 10^5 pairs.
    """
    if not groups:
        return [replace(step, pairs=()) for step in steps]
    table = np.asarray(groups, dtype=np.int64)
    out = []
    for step in steps:
        local = np.asarray(step.pairs, dtype=np.int64).reshape(-1, 2)
        mapped = table[:, local]
        pairs = zip(mapped[:, :, 0].ravel().tolist(), mapped[:, :, 1].ravel().tolist(), strict=True)
        out.append(replace(step, pairs=tuple(pairs)))
    return out


def phase_algorithm(op: str, q: int, nbytes: float, *, inside: bool) -> str:
    """The algorithm of a phase of ``op`` over ``q`` ranks on ``nbytes`` (the buffer the
    phase works on): inside the domains the size rule without its halving-doubling
    range (``mesh`` below 1 MB, ``ring`` above), across them ``auto``'s choice."""
    name = choose(op, q, nbytes, GroupInfo.flat(q))
    return "ring" if inside and name == "halving_doubling" else name


def _phase_steps(op: str, q: int, nbytes: float, inside: bool) -> list[Step]:
    name = phase_algorithm(op, q, nbytes, inside=inside)
    return collective_steps(op, q, nbytes, name, GroupInfo.flat(q))


def _phase(op: str, groups: Sequence[Sequence[int]], nbytes: float, inside: bool) -> list[Step]:
    return parallel_steps(_phase_steps(op, len(groups[0]), nbytes, inside), groups)


def _phase_arrays(
    op: str, groups: Sequence[Sequence[int]], nbytes: float, inside: bool
) -> StepArrays:
    """:func:`_phase` with each step's pairs as an array (one gather, no tuples)."""
    table = np.asarray(groups, dtype=np.int64)
    q = len(groups[0])
    name = phase_algorithm(op, q, nbytes, inside=inside)
    return [
        (step, table[:, local].reshape(-1, 2))
        for step, local in collective_step_arrays(op, q, nbytes, name, GroupInfo.flat(q))
    ]


def _phases(op: str, p: int, nbytes: float, info: GroupInfo) -> list[tuple[str, bool, float]]:
    """Each phase as (collective, inside the domains, bytes)."""
    if not is_hierarchical(p, info):
        raise ValueError(
            "hierarchical needs the same number (> 1) of ranks in each of several domains"
        )
    shard = nbytes / len(info.domain_members()[0])
    if op == "reduce_scatter":
        return [("reduce_scatter", True, nbytes), ("reduce_scatter", False, shard)]
    if op == "all_gather":
        return [("all_gather", False, shard), ("all_gather", True, nbytes)]
    return [
        ("reduce_scatter", True, nbytes),
        ("all_reduce", False, shard),
        ("all_gather", True, nbytes),
    ]


def _groups(info: GroupInfo) -> tuple[list[list[int]], list[list[int]]]:
    """The ranks of each domain, and the ranks of each local index across the domains."""
    inner = [list(members) for members in info.domain_members()]
    return inner, [list(peers) for peers in zip(*inner, strict=True)]


def hierarchical_arrays(op: str, p: int, nbytes: float, info: GroupInfo) -> StepArrays:
    """:func:`hierarchical` with each step's pairs as an array."""
    phases = _phases(op, p, nbytes, info)
    inner, outer = _groups(info)
    out: StepArrays = []
    for name, inside, size in phases:
        out += _phase_arrays(name, inner if inside else outer, size, inside)
    return out


@register_algorithm(
    "hierarchical",
    ops=("all_reduce", "reduce_scatter", "all_gather"),
    applies=is_hierarchical,
    arrays=hierarchical_arrays,
)
def hierarchical(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """Inside the domains, across them, and inside again; see the module doc."""
    phases = _phases(op, p, nbytes, info)
    inner, outer = _groups(info)
    out: list[Step] = []
    for name, inside, size in phases:
        out += _phase(name, inner if inside else outer, size, inside)
    return out
