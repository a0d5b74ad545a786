"""The network: topologies, routing, max-min flow sharing and collective algorithms.

:class:`Network` is what the simulator uses: it maps ranks to chips, turns a
collective into the steps of its algorithm (:mod:`.collectives`) and runs them
one after another over a :class:`~.flows.FlowNetwork`, which shares the links
of a :class:`~.topology.Topology` among all transfers in flight.

    env = simpy.Environment()
    net = Network(env, build_topology(instance, chip, count=2), rank_chip)
    done = net.collective("all_reduce", ranks=range(32), nbytes=64e6)
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any

import simpy

from clustersim.errors import SimulationError
from clustersim.network import builders  # noqa: F401  (registers the shipped topologies)
from clustersim.network.collectives import (
    OPS,
    Algorithm,
    Step,
    algorithm,
    algorithm_names,
    collective_steps,
    register_algorithm,
)
from clustersim.network.flows import FlowGroup, FlowNetwork
from clustersim.network.maxmin import maxmin_rates, maxmin_rates_reference
from clustersim.network.topology import (
    Topology,
    build_topology,
    register_topology,
    topology_names,
)

__all__ = [
    "OPS",
    "Algorithm",
    "FlowGroup",
    "FlowNetwork",
    "Network",
    "Step",
    "Topology",
    "algorithm",
    "algorithm_names",
    "build_topology",
    "collective_steps",
    "maxmin_rates",
    "maxmin_rates_reference",
    "register_algorithm",
    "register_topology",
    "topology_names",
]

_Plan = tuple[tuple[FlowGroup, float, float], ...]


class Network:
    """Collectives and point-to-point sends between ranks, simulated as flows.

    ``rank_chip[r]`` is the chip of rank ``r``. ``algorithms`` maps a collective
    (``all_reduce``, ...) to an algorithm name; unset ops use ``auto``.
    """

    max_cached_plans: int = 16_384

    def __init__(
        self,
        env: simpy.Environment,
        topology: Topology,
        rank_chip: Sequence[int],
        algorithms: Mapping[str, str] | None = None,
        *,
        path: str = "cluster.collectives",
    ) -> None:
        self.env = env
        self.topology = topology
        self.flows = FlowNetwork(env, topology)
        self.rank_chip: tuple[int, ...] = tuple(int(c) for c in rank_chip)
        bad = [c for c in self.rank_chip if not 0 <= c < topology.n_chips]
        if bad:
            raise SimulationError(
                f"rank_chip names chips outside 0..{topology.n_chips - 1}: {bad[:8]}"
            )
        self.algorithms: dict[str, str] = dict.fromkeys(OPS, "auto")
        for op, name in (algorithms or {}).items():
            algorithm(name, op, path=path)  # validates both names
            self.algorithms[op] = name
        self._algorithm_fns = {op: algorithm(n, op, path=path) for op, n in self.algorithms.items()}
        self._steps: dict[tuple[str, int, float], list[Step]] = {}
        self._plans: dict[tuple[str, tuple[int, ...], float], _Plan] = {}
        self._plans_version = topology.version
        self.collectives_started = 0
        self.sends_started = 0

    # -- counters ----------------------------------------------------------------------------

    @property
    def entities_done(self) -> int:
        return self.flows.entities_done

    @property
    def transfers_done(self) -> int:
        """Fluid transfers finished (one per collective step or send); same as ``entities_done``."""
        return self.flows.entities_done

    @property
    def solves(self) -> int:
        return self.flows.solves

    @property
    def transfers(self) -> int:
        return self.flows.transfers

    # -- operations --------------------------------------------------------------------------

    def collective(self, op: str, ranks: Iterable[int], nbytes: float) -> simpy.Event:
        """Run ``op`` over ``ranks`` (in ring order) on an ``nbytes`` buffer; an event for its end.

        Routes are resolved now, so an unreachable member raises
        :class:`~clustersim.errors.PartitionError` at the call.
        """
        plan = self._plan(op, tuple(ranks), float(nbytes))
        self.collectives_started += 1
        if not plan:
            done = self.env.event()
            done.succeed()
            return done
        if len(plan) == 1:
            return self.flows.transfer_group(*plan[0])
        return self.env.process(self._run(plan))

    def send(self, src_rank: int, dst_rank: int, nbytes: float) -> simpy.Event:
        """One flow of ``nbytes`` from ``src_rank`` to ``dst_rank``, after the route's latency."""
        group = self.flows.group(((self._chip(src_rank), self._chip(dst_rank)),))
        self.sends_started += 1
        return self.flows.transfer_group(group, float(nbytes), group.latency_s)

    # -- internals ---------------------------------------------------------------------------

    def _chip(self, rank: int) -> int:
        if not 0 <= rank < len(self.rank_chip):
            raise SimulationError(f"rank {rank} is outside 0..{len(self.rank_chip) - 1}")
        return self.rank_chip[rank]

    def _run(self, plan: _Plan) -> Generator[simpy.Event, Any, None]:
        for group, nbytes, latency_s in plan:
            yield self.flows.transfer_group(group, nbytes, latency_s)

    def _plan(self, op: str, ranks: tuple[int, ...], nbytes: float) -> _Plan:
        if (
            self._plans_version != self.topology.version
            or len(self._plans) >= self.max_cached_plans
        ):
            self._plans.clear()
            self._plans_version = self.topology.version
        key = (op, ranks, nbytes)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        fn = self._algorithm_fns.get(op)
        if fn is None:
            raise SimulationError(f"unknown collective {op!r}; valid: {', '.join(OPS)}")
        if not ranks:
            raise SimulationError(f"{op} over an empty group")
        if not (nbytes >= 0 and math.isfinite(nbytes)):
            raise SimulationError(f"{op}: nbytes must be finite and >= 0 (got {nbytes})")
        chips = [self._chip(r) for r in ranks]
        p = len(ranks)
        skey = (op, p, nbytes)
        steps = self._steps.get(skey)
        if steps is None:
            steps = [] if p == 1 else fn(op, p, nbytes)
            if len(self._steps) < self.max_cached_plans:
                self._steps[skey] = steps
        out = []
        for step in steps:
            group = self.flows.group(tuple((chips[a], chips[b]) for a, b in step.pairs))
            k = step.repeats
            out.append((group, k * step.bytes_per_flow, k * group.latency_s))
        plan = tuple(out)
        self._plans[key] = plan
        return plan
