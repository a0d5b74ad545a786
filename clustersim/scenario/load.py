"""Loading a scenario: YAML text -> validated ``Scenario`` -> ``Resolved`` specs.

YAML is read with a safe loader that also rejects duplicate keys. ``--set``
overrides are applied to the raw mapping before validation, so they are
checked exactly like keys written in the file.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from clustersim import catalog
from clustersim.catalog.schema import ChipSpec, InstanceSpec, ModelSpec
from clustersim.errors import MISSING, ScenarioError
from clustersim.scenario.models import Scenario

__all__ = ["Resolved", "apply_set", "load_scenario", "parse_yaml", "resolve"]

MAX_YAML_BYTES = 4 * 2**20


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, list | dict):
            raise yaml.constructor.ConstructorError(
                None, None, "mapping keys must be scalars", key_node.start_mark
            )
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def parse_yaml(text: str, source: str = "<scenario>") -> Any:
    """Parse YAML safely; syntax errors become a one-line ``ScenarioError``."""
    if len(text) > MAX_YAML_BYTES:
        raise ScenarioError(source, MISSING, f"larger than {MAX_YAML_BYTES // 2**20} MiB")
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = (exc.problem or exc.context or "invalid YAML").strip()
        raise ScenarioError(source, MISSING, f"YAML error at {where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(source, MISSING, f"YAML error: {exc}") from None
    except RecursionError:
        raise ScenarioError(source, MISSING, "YAML nested too deeply") from None


def apply_set(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``dotted.key=value`` override in place; the value is parsed as YAML."""
    key, sep, raw = assignment.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ScenarioError("--set", assignment, "expected dotted.key=value")
    value = parse_yaml(raw, f"--set {key}") if raw.strip() else ""
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if isinstance(child, str) and i == 0 and part == "model":
            child = {"name": child}  # --set model.layers=16 over a catalog name
            node[part] = child
        if child is None:
            child = {}
            node[part] = child
        if not isinstance(child, dict):
            path = ".".join(parts[: i + 1])
            raise ScenarioError(path, child, f"cannot set {key}: {path} is not a mapping")
        node = child
    node[parts[-1]] = value


@dataclass(frozen=True)
class Resolved:
    """A validated scenario with its catalog entries resolved and overrides applied."""

    scenario: Scenario
    chip: ChipSpec
    instance: InstanceSpec
    model: ModelSpec
    lnc: int
    raw: dict[str, Any]

    @property
    def chips(self) -> int:
        return self.instance.chips * self.scenario.cluster.count

    @property
    def ranks_per_chip(self) -> int:
        return self.chip.cores // self.lnc

    @property
    def ranks(self) -> int:
        return self.chips * self.ranks_per_chip

    def as_dict(self) -> dict[str, Any]:
        """The resolved scenario: every key, with catalog entries expanded."""
        out = self.scenario.model_dump(mode="json")
        out["model"] = self.model.model_dump(mode="json", exclude={"sources"})
        out["cluster"]["resolved"] = {
            "chips": self.chips,
            "ranks": self.ranks,
            "lnc": self.lnc,
            "instance": self.instance.model_dump(mode="json", exclude={"sources"}),
            "chip": self.chip.model_dump(mode="json", exclude={"sources"}),
        }
        return out


def load_scenario(
    source: str | Path, overrides: list[str] | tuple[str, ...] = (), seed: int | None = None
) -> Resolved:
    """Read a scenario file (or YAML text given as ``str`` with a newline) and resolve it."""
    if isinstance(source, Path) or "\n" not in source:
        path = Path(source)
        try:
            text = path.read_text("utf-8")
        except FileNotFoundError:
            raise ScenarioError("", str(path), "scenario file not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ScenarioError("", str(path), f"cannot read scenario: {exc}") from None
        label = path.name
    else:
        text, label = source, "<scenario>"
    data = parse_yaml(text, label)
    if data is None:
        raise ScenarioError(label, MISSING, "the scenario is empty")
    if not isinstance(data, dict):
        raise ScenarioError("", data, "a scenario must be a mapping of keys to values")
    for assignment in overrides:
        apply_set(data, assignment)
    if seed is not None:
        data["seed"] = seed
    return resolve(data)


_TOP_KEYS = tuple(Scenario.model_fields)


def resolve(data: dict[str, Any]) -> Resolved:
    """Validate a raw scenario mapping and resolve its catalog references."""
    for key, value in data.items():
        if not isinstance(key, str) or key not in _TOP_KEYS:
            close = difflib.get_close_matches(str(key), _TOP_KEYS, n=1)
            valid = ", ".join(_TOP_KEYS)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {valid}"
            raise ScenarioError(str(key), value, f"unknown key{hint}")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise catalog.pydantic_error(exc, "") from None

    cl = scenario.cluster
    inst_over: dict[str, Any] = {}
    if cl.neuronlink:
        inst_over["fabric"] = cl.neuronlink
    if cl.efa:
        inst_over["efa"] = cl.efa
    if cl.ultraserver:
        inst_over["ultraserver"] = cl.ultraserver
    if cl.prices_usd_per_hour:
        inst_over["prices_usd_per_hour"] = cl.prices_usd_per_hour
    inst = catalog.instance(cl.instance, inst_over or None, "cluster")
    chip = catalog.chip(inst.chip, cl.chip or None, "cluster.chip")

    if isinstance(scenario.model, str):
        model = catalog.model(scenario.model, None, "model")
    else:
        spec = dict(scenario.model)
        base = spec.pop("name", None)
        if base is not None and isinstance(base, str) and base in catalog.entries("models"):
            model = catalog.model(base, spec, "model")
        else:
            try:
                model = ModelSpec.model_validate({"name": base or "custom", **spec})
            except ValidationError as exc:
                raise catalog.pydantic_error(exc, "model") from None

    lnc = cl.lnc if cl.lnc is not None else chip.lnc_default
    if lnc not in chip.lnc_options:
        raise ScenarioError(
            "cluster.lnc", lnc, f"{chip.name} supports lnc {', '.join(map(str, chip.lnc_options))}"
        )
    return Resolved(scenario, chip, inst, model, lnc, data)
