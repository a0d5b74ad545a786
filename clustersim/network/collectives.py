"""Collective algorithms: each turns a collective into synchronous steps of flows.

An algorithm is one function ``(op, p, nbytes) -> list[Step]``, registered with
:func:`register_algorithm` under the name used in ``cluster.collectives`` (the
ops it supports listed). Pairs are over group positions ``0..p-1``; the caller
maps positions to ranks and ranks to chips. ``nbytes`` is the full buffer size,
as in nccl-tests: the input of all-reduce, reduce-scatter, broadcast and
all-to-all, and the output of all-gather.

A :class:`Step` with ``repeats = k`` stands for k identical synchronous rounds.
It is simulated as one fluid transfer of ``k * bytes_per_flow`` per flow whose
latency is ``k`` times the longest route latency of its pairs; this is how
rounds that are identical by symmetry (the 2(p-1) rounds of a ring) are
solved once. Uncontended, a step then costs ``k * (a + bytes_per_flow * b)``,
the alpha-beta cost (Thakur, Rabenseifner & Gropp, 2005).

``auto`` resolves to ``ring`` (``pairwise`` for all-to-all). The Neuron runtime
chooses by message size (mesh below 1 MB, recursive halving-doubling to 56 MB,
ring above); ``auto`` follows it once those algorithms are registered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeAlias

from clustersim.errors import ScenarioError

__all__ = [
    "OPS",
    "Algorithm",
    "Step",
    "algorithm",
    "algorithm_names",
    "collective_steps",
    "register_algorithm",
]

OPS: tuple[str, ...] = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "reduce",
    "all_to_all",
)
"""Collective operations, by the names used in ``cluster.collectives``."""


@dataclass(frozen=True)
class Step:
    """``repeats`` identical synchronous rounds, each moving ``bytes_per_flow`` on every pair."""

    pairs: tuple[tuple[int, int], ...]
    bytes_per_flow: float
    repeats: int = 1

    def __post_init__(self) -> None:
        if self.repeats < 1 or not self.bytes_per_flow >= 0:
            raise ValueError(f"a step needs repeats >= 1 and bytes >= 0 (got {self!r})")


Algorithm: TypeAlias = Callable[[str, int, float], list[Step]]


@dataclass(frozen=True)
class _Entry:
    fn: Algorithm
    ops: frozenset[str]


_ALGORITHMS: dict[str, _Entry] = {}


def register_algorithm(name: str, *, ops: Iterable[str] = OPS) -> Callable[[Algorithm], Algorithm]:
    """Register an algorithm under ``name`` for the collective ``ops`` it implements."""
    supported = frozenset(ops)
    unknown = supported - set(OPS)
    if unknown:
        raise ValueError(f"algorithm {name!r}: unknown ops {sorted(unknown)}; valid: {OPS}")

    def deco(fn: Algorithm) -> Algorithm:
        if name in _ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is already registered")
        _ALGORITHMS[name] = _Entry(fn, supported)
        return fn

    return deco


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


def collective_steps(op: str, p: int, nbytes: float, name: str = "auto") -> list[Step]:
    """The steps of ``op`` over ``p`` positions with algorithm ``name``; none when ``p == 1``."""
    fn = algorithm(name, op)
    if p < 1 or not nbytes >= 0:
        raise ValueError(f"a collective needs p >= 1 and nbytes >= 0 (got p={p}, nbytes={nbytes})")
    if p == 1:
        return []
    return fn(op, p, float(nbytes))


# -- algorithms -----------------------------------------------------------------------------------


def _ring_pairs(p: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, (i + 1) % p) for i in range(p))


def _chain_pairs(p: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, i + 1) for i in range(p - 1))


@register_algorithm(
    "ring", ops=("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")
)
def ring(op: str, p: int, nbytes: float) -> list[Step]:
    """Ring collectives; each rank sends to its successor in the order the group is given.

    - all-reduce: reduce-scatter then all-gather, 2(p-1) rounds of n/p:
      ``2(p-1)a + 2(p-1)/p · n b``.
    - reduce-scatter, all-gather: p-1 rounds of n/p: ``(p-1)a + (p-1)/p · n b``.
    - broadcast (root at position 0) and reduce (root at position 0): a pipelined
      chain 0 -> 1 -> ... -> p-1 (reversed for reduce), in the limit of fine
      chunks: the pipeline fills over p-1 hops and then the buffer streams at link
      rate, ``(p-1)a + n b``. It is one step of p-1 rounds of n/(p-1) per link.
    """
    if op == "all_reduce":
        return [Step(_ring_pairs(p), nbytes / p, 2 * (p - 1))]
    if op in ("reduce_scatter", "all_gather"):
        return [Step(_ring_pairs(p), nbytes / p, p - 1)]
    chain = _chain_pairs(p)
    if op == "reduce":
        chain = tuple((b, a) for a, b in reversed(chain))
    return [Step(chain, nbytes / (p - 1), p - 1)]


@register_algorithm("pairwise", ops=("all_to_all",))
def pairwise(op: str, p: int, nbytes: float) -> list[Step]:
    """All-to-all in p-1 rounds; in round r, position i sends its n/p block to (i + r) mod p.

    The rounds use different pairs, so each is its own step:
    ``(p-1)a + (p-1)/p · n b`` when uncontended.
    """
    del op
    return [Step(tuple((i, (i + r) % p) for i in range(p)), nbytes / p) for r in range(1, p)]


@register_algorithm("auto")
def auto(op: str, p: int, nbytes: float) -> list[Step]:
    """``ring``, or ``pairwise`` for all-to-all (message-size rules come with more algorithms)."""
    return pairwise(op, p, nbytes) if op == "all_to_all" else ring(op, p, nbytes)
