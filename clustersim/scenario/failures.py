"""The ``failures`` section of a scenario: injections inside a step, and the
long-horizon reliability model (failure processes, checkpoints, recovery).

``inject`` lists events at fixed simulated times::

    failures:
      inject:
        - {at: 2ms, target: {lane: [3, 7]}, kind: down}        # one lane of chip 3 -> chip 7
        - {at: 0, target: {chip: 12}, kind: {straggle: 1.5}}    # chip 12 computes 1.5x slower
        - {at: 5ms, target: {link: [0, 1]}, kind: {degrade: 0.5}}

A target names exactly one component: ``link`` or ``lane`` (a pair of chip
indices, or of topology node names such as ``"switch0"``), ``chip``, ``instance``,
``switch`` (a node name) or ``nic`` (the EFA NIC of an instance, by instance
index). A kind is ``down``, ``up``, ``{degrade: f}`` (bandwidth times f, 0 < f <= 1)
or ``{straggle: f}`` (compute time times f, f >= 1). ``link_detect_delay`` (default
10 ms) is how long routing takes to notice a failed link: until then flows on it stall
(``clustersim.failures.injection`` says what each kind does to each target).

The other keys configure the long-horizon reliability model
(``clustersim.failures``), which runs when ``preset`` or ``rates`` is given::

    failures:
      preset: llama3-54d          # failure classes with per-component rates (presets/*.yaml)
      rates:                      # add classes, or override fields of the preset's
        hbm: {mtbf: 4000d, per: chip, shape: 1.0, repair: 1d, effect: node}
      checkpoint: {interval: daly, storage_bandwidth: 2TB/s, mode: sync}
      detection_time: 5min
      restart_time: 10min
      spares: 16                  # hot-spare instances
      replace_time: 1h            # to bring in a node when no spare is free
      recovery: restart_all       # or migrate_affected, continue_degraded
      horizon: 54d                # or target_tokens: 15e12
      seeds: 8                    # Monte Carlo replications
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from clustersim.catalog import register_model
from clustersim.catalog.schema import Bandwidth, Bytes, Duration, Strict

__all__ = [
    "COMPONENT_KINDS",
    "CheckpointCfg",
    "Degrade",
    "FailureClassCfg",
    "FailuresCfg",
    "Injection",
    "InjectionTarget",
    "Straggle",
]

COMPONENT_KINDS = ("chip", "instance", "nic", "switch", "link", "job")
"""What a failure class counts: its rate is per component, times the cluster's count."""
Component = Literal["chip", "instance", "nic", "switch", "link", "job"]
PositiveDuration = Annotated[Duration, Field(gt=0, le=1e12)]
"""At most about 30,000 years: long enough for any MTBF, short enough to stay finite."""
TimeSpan = Annotated[Duration, Field(ge=0, le=1e10)]

NodeRef = int | str
"""A chip index, or a topology node name."""


@register_model
class InjectionTarget(Strict):
    """Exactly one component."""

    link: tuple[NodeRef, NodeRef] | None = None
    lane: tuple[NodeRef, NodeRef] | None = None
    chip: int | None = Field(default=None, ge=0)
    instance: int | None = Field(default=None, ge=0)
    switch: str | None = None
    nic: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> InjectionTarget:
        named = [k for k in type(self).model_fields if getattr(self, k) is not None]
        if len(named) != 1:
            raise ValueError(
                "name exactly one of link, lane, chip, instance, switch, nic "
                f"(got {', '.join(named) or 'none'})"
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in type(self).model_fields if getattr(self, k) is not None)


@register_model
class Degrade(Strict):
    degrade: float = Field(gt=0, le=1, allow_inf_nan=False)


@register_model
class Straggle(Strict):
    straggle: float = Field(ge=1, le=1e6, allow_inf_nan=False)


@register_model
class Injection(Strict):
    at: Duration = Field(default=0.0, ge=0, le=1e9)
    target: InjectionTarget
    kind: Literal["down", "up"] | Degrade | Straggle = "down"


@register_model
class FailureClassCfg(Strict):
    """One class of failures: a rate per component, counted over the cluster.

    The rate is given as ``mtbf`` (mean time between failures of one component),
    or as an observation: ``failures`` seen on ``components`` components over
    ``over`` (so that MTBF = components x over / failures). ``shape`` is the
    Weibull shape (1: exponential; below 1 infant mortality, above 1 wear-out).
    ``effect``: ``node`` takes the component's instance out (it needs a spare or a
    replacement), ``job`` crashes the job only (a software fault; restart in
    place), ``link`` cuts a link (the job continues degraded under
    ``recovery: continue_degraded``; otherwise the link's node is cordoned and
    replaced like a failed node). ``repair`` is how long the failed component stays
    out: a node returns to the spare pool, a link to service. In a scenario every
    key is optional when the class overrides a preset's class of the same name.
    """

    cause: str | None = Field(default=None, max_length=200)
    per: Component | None = None
    mtbf: PositiveDuration | None = None
    failures: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    components: int | None = Field(default=None, ge=1, le=10**9)
    over: PositiveDuration | None = None
    shape: float | None = Field(default=None, ge=0.1, le=20, allow_inf_nan=False)
    repair: TimeSpan | None = None
    effect: Literal["node", "job", "link"] | None = None


@register_model
class CheckpointCfg(Strict):
    """Checkpointing: how often, how big, how fast.

    ``interval`` is training time between checkpoints, or ``young`` / ``daly`` for
    the optimum of those formulas for this job's failure rate and write time.
    ``size`` defaults to the model's weights and optimizer state (bf16 weights and
    FP32 master weights and Adam moments: 14 bytes per parameter). The write takes
    size / ``storage_bandwidth``, and a restart reads it back at the same rate.
    ``mode: sync`` stops training while writing; ``async`` stops it only for
    ``snapshot_time`` (a copy to host memory) and writes in the background: the
    checkpoint counts once written.
    """

    interval: Literal["young", "daly"] | PositiveDuration = "daly"
    storage_bandwidth: Annotated[Bandwidth, Field(gt=0)] = 100e9
    size: Annotated[Bytes, Field(gt=0)] | None = None
    mode: Literal["sync", "async"] = "sync"
    snapshot_time: TimeSpan = 0.0


@register_model
class FailuresCfg(Strict):
    """Injections inside the simulated step(s), and the long-horizon model."""

    inject: list[Injection] = Field(default_factory=list, max_length=100_000)
    link_detect_delay: Duration = Field(default=10e-3, ge=0, le=3600)
    preset: str | None = Field(default=None, max_length=200)
    rates: dict[str, FailureClassCfg] = Field(default_factory=dict, max_length=1000)
    rate_scale: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False)
    checkpoint: CheckpointCfg = Field(default_factory=CheckpointCfg)
    detection_time: TimeSpan = 300.0
    restart_time: TimeSpan = 600.0
    migrate_time: TimeSpan = 180.0
    spares: int = Field(default=0, ge=0, le=10_000_000)
    replace_time: TimeSpan = 3600.0
    recovery: Literal["restart_all", "migrate_affected", "continue_degraded"] = "restart_all"
    degraded_step_time: PositiveDuration | None = None
    degraded_slowdown: float | None = Field(default=None, ge=1, le=1e6, allow_inf_nan=False)
    horizon: PositiveDuration | None = None
    target_tokens: float | None = Field(default=None, gt=0, le=1e18, allow_inf_nan=False)
    seeds: int = Field(default=1, ge=1, le=100_000)

    @property
    def reliability(self) -> bool:
        """True when the long-horizon model is configured (a preset or rates)."""
        return self.preset is not None or bool(self.rates)
