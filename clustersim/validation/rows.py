"""The reference set (``references.yaml``) as typed rows, and one result row.

Each reference becomes a :class:`Row` when checked: the published figure, the
predicted figure, the relative error and the tolerance. Validation fails when
any row's ``|error|`` exceeds its tolerance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from clustersim import catalog
from clustersim.catalog.schema import Bytes, Duration, Strict
from clustersim.catalog.shipped import load_yaml
from clustersim.errors import CatalogError

__all__ = [
    "CollectiveRef",
    "MeasuredCollectiveRef",
    "MeasuredPoint",
    "Published",
    "References",
    "ReliabilityRef",
    "Row",
    "ServingRef",
    "TrainingRef",
    "references",
]

Tolerance = float


class Published(Strict):
    """A published end-to-end figure and how to turn it into a step time.

    ``basis``: ``megatron_tflops`` (the Megatron-LM paper's FLOP formula over
    ``tflops_per_gpu`` x GPUs), ``sequences_per_s`` (global batch over it),
    ``tokens_per_s_per_device`` (tokens per step over it x devices), or ``mfu``
    (the simulator's model FLOPs over ``mfu`` x peak x chips).
    """

    basis: Literal["megatron_tflops", "sequences_per_s", "tokens_per_s_per_device", "mfu"]
    tflops_per_gpu: float | None = Field(default=None, gt=0)
    sequences_per_s: float | None = Field(default=None, gt=0)
    tokens_per_s_per_device: float | None = Field(default=None, gt=0)
    mfu: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _basis_given(self) -> Published:
        if self.basis != "megatron_tflops" and getattr(self, self.basis) is None:
            raise ValueError(f"basis {self.basis} needs the figure {self.basis}")
        if self.basis == "megatron_tflops" and self.tflops_per_gpu is None:
            raise ValueError("basis megatron_tflops needs tflops_per_gpu")
        return self


Role = Literal["calibration", "holdout"]


class TrainingRef(Strict):
    """One published end-to-end run.

    ``role``: ``calibration`` rows may be fitted on (``clustersim calibrate``),
    ``holdout`` rows never are. The scenario names the software that ran it
    (``software.stack``), the unit calibration is fitted per, as any scenario does.
    ``status: known_gap`` reports the row's error without failing validation; it
    names the mechanism the model lacks in ``gap``.
    """

    name: str
    id: str = ""  # the row's id in the reference tables (T1, G3, P2, ...)
    scenario: str
    source: str
    published: Published
    tolerance: Tolerance = Field(default=0.10, gt=0, le=1)
    role: Role
    status: Literal["checked", "known_gap"] = "checked"
    gap: str = ""
    slow: bool = False
    cost_s: float = Field(default=0.0, ge=0)
    """About how many seconds of one core the row takes: the order of ``--jobs``."""
    note: str = ""

    @model_validator(mode="after")
    def _gap_named(self) -> TrainingRef:
        if self.status == "known_gap" and not self.gap:
            raise ValueError("status known_gap needs `gap`: the mechanism the model lacks")
        return self


class CollectiveRef(Strict):
    name: str
    instance: str
    count: int = Field(default=1, ge=1)
    ranks: int | None = Field(default=None, ge=2)
    op: str
    algorithm: str
    size: Bytes
    formula: Literal["ring", "ring_duplex", "halving_doubling", "pairwise", "torus"]
    source: str
    tolerance: Tolerance = Field(default=0.01, gt=0, le=1)


class MeasuredPoint(Strict):
    """One size of a measured collective: its bus bandwidth or its time."""

    size: Bytes = Field(gt=0)
    busbw_GBps: float | None = Field(default=None, gt=0)
    time_s: Duration | None = Field(default=None, gt=0)
    tolerance: float | None = Field(default=None, gt=0, le=1)
    note: str = ""
    """Why this size has a tolerance of its own (a known gap of the model)."""

    @model_validator(mode="after")
    def _one_figure(self) -> MeasuredPoint:
        if (self.busbw_GBps is None) == (self.time_s is None):
            raise ValueError("give exactly one of busbw_GBps and time_s")
        return self


class MeasuredCollectiveRef(Strict):
    """A collective measured at several sizes on ``count`` x ``instance``."""

    name: str
    instance: str
    count: int = Field(default=1, ge=1)
    ranks: int | None = Field(default=None, ge=2)
    lnc: int | None = Field(default=None, ge=1)
    op: str
    algorithm: str = "auto"
    points: tuple[MeasuredPoint, ...] = Field(min_length=1)
    role: Literal["calibration", "hold-out"]
    source: str
    tolerance: float = Field(default=0.15, gt=0, le=1)
    note: str = ""


class ReliabilityRef(Strict):
    """A checkpoint-interval or long-horizon check (see ``validation.reliability``)."""

    name: str
    check: Literal["daly", "young", "ettr", "goodput"]
    write_s: Duration
    mtbf_s: Duration
    published_s: Duration | None = None
    downtime_s: Duration = 0.0
    horizon_mtbfs: float = Field(default=2000.0, gt=0, le=1e6)
    seeds: int = Field(default=4, ge=1, le=64)
    source: str
    tolerance: Tolerance = Field(default=0.02, gt=0, le=1)


class ServingRef(Strict):
    """A published serving measurement: the row ``id`` of
    :data:`clustersim.serve.references.ROWS` (its setup and published p50 TTFT and
    TPOT) or of its ``THROUGHPUT_ROWS`` (output tokens per second at maximum load),
    checked on each metric against its own tolerance. A metric named in
    ``gaps`` is a known gap (the text names the mechanism the model lacks)."""

    name: str
    id: str
    role: Literal["calibration", "holdout"]
    source: str
    tolerance_ttft: float = Field(default=0.25, gt=0, le=1)
    tolerance_tpot: float = Field(default=0.15, gt=0, le=1)
    tolerance_throughput: float = Field(default=0.15, gt=0, le=1)
    """A throughput row's (:data:`clustersim.serve.references.THROUGHPUT_ROWS`): output
    tokens per second at maximum load, which TPOT's batch-wide decode sets."""
    gaps: dict[Literal["ttft", "tpot", "throughput"], str] = Field(default_factory=dict)
    cost_s: float = Field(default=0.0, ge=0)
    """Seconds the row takes to simulate (a static hint: the longest start first)."""


class References(Strict):
    training: tuple[TrainingRef, ...]
    collectives: tuple[CollectiveRef, ...]
    measured_collectives: tuple[MeasuredCollectiveRef, ...] = ()
    reliability: tuple[ReliabilityRef, ...] = ()
    serving: tuple[ServingRef, ...] = ()

    def names(self) -> list[str]:
        return (
            [r.name for r in self.training]
            + [r.name for r in self.collectives]
            + [r.name for r in self.measured_collectives]
            + [r.name for r in self.reliability]
            + [r.name for r in self.serving]
        )


@cache
def references() -> References:
    """The shipped reference set."""
    text = resources.files("clustersim.validation").joinpath("references.yaml").read_text("utf-8")
    try:
        return References.model_validate(load_yaml(text))
    except ValidationError as exc:
        err = catalog.pydantic_error(exc, "references")
        raise CatalogError(err.path, err.value, err.problem) from None


@dataclass
class Row:
    """One checked reference.

    ``published`` and ``predicted`` are in ``unit`` (seconds of a training step, or
    of one collective). ``error`` is predicted / published - 1. For training rows
    ``mfu_published`` and ``mfu_predicted`` sit beside (the simulator's PaLM MFU;
    the published one derived from the published step time).
    """

    name: str
    kind: Literal["training", "collective", "reliability", "serving"]
    metric: str
    unit: str
    published: float
    predicted: float
    tolerance: float
    source: str
    role: str = "analytic"
    status: str = "checked"
    gap: str = ""
    mfu_published: float | None = None
    mfu_predicted: float | None = None
    bubble_s: float | None = None
    exposed_comm_s: float | None = None
    note: str = ""
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1.0

    @property
    def within(self) -> bool:
        """Whether the error is inside the tolerance."""
        return abs(self.error) <= self.tolerance

    @property
    def passed(self) -> bool:
        """Within tolerance, or a known gap (reported, never failing)."""
        return self.status == "known_gap" or self.within

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["error"] = self.error
        out["passed"] = self.passed
        out["within_tolerance"] = self.within
        return out
