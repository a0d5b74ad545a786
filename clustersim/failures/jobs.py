"""From a resolved scenario and a measured step time to a :class:`JobModel`.

Component counts come from the cluster: chips, instances, EFA NICs
(``instances x efa.nics``), switches and physical links of the built topology
(scale-up and scale-out links, both directions counted once; an idealised
non-blocking EFA fabric is one switch), and one job. The checkpoint size is the
model's weights and optimizer state from the memory model (bf16 weights, FP32
master weights and Adam moments: 14 bytes per parameter), unless the scenario
gives ``checkpoint.size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clustersim.errors import MISSING, ScenarioError
from clustersim.failures.analytic import daly_interval, young_interval
from clustersim.failures.processes import (
    MAX_FAILURES,
    FailureClass,
    expected_failures,
    resolve_classes,
)
from clustersim.failures.reliability import JobModel
from clustersim.scenario.failures import FailuresCfg

if TYPE_CHECKING:
    from clustersim.scenario import Resolved

__all__ = [
    "DEFAULT_HORIZON_S",
    "MAX_CHECKPOINTS",
    "JobSetup",
    "build_job",
    "checkpoint_bytes",
    "component_counts",
    "needs_degraded_step",
    "validate",
]

DEFAULT_HORIZON_S = 30 * 86400.0
"""Simulated wall time when the scenario gives neither ``horizon`` nor ``target_tokens``."""
MAX_CHECKPOINTS = 10_000_000
"""Most checkpoints one horizon may hold (each is two events)."""


@dataclass(frozen=True)
class JobSetup:
    """A job model with what it was derived from, for the summary."""

    model: JobModel
    checkpoint_bytes: float
    mtbf_s: float
    """The whole job's mean time between failures (long-run rate of every class)."""
    young_s: float
    daly_s: float
    checkpoint_cost_s: float
    """What one checkpoint stops training for: the write (sync) or the snapshot (async)."""


def component_counts(res: Resolved, kinds: set[str] | None = None) -> dict[str, int]:
    """How many components of each kind the cluster has (switches and links only if asked)."""
    count = res.scenario.cluster.count
    out = {
        "chip": res.chips,
        "instance": count,
        "nic": count * res.instance.efa.nics,
        "job": 1,
        "switch": 0,
        "link": 0,
    }
    if kinds is None or kinds & {"switch", "link"}:
        from clustersim.network.fabric import build_topology
        from clustersim.network.graphs import load_graph

        name = res.scenario.cluster.fabric_file
        topo = (
            build_topology(res.instance, res.chip, count)
            if name is None
            else load_graph(
                name,
                chips_per_instance=res.instance.chips,
                instances=count,
                local_bw_Bps=res.chip.dma_bw_Bps,
                where="cluster.fabric_file",
            )
        )
        out["switch"] = topo.n_nodes - topo.n_chips
        # The empty slots of a partly filled last domain are built but have no links.
        u, v = topo.link_u, topo.link_v
        empty = ((u >= topo.filled_chips) & (u < topo.n_chips)) | (
            (v >= topo.filled_chips) & (v < topo.n_chips)
        )
        out["link"] = int(((topo.kinds != "local") & ~empty).sum()) // 2
    return out


def checkpoint_bytes(res: Resolved) -> float:
    """Bytes of one checkpoint: the scenario's ``checkpoint.size``, or weights + optimizer."""
    cfg = res.scenario.failures.checkpoint
    if cfg.size is not None:
        return cfg.size
    from clustersim.workload.memory import (
        OPTIMIZER_BYTES_PER_PARAM,
        WEIGHT_BYTES_PER_PARAM,
        param_count,
    )

    return float(param_count(res.model) * (WEIGHT_BYTES_PER_PARAM + OPTIMIZER_BYTES_PER_PARAM))


def _classes(res: Resolved) -> list[FailureClass]:
    cfg = res.scenario.failures
    if not cfg.reliability:
        raise ScenarioError(
            "failures.preset", MISSING, "no failure rates: set failures.preset or failures.rates"
        )
    kinds = {"switch", "link"}
    from clustersim.failures.presets import preset

    wanted = {c.per for c in cfg.rates.values()}
    if cfg.preset is not None:
        wanted |= {c.per for c in preset(cfg.preset).classes.values()}
    return resolve_classes(cfg, component_counts(res, kinds & {w for w in wanted if w}))


def _degraded_step(
    cfg: FailuresCfg, step_time_s: float, given: float | None, *, links_cut: bool
) -> float | None:
    if cfg.degraded_step_time is not None and cfg.degraded_slowdown is not None:
        raise ScenarioError(
            "failures.degraded_slowdown",
            cfg.degraded_slowdown,
            "give degraded_step_time or degraded_slowdown, not both",
        )
    if given is not None:
        return given
    if cfg.degraded_step_time is not None:
        return cfg.degraded_step_time
    if cfg.degraded_slowdown is not None:
        return cfg.degraded_slowdown * step_time_s
    if cfg.recovery == "continue_degraded" and links_cut:
        raise ScenarioError(
            "failures.degraded_step_time",
            MISSING,
            "recovery continue_degraded needs the degraded step time: set "
            "failures.degraded_step_time or failures.degraded_slowdown, or let clustersim "
            "run or reliability derive it by simulating the step with a link cut",
        )
    return None


def needs_degraded_step(res: Resolved) -> bool:
    """Whether the degraded step time must be derived: ``recovery: continue_degraded``
    with failure classes that cut links, and neither ``degraded_step_time`` nor
    ``degraded_slowdown`` given. The simulator derives it (``sim.degraded``)."""
    cfg = res.scenario.failures
    return (
        cfg.reliability
        and cfg.recovery == "continue_degraded"
        and cfg.degraded_step_time is None
        and cfg.degraded_slowdown is None
        and any(c.effect == "link" for c in _classes(res))
    )


def validate(res: Resolved) -> None:
    """Check the reliability configuration without a step time (``clustersim check``);
    a missing degraded step time is no error: ``run`` and ``reliability`` derive it."""
    cfg = res.scenario.failures
    classes = _classes(res)
    _degraded_step(cfg, 1.0, None, links_cut=False)
    if cfg.horizon is not None or cfg.target_tokens is None:
        horizon = cfg.horizon if cfg.horizon is not None else DEFAULT_HORIZON_S
        _check_failures(classes, horizon, "failures.horizon", cfg.horizon)


def _check_failures(
    classes: list[FailureClass], horizon_s: float, path: str, value: object
) -> None:
    n = expected_failures(classes, horizon_s)
    if n > MAX_FAILURES:
        raise ScenarioError(
            path,
            value,
            f"{n:.3g} failures expected over the horizon; at most {MAX_FAILURES:,} are "
            "simulated: shorten it or check the rates",
        )


def build_job(
    res: Resolved,
    step_time_s: float,
    degraded_step_time_s: float | None = None,
    *,
    interval_s: float | None = None,
) -> JobSetup:
    """The job model of the scenario's ``failures`` section at the given step time(s)."""
    cfg = res.scenario.failures
    ck = cfg.checkpoint
    if not 0 < step_time_s < float("inf"):
        raise ScenarioError("--step-time", step_time_s, "must be a positive duration")
    classes = _classes(res)
    links_cut = any(c.effect == "link" for c in classes)
    degraded = _degraded_step(cfg, step_time_s, degraded_step_time_s, links_cut=links_cut)
    size = checkpoint_bytes(res)
    write_s = size / ck.storage_bandwidth
    mtbf = 1.0 / sum(c.rate_per_s for c in classes)
    cost = write_s if ck.mode == "sync" else ck.snapshot_time
    young, daly = young_interval(cost, mtbf), daly_interval(cost, mtbf)
    if interval_s is None:
        if ck.interval == "young":
            interval_s = young
        elif ck.interval == "daly":
            interval_s = daly
        else:
            interval_s = float(ck.interval)
    if ck.mode == "async":  # a write must finish before the next snapshot
        interval_s = max(interval_s, write_s)
    # Never checkpoint more often than once a step.
    interval_s = max(interval_s, step_time_s)
    tokens = float(res.scenario.training.global_batch_size * res.scenario.training.seq_len)
    horizon = cfg.horizon
    if horizon is None and cfg.target_tokens is None:
        horizon = DEFAULT_HORIZON_S
    model = JobModel(
        classes=tuple(classes),
        step_time_s=step_time_s,
        tokens_per_step=tokens,
        interval_s=interval_s,
        write_s=write_s,
        read_s=write_s,
        mode=ck.mode,
        snapshot_s=ck.snapshot_time,
        detection_s=cfg.detection_time,
        restart_s=cfg.restart_time,
        migrate_s=cfg.migrate_time,
        replace_s=cfg.replace_time,
        spares=cfg.spares,
        recovery=cfg.recovery,
        degraded_step_time_s=degraded,
        horizon_s=horizon,
        target_tokens=cfg.target_tokens,
    )
    path, value = (
        ("failures.horizon", cfg.horizon)
        if cfg.horizon is not None or cfg.target_tokens is None
        else ("failures.target_tokens", cfg.target_tokens)
    )
    _check_failures(classes, model.limit_s, path, value)
    if model.limit_s / interval_s > MAX_CHECKPOINTS:
        raise ScenarioError(
            "failures.checkpoint.interval",
            ck.interval,
            f"{model.limit_s / interval_s:.3g} checkpoints over the horizon; at most "
            f"{MAX_CHECKPOINTS:,} are simulated",
        )
    return JobSetup(model, size, mtbf, young, daly, cost)
