"""The degraded step time of ``recovery: continue_degraded``, derived when not given.

Under ``continue_degraded`` a failure that cuts a link (a class with ``effect:
link``) is routed around and the job goes on at the degraded step time until the
link is repaired. When the scenario gives neither ``failures.degraded_step_time``
nor ``failures.degraded_slowdown``, it is measured here: the step is simulated
again with that failure's effect injected, the busiest link of the healthy step
cut from the start (``failures.inject``, with routes recomputed at once: the
detection and the reroute are the long-horizon model's ``detection_time``). The
busiest link is the one whose loss costs the most where every link carries its
share, so the figure errs on the side of a slower degraded job. A cut that leaves
no route (the chip's only link out) fails the step; the next busiest cable is
tried then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from clustersim.errors import MISSING, ScenarioError
from clustersim.network.fabric import node_name
from clustersim.scenario import Resolved
from clustersim.scenario.failures import Injection, InjectionTarget

if TYPE_CHECKING:
    from clustersim.network import Network
    from clustersim.sim.chakra_run import TraceResult
    from clustersim.sim.guard import Limits
    from clustersim.sim.result import Result

__all__ = ["MAX_CUTS_TRIED", "derive_degraded_step", "healthy_only"]

MAX_CUTS_TRIED = 4
"""Cables tried, busiest first, before giving up on a fabric where every cut partitions."""

Simulate = Callable[..., "Result | TraceResult"]


def healthy_only(res: Resolved) -> Resolved:
    """``res`` without the long-horizon model (the step alone, as a derivation needs)."""
    failures = res.scenario.failures.model_copy(update={"preset": None, "rates": {}})
    return dataclasses.replace(res, scenario=res.scenario.model_copy(update={"failures": failures}))


def _cut(res: Resolved, u: str, v: str) -> Resolved:
    """The step of ``res`` with the cable ``u``-``v`` down from the start, routed around."""
    cut = Injection(at=0.0, target=InjectionTarget(link=(u, v)), kind="down")
    failures = healthy_only(res).scenario.failures.model_copy(
        update={"inject": [cut], "link_detect_delay": 0.0}
    )
    return dataclasses.replace(res, scenario=res.scenario.model_copy(update={"failures": failures}))


def _cables_by_load(network: Network) -> list[tuple[str, str]]:
    """The cables between nodes that carried traffic in the healthy step, busiest first."""
    topo = network.topology
    loaded = network.flows.link_utilisation().bytes
    u, v = topo.link_u, topo.link_v
    order = np.argsort(-np.asarray(loaded, dtype=float), kind="stable")
    seen: set[frozenset[int]] = set()
    out: list[tuple[str, str]] = []
    for link in order.tolist():
        a, b = int(u[link]), int(v[link])
        if loaded[link] <= 0 or len(out) >= MAX_CUTS_TRIED:
            break
        cable = frozenset((a, b))
        if a == b or cable in seen:
            continue
        seen.add(cable)
        out.append((node_name(topo.node(a)), node_name(topo.node(b))))
    return out


def derive_degraded_step(
    res: Resolved,
    network: Network,
    healthy_step_s: float,
    simulate: Simulate,
    *,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """The degraded step time of ``res``, from the healthy step's ``network`` (its link
    loads) and ``simulate``: ``{step_time_s, slowdown, link, source, method}``.

    A :class:`ScenarioError` naming ``failures.degraded_step_time`` when it cannot be
    derived: no link carried traffic, every cut tried partitions the fabric, or the
    detailed simulation a cut needs is over ``limits``.
    """
    where = "failures.degraded_step_time"
    cables = _cables_by_load(network)
    if not cables:
        raise ScenarioError(
            where, MISSING, "cannot be derived: no link carried traffic in the step; give it"
        )
    for u, v in cables:
        try:
            summary = simulate(_cut(res, u, v), record=False, limits=limits).summary
        except ScenarioError as exc:
            raise ScenarioError(
                where,
                MISSING,
                "cannot be derived: the step with a link cut simulates every rank, and "
                f"{exc.problem.split(';')[0]}; raise the limit (--max-events, --max-memory) "
                "or give failures.degraded_step_time or failures.degraded_slowdown",
            ) from None
        if summary.get("step_failed"):
            continue  # the cut partitioned the fabric: try the next cable
        step = float(summary["step_time_s"])
        return {
            "step_time_s": step,
            "slowdown": step / healthy_step_s,
            "link": f"{u}<->{v}",
            "source": "derived",
            "method": (
                f"the step simulated with {u}<->{v}, the busiest link of the healthy step, "
                "cut and routed around"
            ),
        }
    raise ScenarioError(
        where,
        MISSING,
        f"cannot be derived: cutting any of the {len(cables)} busiest links leaves some "
        "chip without a route; give failures.degraded_step_time or failures.degraded_slowdown",
    )
