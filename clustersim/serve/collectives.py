"""The tensor-parallel all-reduce of one replica, timed by the project's collective model.

A replica's ``tp`` ranks are placed as a scenario places them (ranks in chip order,
``cores / lnc`` per chip) on the scenario's fabric. Each distinct message size runs
once alone over one :class:`~clustersim.network.Network` (empty between sizes),
with the chip's communication runtime (its fixed costs: at TP 32-64 the small
messages of decode are latency-bound, and those costs are most of their time), and
the time is cached: every replica is placed alike, and their collectives do not
share links (each replica spans its own chips).
"""

from __future__ import annotations

import math

import simpy

from clustersim.network import Network
from clustersim.network.fabric import build_topology
from clustersim.network.runtimes import NO_COSTS, runtime_of
from clustersim.scenario import Resolved

__all__ = ["TpAllReduce"]


class TpAllReduce:
    """``self(nbytes)``: seconds of one all-reduce of ``nbytes`` over a replica's ranks.

    ``overheads=False`` leaves the runtime's fixed costs out (the wire time alone, as
    the collective microbenchmark's ``overheads=False``): a diagnostic, not a scenario key."""

    def __init__(self, res: Resolved, tp: int, *, overheads: bool = True) -> None:
        per_node = res.ranks_per_node
        instances = max(1, math.ceil(tp / per_node))
        self.topology = build_topology(res.instance, res.chip, instances)
        self.runtime = runtime_of(res.chip, res.instance) if overheads else NO_COSTS
        self.rank_chip = [r // res.ranks_per_chip for r in range(tp)]
        self.group = list(range(tp))
        self.algorithms = dict(res.scenario.cluster.collectives)
        self._cache: dict[float, float] = {}
        self._net: Network | None = None

    def __call__(self, nbytes: float) -> float:
        if len(self.group) < 2:
            return 0.0
        cached = self._cache.get(nbytes)
        if cached is None:
            # One network for every size: between two collectives it holds no flow, so
            # each runs alone, as in a fresh environment (building one costs more than
            # most of the collectives it would time).
            if self._net is None:
                self._net = Network(
                    simpy.Environment(), self.topology, self.rank_chip, self.algorithms,
                    runtime=self.runtime,
                )  # fmt: skip
            env = self._net.env
            start = env.now
            env.run(until=self._net.collective("all_reduce", self.group, nbytes))
            cached = self._cache[nbytes] = float(env.now - start)
        return cached
