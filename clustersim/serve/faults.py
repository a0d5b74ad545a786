"""Failures during serving: ``failures.inject`` turned into replica events, and their summary.

The injections are the training side's (:mod:`clustersim.scenario.failures`), checked
against the cluster's topology by the same resolver
(:func:`~clustersim.failures.injection.resolve`: a chip that does not exist, two chips
that are not linked, a time below 0 exit 2 naming ``failures.inject.N``). What each
does to a serving run:

- **a chip or an instance down**: every replica with a rank on it fails
  (:meth:`~clustersim.serve.sched.Replica.fail`): its requests lose their KV. The
  router notices ``failures.detection_time`` later and resends them (a retry each)
  to the replicas still up; the replica is back, empty, ``failures.restart_time``
  after that (:class:`~clustersim.serve.sim.Fault`).
- **a lane or a link between two chips of one replica** (``down``, ``up`` or
  ``{degrade: f}``): from then on the replica's TP all-reduces run on its fabric with
  that change applied by the training side's :class:`~clustersim.failures.injection.Injector`
  (a lost lane takes its share of the link's bandwidth; the last lane takes the link
  down, and routing, once it notices, sends the flows around it), timed by the same
  collective model and runtime costs as the healthy replica's (:class:`LinkStateAllReduce`).
  The steady state after routing noticed is what every later iteration pays.

Straggling chips, switches and NICs are not modelled in serving (exit 2), nor chip
failures in a disaggregated run. :func:`failure_summary` gives ``summary.json``'s
``failures``: each injection's effect (replicas hit, requests in flight, when the
router noticed and when the replica was back), the requests retried and unfinished,
and the latency of requests before and around each failure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import simpy

from clustersim.errors import PartitionError, ScenarioError
from clustersim.failures.injection import Action, Injector, resolve
from clustersim.network import Network
from clustersim.network.fabric import build_topology
from clustersim.scenario import Resolved
from clustersim.scenario.failures import FailuresCfg, Injection, InjectionTarget
from clustersim.serve.collectives import TpAllReduce
from clustersim.serve.iteration import ACT_BYTES
from clustersim.serve.sched import IterationCost
from clustersim.serve.sim import Fault

__all__ = ["LinkStateAllReduce", "ServeFaults", "failure_summary", "serving_faults"]

PATH = "failures.inject"


class LinkStateAllReduce:
    """``self(nbytes)``: one all-reduce over the ranks of the replica from ``first_rank``
    on, with the lane and link injections ``applied`` (between its chips, in order).

    The fabric is the healthy model's (``healthy.topology``'s instances, the same
    runtime and algorithms), holding the replica's chips where the cluster has them
    (the injections' chips renumbered alike); routing has noticed every failed link
    (the steady state after ``detect_delay_s``).
    """

    def __init__(
        self,
        res: Resolved,
        healthy: TpAllReduce,
        first_rank: int,
        applied: Sequence[Injection],
        *,
        detect_delay_s: float,
    ) -> None:
        tp = len(healthy.group)
        topo = build_topology(res.instance, res.chip, healthy.topology.instances)
        n, per = topo.n_chips, res.ranks_per_chip
        base = (first_rank // per) // n * n
        self.rank_chip = [(first_rank + i) // per - base for i in range(tp)]
        self.group = list(range(tp))
        env = simpy.Environment()
        self.network = Network(
            env, topo, self.rank_chip, healthy.algorithms, runtime=healthy.runtime
        )
        local = [_shifted(inj, base) for inj in applied]
        injector = Injector(env, topo, resolve(local, topo), detect_delay_s=detect_delay_s)
        for act in injector.actions:
            injector.apply(act)
        env.run(until=env.now + detect_delay_s + 1.0)  # routing has noticed
        self._cache: dict[float, float] = {}
        self._healthy = healthy.fresh()

    def __call__(self, nbytes: float) -> float:
        if len(self.group) < 2:
            return 0.0
        cached = self._cache.get(nbytes)
        if cached is None:
            env = self.network.env
            start = env.now
            env.run(until=self.network.collective("all_reduce", self.group, nbytes))
            cached = float(env.now - start)
            if self._healthy.covers(nbytes):
                # The engine's measured all-reduce, slowed as the failure slows the
                # simulated one (the healthy replica's time is the measured kernel's).
                cached *= self._healthy(nbytes) / self._healthy.simulated_s(nbytes)
            self._cache[nbytes] = cached
        return cached


def _shifted(inj: Injection, base: int) -> Injection:
    """``inj`` with its lane or link's chips numbered from ``base``."""
    kind = inj.target.kind
    pair = getattr(inj.target, kind)
    moved = (int(pair[0]) - base, int(pair[1]) - base)
    return inj.model_copy(update={"target": InjectionTarget(**{kind: moved})})


@dataclass(frozen=True)
class ServeFaults:
    """The replica events of a run's injections, and what the summary says of each."""

    faults: list[Fault]
    records: list[dict[str, Any]]


def _replica_chips(res: Resolved, tp: int, replicas: int) -> list[set[int]]:
    per = res.ranks_per_chip
    return [{(r * tp + i) // per for i in range(tp)} for r in range(replicas)]


def serving_faults(
    res: Resolved,
    cfg: FailuresCfg,
    *,
    tp: int,
    replicas: int,
    healthy: TpAllReduce,
    cost_with: Callable[[Callable[[float], float]], IterationCost],
    disaggregated: bool,
) -> ServeFaults:
    """Check ``cfg.inject`` against the cluster and the replicas (exit 2 naming
    ``failures.inject.N``) and turn it into :class:`Fault` events; ``cost_with(allreduce)``
    builds a replica's iteration cost with another all-reduce model."""
    if not cfg.inject:
        return ServeFaults([], [])
    if cfg.reliability:
        key = "failures.preset" if cfg.preset is not None else "failures.rates"
        raise ScenarioError(
            key,
            cfg.preset if cfg.preset is not None else sorted(cfg.rates),
            "clustersim serve applies failures.inject; the long-horizon model is training's",
        )
    topo = build_topology(res.instance, res.chip, res.scenario.cluster.count)
    actions = resolve(cfg.inject, topo)
    chips = _replica_chips(res, tp, replicas)
    outage = cfg.detection_time + cfg.restart_time
    applied: dict[int, list[Injection]] = {}  # replica -> its link injections so far
    faults: list[Fault] = []
    records: list[dict[str, Any]] = []
    for act in sorted(actions, key=lambda a: (a.at_s, a.index)):
        where = f"{PATH}.{act.index}"
        kind = act.target.kind
        record: dict[str, Any] = {
            "index": act.index,
            "at_s": act.at_s,
            "target": kind,
            "name": act.target.name,
            "kind": act.what,
            "factor": act.factor if act.what == "degrade" else None,
            "replicas": [],
        }
        records.append(record)
        if kind in ("switch", "nic"):
            raise ScenarioError(
                f"{where}.target.{kind}",
                act.target.name,
                "serving models chip, instance, lane and link failures",
            )
        if kind in ("chip", "instance"):
            if act.what != "down":
                raise ScenarioError(
                    f"{where}.kind",
                    act.what,
                    "serving takes a chip or instance down only: its replicas restart by "
                    "themselves (failures.detection_time + restart_time later)",
                )
            hit = tuple(r for r, own in enumerate(chips) if own & set(act.target.chips))
            if hit and disaggregated:
                raise ScenarioError(
                    f"{where}.target.{kind}",
                    act.target.name,
                    "a replica failing in a disaggregated run is not modelled",
                )
            record["replicas"] = list(hit)
            record["effect"] = f"{_names(hit)} down for {outage:g} s" if hit else "no replica on it"
            down = Fault(
                act.index, act.at_s, hit, down=True,
                detect_s=cfg.detection_time, restart_s=cfg.restart_time,
            )  # fmt: skip
            faults.append(down)
            continue
        replica, pair = _link_replica(topo, act, chips, where)
        if replica is None:
            record["effect"] = "joins no replica's chips: no TP collective crosses it"
            continue
        record["replicas"] = [replica]
        local = applied.setdefault(replica, [])
        target = InjectionTarget(**{kind: pair})  # the resolved chips, by index
        local.append(cfg.inject[act.index].model_copy(update={"target": target}))
        allreduce = LinkStateAllReduce(
            res, healthy, replica * tp, local, detect_delay_s=cfg.link_detect_delay
        )
        decode = float(res.model.hidden * ACT_BYTES)
        try:
            after = allreduce(decode)
        except PartitionError:
            raise ScenarioError(
                where, act.target.name, f"cuts replica {replica}'s TP group apart (no route left)"
            ) from None
        before = healthy.fresh()(decode)  # the run's own clock untouched
        record["decode_allreduce_s"] = {"bytes": decode, "before": before, "after": after}
        record["effect"] = f"replica {replica}'s TP all-reduce x{after / before:.3g} at batch 1"
        faults.append(Fault(act.index, act.at_s, (replica,), cost=cost_with(allreduce)))
    return ServeFaults(faults, sorted(records, key=lambda r: int(r["index"])))


def _names(replicas: Sequence[int]) -> str:
    return ("replicas " if len(replicas) > 1 else "replica ") + ", ".join(map(str, replicas))


def _link_replica(
    topo: Any, act: Action, chips: list[set[int]], where: str
) -> tuple[int | None, tuple[int, int]]:
    """The replica whose chips the lane or link joins (None: none), and the two chips."""
    link = int(act.target.links[0])
    u, v = int(topo.link_u[link]), int(topo.link_v[link])
    if u >= topo.n_chips or v >= topo.n_chips:
        raise ScenarioError(
            f"{where}.target.{act.target.kind}",
            act.target.name,
            "serving applies lane and link failures between two chips",
        )
    return next((r for r, own in enumerate(chips) if u in own and v in own), None), (u, v)


# -- the summary ------------------------------------------------------------------------------


def _stats(values: np.ndarray) -> dict[str, float | int | None]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {"requests": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "requests": int(values.size),
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
    }


def _window(frame: pd.DataFrame) -> dict[str, Any]:
    return {key: _stats(frame[key].to_numpy(float)) for key in ("ttft_s", "tpot_s", "e2e_s")}


def failure_summary(
    faults: ServeFaults, outcomes: Sequence[dict[str, Any]], frame: pd.DataFrame, end_s: float
) -> dict[str, Any]:
    """``summary.json``'s ``failures``: each injection's record with what it did (from
    the run's ``outcomes``), the requests retried and unfinished, and per injection the
    latency of the requests before it and around it.

    ``around`` holds the requests in flight at the injection or arriving in the
    ``window_s`` after it (the outage until the replica is back; for a link, until the
    next injection or ``end_s``); ``before`` those arriving in the same length of time
    before it and done by then."""
    by_index = {int(o["index"]): o for o in outcomes}
    times = sorted(float(r["at_s"]) for r in faults.records)
    injections = []
    for rec in faults.records:
        out = {**rec, **by_index.get(int(rec["index"]), {})}
        out.setdefault("applied_s", None)
        at = float(rec["at_s"])
        if out.get("back_s") is not None:
            window = float(out["back_s"]) - at
        else:
            later = [t for t in times if t > at]
            window = (later[0] if later else max(end_s, at)) - at
        arrival, finish = frame["arrival_s"], frame["finish_s"].fillna(math.inf)
        in_flight = (arrival < at) & (finish > at)
        around = frame[in_flight | ((arrival >= at) & (arrival < at + window))]
        before = frame[(arrival >= at - window) & (arrival < at) & ~in_flight]
        out["window_s"] = window
        out["before"] = _window(before)
        out["around"] = _window(around)
        injections.append(out)
    return {
        "injections": injections,
        "requests_retried": int((frame["retries"] > 0).sum()),
        "retries": int(frame["retries"].sum()),
        "requests_unfinished": int((~np.isfinite(frame["finish_s"].to_numpy(float))).sum()),
    }
