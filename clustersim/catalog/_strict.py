"""The base of every catalog and scenario model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Strict"]


class Strict(BaseModel):
    """Base of every catalog and scenario model: unknown keys are errors. A field's
    docstring is its description in the JSON Schema (the scenario-key reference)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True
    )
