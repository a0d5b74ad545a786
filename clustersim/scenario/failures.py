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
    """A link, as a pair of chip indices or topology node names (`"switch0"`)."""
    lane: tuple[NodeRef, NodeRef] | None = None
    """One lane of a link, as a pair of chip indices or topology node names."""
    chip: int | None = Field(default=None, ge=0)
    """A chip, by index: `down` fails the step, `straggle` slows its compute."""
    instance: int | None = Field(default=None, ge=0)
    """An instance, by index: `down` fails the step."""
    switch: str | None = None
    """A switch, by topology node name: `down` takes its links down."""
    nic: int | None = Field(default=None, ge=0)
    """An instance's EFA NIC, by instance index: `down` takes its links down."""

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
    """Bandwidth factor of the link, 0 < f <= 1 (replaces an earlier degrade)."""


@register_model
class Straggle(Strict):
    straggle: float = Field(ge=1, le=1e6, allow_inf_nan=False)
    """Compute slowdown of the chip, f >= 1 (every op of its ranks takes f times as long)."""


@register_model
class Injection(Strict):
    at: Duration = Field(default=0.0, ge=0, le=1e9)
    """Simulated time of the event (s)."""
    target: InjectionTarget
    """The one component the event strikes."""
    kind: Literal["down", "up"] | Degrade | Straggle = "down"
    """`down`, `up`, `{degrade: f}` or `{straggle: f}`."""


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
    """The class's label in reports; default: its name."""
    per: Component | None = None
    """What the rate is counted per: `chip`, `instance`, `nic`, `switch`, `link` or `job`."""
    mtbf: PositiveDuration | None = None
    """Mean time between failures of one component (s; such as `4000d`)."""
    failures: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    """Failures observed on `components` components over `over`, in place of `mtbf`."""
    components: int | None = Field(default=None, ge=1, le=10**9)
    """Components the `failures` were observed on."""
    over: PositiveDuration | None = None
    """The time the `failures` were observed over (s); MTBF = components x over / failures."""
    shape: float | None = Field(default=None, ge=0.1, le=20, allow_inf_nan=False)
    """Weibull shape: 1 exponential (default), below 1 infant mortality, above 1 wear-out."""
    repair: TimeSpan | None = None
    """How long a failed component stays out (s; default 0): a node then returns to the spare
    pool, a link to service."""
    effect: Literal["node", "job", "link"] | None = None
    """`node` takes the component's instance out, `job` crashes the job only, `link` cuts a link."""


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
    """Training time between checkpoints (s), or `young` / `daly`: that formula's optimum for
    this job's failure rate and write time."""
    storage_bandwidth: Annotated[Bandwidth, Field(gt=0)] = 100e9
    """Bandwidth of the checkpoint write, and of the read-back at restart (B/s; default 100
    GB/s)."""
    size: Annotated[Bytes, Field(gt=0)] | None = None
    """Bytes of one checkpoint; default: weights and optimizer state, 14 bytes per parameter."""
    mode: Literal["sync", "async"] = "sync"
    """`sync` stops training while writing; `async` stops it only for `snapshot_time` and writes
    in the background."""
    snapshot_time: TimeSpan = 0.0
    """With `mode: async`, how long training stops to copy the state to host memory (s)."""


@register_model
class FailuresCfg(Strict):
    """Injections inside the simulated step(s), and the long-horizon model."""

    inject: list[Injection] = Field(default_factory=list, max_length=100_000)
    """Events at fixed simulated times inside the step(s)."""
    link_detect_delay: Duration = Field(default=10e-3, ge=0, le=3600)
    """How long routing takes to notice a failed link (s): flows on it stall until then."""
    preset: str | None = Field(default=None, max_length=200)
    """Published failure rates: `llama3-54d` (Llama 3 405B pre-training), `rsc1` or `rsc2`
    (Meta's research clusters); turns the long-horizon model on."""
    rates: dict[str, FailureClassCfg] = Field(default_factory=dict, max_length=1000)
    """Failure classes by name, added to the preset's or overriding their fields; turns the
    long-horizon model on."""
    rate_scale: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False)
    """Factor on every class's failure rate."""
    checkpoint: CheckpointCfg = Field(default_factory=CheckpointCfg)
    """How often, how big and how fast checkpoints are."""
    detection_time: TimeSpan = 300.0
    """From a failure to its detection (s; default 5 min)."""
    restart_time: TimeSpan = 600.0
    """To restart the whole job once its nodes are in place, before the checkpoint is read back
    (s; default 10 min)."""
    migrate_time: TimeSpan = 180.0
    """With `recovery: migrate_affected`, to move a failed node's ranks to a spare, in place of
    `restart_time` (s; default 3 min)."""
    spares: int = Field(default=0, ge=0, le=10_000_000)
    """Hot-spare instances, taken at once when a node fails (and paid for)."""
    replace_time: TimeSpan = 3600.0
    """To bring in a node when no spare is free (s; default 1 h)."""
    recovery: Literal["restart_all", "migrate_affected", "continue_degraded"] = "restart_all"
    """`restart_all`, `migrate_affected` (a failed node's ranks move to a spare) or
    `continue_degraded` (a cut link is routed around and the job goes on)."""
    degraded_step_time: PositiveDuration | None = None
    """Step time while a link is cut under `continue_degraded` (s); absent with
    `degraded_slowdown`: simulated with the link cut."""
    degraded_slowdown: float | None = Field(default=None, ge=1, le=1e6, allow_inf_nan=False)
    """The degraded step time as a multiple of the healthy one, in place of `degraded_step_time`."""
    horizon: PositiveDuration | None = None
    """Wall time simulated (s; such as `54d`); default: 30 days, or long enough for
    `target_tokens` when only that is given."""
    target_tokens: float | None = Field(default=None, gt=0, le=1e18, allow_inf_nan=False)
    """Tokens to train: a replication stops once they are trained, and the summary gives the time
    it took."""
    seeds: int = Field(default=1, ge=1, le=100_000)
    """Monte Carlo replications of the long-horizon model, seeded from `seed`."""

    @property
    def reliability(self) -> bool:
        """True when the long-horizon model is configured (a preset or rates)."""
        return self.preset is not None or bool(self.rates)
