"""The ``failures`` section of a scenario: injections inside a step, and the
long-horizon reliability model (failure processes, checkpoints, recovery).

``inject`` lists events at fixed simulated times::

    failures:
      inject:
        - {at: 2ms, target: {lane: [3, 7]}, kind: down}        # one lane of chip 3 -> chip 7
        - {at: 0, target: {chip: 12}, kind: {straggle: 1.5}}    # chip 12 computes 1.5x slower
        - {at: 5ms, target: {link: [0, 1]}, kind: {degrade: 0.5}}

A target names exactly one component: ``link`` or ``lane`` (a pair of chip
indices, or of topology node names such as ``"sw0.1"``), ``chip``, ``instance``,
``switch`` (a node name) or ``nic`` (the EFA NIC of an instance, by instance
index). A kind is ``down``, ``up``, ``{degrade: f}`` (bandwidth times f, 0 < f <= 1)
or ``{straggle: f}`` (compute time times f, f >= 1).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from clustersim.catalog import register_model
from clustersim.catalog.schema import Duration, Strict

__all__ = ["Degrade", "FailuresCfg", "Injection", "InjectionTarget", "Straggle"]

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
class FailuresCfg(Strict):
    """Injections inside the simulated step(s), and the long-horizon model."""

    inject: list[Injection] = Field(default_factory=list, max_length=100_000)
