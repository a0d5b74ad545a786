"""Collective algorithms: the registry, its contract, and the ``auto`` choice.

An algorithm is one function ``(op, p, nbytes, info) -> list[Step]``,
registered with :func:`register_algorithm` under the name used in
``cluster.collectives`` (with the ops it implements). Pairs are over group
positions ``0..p-1``; the caller maps positions to ranks and ranks to chips.
``nbytes`` is the full buffer size, as in nccl-tests: the input of all-reduce,
reduce-scatter, broadcast, reduce, all-to-all and scatter, and the output of
all-gather and gather. Rooted collectives (broadcast, reduce, gather, scatter)
are rooted at position 0.
``info`` (a :class:`~.groups.GroupInfo`) says which positions share a chip or a
scale-up domain and where they sit on a torus; algorithms that need no
topology ignore it. (A function ``(op, p, nbytes)`` registers too.)

A :class:`Step` with ``repeats = k`` stands for k identical synchronous rounds.
It is simulated as one fluid transfer of ``k * bytes_per_flow`` per flow whose
latency is ``k`` times the longest route latency of its pairs; this is how
rounds that are identical by symmetry (the 2(p-1) rounds of a ring) are
solved once. Uncontended, a step then costs ``k * (a + bytes_per_flow * b)``,
the alpha-beta cost (Thakur, Rabenseifner & Gropp, 2005).

An algorithm may declare when it *applies* (``halving_doubling`` needs a power
of two; ``hierarchical`` a group over several domains; ``torus`` a grid on a
torus). Asked for a group where it does not, the collective falls back to
``ring`` (``pairwise`` for all-to-all): :func:`resolve_algorithm` says which
algorithm really runs.

``auto`` follows the communication runtime's choice: the Neuron runtime's by
message size (``neuron-runtime/about/collectives.rst``, :func:`choose`) on
Trainium, NCCL's tuning model (:mod:`clustersim.network.runtimes.nccl`) on GPUs, which
the :class:`~clustersim.network.Network` asks through its runtime
(:mod:`clustersim.network.runtimes.costs`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypeAlias, TypeVar

import numpy as np
from numpy.typing import NDArray

from clustersim.errors import ScenarioError
from clustersim.network.collectives.groups import GroupInfo, torus_grid

__all__ = [
    "HALVING_DOUBLING_MAX_BYTES",
    "MESH_MAX_BYTES",
    "MESH_MAX_FLOWS",
    "OPS",
    "Algorithm",
    "Step",
    "algorithm",
    "algorithm_names",
    "busbw_factor",
    "choose",
    "collective_step_arrays",
    "collective_steps",
    "register_algorithm",
    "resolve_algorithm",
]

OPS: tuple[str, ...] = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "reduce",
    "all_to_all",
    "gather",
    "scatter",
)
"""Collective operations, by the names used in ``cluster.collectives``."""

_FALLBACK = {"all_to_all": "pairwise", "gather": "mesh", "scatter": "mesh"}
"""What runs where the algorithm asked for does not apply (``ring`` for the rest)."""

MESH_MAX_BYTES = 2.0**20
"""``auto`` uses ``mesh`` below this size (the Neuron runtime: mesh below about 1 MB)."""

HALVING_DOUBLING_MAX_BYTES = 56 * 2.0**20
"""``auto`` uses ``halving_doubling`` up to this size (the Neuron runtime: up to about 56 MB)."""

MESH_MAX_FLOWS = 65_536
"""``auto`` avoids ``mesh`` when its p(p-1) flows would exceed this (p > 256): a bound on
simulation cost; at that scale the Neuron runtime would not post all pairs at once either."""


def busbw_factor(op: str, p: int) -> float:
    """nccl-tests' bus bandwidth factor of ``op`` over ``p`` ranks."""
    if op == "all_reduce":
        return 2 * (p - 1) / p
    if op in ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"):
        return (p - 1) / p
    return 1.0


@dataclass(frozen=True)
class Step:
    """``repeats`` identical synchronous rounds, each moving ``bytes_per_flow`` on every pair.

    ``pipelined`` rounds (a ring's) stream chunk after chunk over fixed peers, so the
    runtime's per-round handshake overlaps the data of the round before: the step pays
    the round cost of :mod:`clustersim.network.runtimes.costs` once, as the pipeline's
    fill, not once per round.
    Rounds that depend on the whole of the previous round (halving-doubling, mesh,
    trees) pay it every round. ``reduces``: the receiver adds what it gets into its
    own buffer (a reduce-scatter round), which DMA engines before NeuronCore-v4 do at
    half their copy throughput. ``hops`` (intra-domain, inter-domain), when given, is
    the chain of hops a chunk of a pipelined step travels before the last rank has it
    (a tree's depth): its latency is that many hops, whatever the rounds.
    """

    pairs: tuple[tuple[int, int], ...]
    bytes_per_flow: float
    repeats: int = 1
    pipelined: bool = False
    reduces: bool = False
    hops: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.repeats < 1 or not self.bytes_per_flow >= 0:
            raise ValueError(f"a step needs repeats >= 1 and bytes >= 0 (got {self!r})")


Algorithm: TypeAlias = Callable[[str, int, float, GroupInfo], list[Step]]
"""``(op, p, nbytes, info) -> steps``."""

Applies: TypeAlias = Callable[[int, GroupInfo], bool]
"""``(p, info) -> whether the algorithm can run on this group``."""

StepArrays: TypeAlias = list[tuple[Step, NDArray[np.int64]]]
"""Steps with their pairs as ``n x 2`` arrays (and ``pairs=()`` in the step itself)."""

ArrayForm: TypeAlias = Callable[[str, int, float, GroupInfo], StepArrays]
"""``(op, p, nbytes, info) -> steps, each with its pairs as an array``: what an algorithm
with many pairs per step gives the simulator, so its pairs never become Python tuples."""

F = TypeVar("F", bound=Callable[..., list[Step]])


@dataclass(frozen=True)
class _Entry:
    fn: Algorithm
    ops: frozenset[str]
    applies: Applies | None
    arrays: ArrayForm | None = None


_ALGORITHMS: dict[str, _Entry] = {}


def register_algorithm(
    name: str,
    *,
    ops: Iterable[str] = OPS,
    applies: Applies | None = None,
    arrays: ArrayForm | None = None,
) -> Callable[[F], F]:
    """Register an algorithm under ``name`` for the collective ``ops`` it implements.

    ``applies(p, info)``, when given, says whether it can run on a group; where it
    cannot, the collective falls back to ``ring`` (``pairwise`` for all-to-all).
    ``arrays``, when given, is the same algorithm with each step's pairs as an array
    (:data:`ArrayForm`): the simulator then builds no tuples (an all-to-all over 4,096
    ranks has 16.8M pairs). It must give the same steps as the algorithm itself.
    """
    supported = frozenset(ops)
    unknown = supported - set(OPS)
    if unknown:
        raise ValueError(f"algorithm {name!r}: unknown ops {sorted(unknown)}; valid: {OPS}")

    def deco(fn: F) -> F:
        if name in _ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is already registered")
        _ALGORITHMS[name] = _Entry(_four_arguments(fn), supported, applies, arrays)
        return fn

    return deco


def _four_arguments(fn: Callable[..., list[Step]]) -> Algorithm:
    """``fn`` itself, or ``fn`` wrapped to ignore ``info`` if it takes ``(op, p, nbytes)``."""
    params = inspect.signature(fn).parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 4 or any(p.kind is p.VAR_POSITIONAL for p in params):
        return fn

    def legacy(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
        del info
        return fn(op, p, nbytes)

    return legacy


def algorithm_names(op: str | None = None) -> list[str]:
    """Registered algorithm names, or those that implement ``op``."""
    return sorted(n for n, e in _ALGORITHMS.items() if op is None or op in e.ops)


def algorithm(name: str, op: str, *, path: str = "cluster.collectives") -> Algorithm:
    """The algorithm ``name`` for ``op``; a :class:`ScenarioError` at ``path.op`` if none."""
    if op not in OPS:
        raise ScenarioError(path, op, f"unknown collective; valid: {', '.join(OPS)}")
    entry = _ALGORITHMS.get(name)
    if entry is None or op not in entry.ops:
        problem = "unknown algorithm" if entry is None else f"algorithm does not implement {op}"
        raise ScenarioError(
            f"{path}.{op}", name, f"{problem}; valid: {', '.join(algorithm_names(op))}"
        )
    return entry.fn


def _applies(name: str, p: int, info: GroupInfo) -> bool:
    entry = _ALGORITHMS.get(name)
    return entry is not None and (entry.applies is None or entry.applies(p, info))


def choose(op: str, p: int, nbytes: float, info: GroupInfo) -> str:
    """The algorithm ``auto`` runs on the Neuron runtime, following its size rule.

    - all-to-all: ``mesh`` (every pair at once), or ``pairwise`` when p(p-1) >
      :data:`MESH_MAX_FLOWS`.
    - gather, scatter: ``mesh`` (the root's p-1 transfers at once; the runtimes have
      no other algorithm for them).
    - broadcast, reduce: ``tree`` below :data:`MESH_MAX_BYTES`, ``ring`` above.
    - all-reduce, reduce-scatter, all-gather: ``hierarchical`` when the group
      spans several scale-up domains with the same number (> 1) of ranks in
      each (its in-domain phases run a ring from :data:`MESH_MAX_BYTES` up, with
      no halving-doubling range: the curve of nccom-test's all-reduce over
      2 x trn1.32xlarge, see :mod:`.algorithms.hierarchical`); otherwise ``mesh`` below
      :data:`MESH_MAX_BYTES` (and p(p-1) <= :data:`MESH_MAX_FLOWS`), ``halving_doubling`` up to
      :data:`HALVING_DOUBLING_MAX_BYTES` when p is a power of two; above, the
      runtime's ring ("KangaRing"): ``torus`` when the group is a grid of two or
      more axes on a torus, else ``ring``.
    """
    mesh_ok = p * (p - 1) <= MESH_MAX_FLOWS
    if op in ("all_to_all", "gather", "scatter"):  # a rooted one has p-1 flows
        return "mesh" if mesh_ok or op != "all_to_all" else "pairwise"
    if op in ("broadcast", "reduce"):
        return "tree" if nbytes < MESH_MAX_BYTES else "ring"
    if _applies("hierarchical", p, info):
        return "hierarchical"
    if nbytes < MESH_MAX_BYTES and mesh_ok:
        return "mesh"
    if nbytes <= HALVING_DOUBLING_MAX_BYTES and _applies("halving_doubling", p, info):
        return "halving_doubling"
    # Large messages on a torus: rings along each axis move the same bytes as one
    # ring but keep every hop on a physical neighbour link (a flat ring over a 3D
    # UltraServer is held to its slowest, cross-instance links).
    grid = torus_grid(info)
    on_torus = grid is not None and len(grid[0]) >= 2 and _applies("torus", p, info)
    return "torus" if on_torus else "ring"


def resolve_algorithm(
    name: str,
    op: str,
    p: int,
    nbytes: float,
    info: GroupInfo | None = None,
) -> str:
    """The algorithm that runs when ``name`` is asked for: ``auto``'s choice on the
    Neuron runtime (:func:`choose`), or a fallback."""
    algorithm(name, op)
    info = GroupInfo.flat(p) if info is None else info
    if name == "auto":
        name = choose(op, p, nbytes, info)
    if not _applies(name, p, info):
        name = _FALLBACK.get(op, "ring")
    return name


def collective_steps(
    op: str,
    p: int,
    nbytes: float,
    name: str = "auto",
    info: GroupInfo | None = None,
) -> list[Step]:
    """The steps of ``op`` over ``p`` positions with algorithm ``name``; none when ``p == 1``.

    ``info`` describes the group's placement (default: ``p`` unrelated chips).
    """
    algorithm(name, op)
    if p < 1 or not nbytes >= 0:
        raise ValueError(f"a collective needs p >= 1 and nbytes >= 0 (got p={p}, nbytes={nbytes})")
    info = GroupInfo.flat(p) if info is None else info
    if info.p != p:
        raise ValueError(f"info describes {info.p} positions, not {p}")
    if p == 1:
        return []
    resolved = resolve_algorithm(name, op, p, nbytes, info)
    return _ALGORITHMS[resolved].fn(op, p, float(nbytes), info)


def collective_step_arrays(
    op: str,
    p: int,
    nbytes: float,
    name: str = "auto",
    info: GroupInfo | None = None,
) -> StepArrays:
    """:func:`collective_steps`, each step with its pairs as an ``n x 2`` array (and
    ``pairs=()`` in the step): from the algorithm's array form where it has one."""
    algorithm(name, op)
    info = GroupInfo.flat(p) if info is None else info
    if p > 1 and info.p == p and nbytes >= 0:
        entry = _ALGORITHMS[resolve_algorithm(name, op, p, nbytes, info)]
        if entry.arrays is not None:
            return entry.arrays(op, p, float(nbytes), info)
    return [
        (replace(s, pairs=()), np.asarray(s.pairs, dtype=np.int64).reshape(-1, 2))
        for s in collective_steps(op, p, nbytes, name, info)
    ]


@register_algorithm("auto")
def auto(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """The algorithm :func:`choose` picks for this collective, size and group."""
    return collective_steps(op, p, nbytes, choose(op, p, nbytes, info), info)
