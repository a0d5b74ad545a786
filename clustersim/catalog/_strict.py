"""The base of every catalog and scenario model, and the JSON Schema that documents it."""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

__all__ = ["DocumentedSchema", "Strict", "attribute_docstrings"]


class Strict(BaseModel):
    """Base of every catalog and scenario model: unknown keys are errors. A field's
    docstring is its description in the JSON Schema (the scenario-key reference),
    read when the schema is made (:class:`DocumentedSchema`), not when the class is:
    every command that never prints the schema is spared parsing the models' source."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


@cache
def _own_docstrings(cls: type) -> dict[str, str]:
    """The docstrings under the annotated attributes of ``cls``'s own body."""
    try:
        source = textwrap.dedent("".join(inspect.getsourcelines(cls)[0]))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    for before, after in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(before, ast.AnnAssign)
            and isinstance(before.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[before.target.id] = inspect.cleandoc(after.value.value)
    return docs


def attribute_docstrings(cls: type[BaseModel]) -> dict[str, str]:
    """Each field's docstring, a subclass's over its bases' (pydantic's
    ``use_attribute_docstrings``, read on demand)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if isinstance(klass, type) and issubclass(klass, BaseModel) and klass is not BaseModel:
            docs.update(_own_docstrings(klass))
    return docs


class DocumentedSchema(GenerateJsonSchema):
    """The JSON Schema with each field's docstring as its ``description`` (a description
    the field states itself wins)."""

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        out = super().model_schema(schema)
        cls = schema["cls"]
        props: dict[str, Any] = out.get("properties", {})
        for name, doc in attribute_docstrings(cls).items():
            field = cls.model_fields.get(name)
            if field is None:
                continue
            prop = props.get(field.alias or name)
            if isinstance(prop, dict) and "description" not in prop:
                prop["description"] = doc
        return out
