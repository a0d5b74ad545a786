"""Loading a scenario: YAML text -> validated ``Scenario`` -> ``Resolved`` specs.

YAML is read safely and within limits (:mod:`clustersim.scenario.yamlsafe`).

Before validation every value is checked for what pydantic cannot see inside
free-form mappings (``cluster.chip: {...}`` and the other overrides): keys that
are not strings, NaN and infinity, magnitudes beyond ``MAX_MAGNITUDE``, and
control characters that would break the one-line error messages.

``--set`` overrides are applied to the raw mapping before validation, so they are
checked exactly like keys written in the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from clustersim import catalog
from clustersim.catalog import fits, stacks
from clustersim.catalog.schema import ChipSpec, InstanceSpec, ModelSpec
from clustersim.catalog.stacks import StackFit
from clustersim.errors import MISSING, ScenarioError
from clustersim.hardware.kernel_tiling import roofline_efficiency
from clustersim.scenario.domainfill import filled
from clustersim.scenario.models import Scenario
from clustersim.scenario.op_policy import op_policy_problem
from clustersim.scenario.overlay import load_overlay
from clustersim.scenario.workload import TRACE_TRAINING_KEYS, trace_paths
from clustersim.scenario.yamlsafe import (
    _FREE_TEXT,
    MAX_KEY_CHARS,
    MAX_TEXT_CHARS,
    MAX_TOTAL_TEXT_CHARS,
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    parse_yaml,
)
from clustersim.units import MAX_MAGNITUDE, MIN_MAGNITUDE

__all__ = ["Resolved", "apply_set", "load_scenario", "parse_yaml", "resolve"]


def apply_set(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``dotted.key=value`` override in place; the value is parsed as YAML."""
    key, sep, raw = assignment.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ScenarioError("--set", assignment, "expected dotted.key=value")
    if key.count(".") >= MAX_YAML_DEPTH or len(key) > MAX_KEY_CHARS:
        raise ScenarioError("--set", key, "key too long or nested too deeply")
    value = parse_yaml(raw, f"--set {_part(key)}") if raw.strip() else ""
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        # A list's items are named by index: failures.inject.0.at
        is_list = isinstance(node, list)
        child = node[_list_index(node, parts[: i + 1])] if is_list else node.get(part)
        if isinstance(child, str) and i == 0 and part == "model":
            child = {"name": child}  # --set model.layers=16 over a catalog name
            node[part] = child
        if child is None and isinstance(node, dict):
            child = {}
            node[part] = child
        if not isinstance(child, dict | list):
            path = _path(parts[: i + 1])
            raise ScenarioError(path, child, f"cannot set {_part(key)}: {path} is not a mapping")
        node = child
    if isinstance(node, list):
        node[_list_index(node, parts)] = value
    else:
        node[parts[-1]] = value


def _list_index(items: list[Any], parts: list[str]) -> int:
    """The item of ``items`` that the last of ``parts`` names, by its index."""
    part = parts[-1]
    if not (part.isascii() and part.isdigit() and int(part) < len(items)):
        where, n = _path(parts[:-1]), len(items)
        raise ScenarioError(_path(parts), part, f"{where} is a list of {n}: an index is 0..{n - 1}")
    return int(part)


@dataclass(frozen=True)
class Resolved:
    """A validated scenario with its catalog entries resolved and overrides applied."""

    scenario: Scenario
    chip: ChipSpec
    instance: InstanceSpec
    model_spec: ModelSpec | None
    """None when the workload comes from traces (``workload``): there is no model."""
    lnc: int
    raw: dict[str, Any]
    software: StackFit = dataclasses.field(
        default_factory=lambda: StackFit(None, True, None, None, None)
    )
    """The software stack the scenario runs and the fit its chip's constants come from."""

    @property
    def model(self) -> ModelSpec:
        """The model; a ScenarioError for a trace workload, which has none."""
        if self.model_spec is None:
            raise ScenarioError(
                "workload", MISSING, "a trace workload has no model (this needs model and layout)"
            )
        return self.model_spec

    def require_training(self, command: str) -> None:
        """A ScenarioError naming ``serving`` when a training command gets a serving
        scenario (its ``training`` section is a placeholder)."""
        if self.scenario.serving is not None:
            problem = f"a serving scenario runs with `clustersim serve`, not {command}"
            raise ScenarioError("serving", MISSING, problem)

    @property
    def chips(self) -> int:
        return self.instance.chips * self.scenario.cluster.count

    @property
    def ranks_per_chip(self) -> int:
        return self.chip.cores // self.lnc

    @property
    def ranks(self) -> int:
        return self.chips * self.ranks_per_chip

    @property
    def ranks_per_node(self) -> int:
        """Ranks of one instance (a node of the scale-out network)."""
        return self.instance.chips * self.ranks_per_chip

    def as_dict(self) -> dict[str, Any]:
        """The resolved scenario: every key, with catalog entries expanded."""
        out = self.scenario.model_dump(mode="json")
        if self.model_spec is None:  # a trace workload: its training keys, no model
            for key in ("model", "parallelism", "moe"):
                out.pop(key, None)
            out["training"] = {k: out["training"][k] for k in TRACE_TRAINING_KEYS}
        else:
            out.pop("workload", None)
            out["model"] = self.model_spec.model_dump(mode="json", exclude={"sources"})
        if self.scenario.serving is None:
            out.pop("serving", None)
        else:  # a serving scenario: its training section is a placeholder
            out.pop("training", None)
        out["cluster"]["resolved"] = {
            "chips": self.chips,
            "ranks": self.ranks,
            "lnc": self.lnc,
            "instance": self.instance.model_dump(mode="json", exclude={"sources"}),
            "chip": self.chip.model_dump(mode="json", exclude={"sources"}),
        }
        return out


def load_scenario(
    source: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    seed: int | None = None,
    *,
    stack_fit: bool = True,
) -> Resolved:
    """Read a scenario file (or YAML text given as ``str`` with a newline) and resolve it.

    ``stack_fit=False`` leaves the software stack's fit out (the catalog's constants):
    what ``clustersim calibrate`` fits from."""
    if isinstance(source, Path) or "\n" not in source:
        path = Path(source)
        text = _read(path)
        label = _part(path.name)
    else:
        text, label = source, "<scenario>"
    data = parse_yaml(text, label)
    if data is None:
        raise ScenarioError(label, MISSING, "the scenario is empty")
    if not isinstance(data, dict):
        raise ScenarioError("", data, "a scenario must be a mapping of keys to values")
    if label != "<scenario>":
        _relative_to(data, Path(source).parent)
    for assignment in overrides:
        apply_set(data, assignment)
    if seed is not None:
        data["seed"] = seed
    over = data.get("catalog_overlay")
    if isinstance(over, str) and over and label != "<scenario>" and not Path(over).is_absolute():
        data["catalog_overlay"] = str(Path(source).parent / over)  # relative to the scenario
    return resolve(data, stack_fit=stack_fit)


def _relative_to(data: dict[str, Any], base: Path) -> None:
    """A relative ``cluster.fabric_file``, ``serving.arrival.file`` (or trace prefix,
    ``workload.chakra``) names a file beside the scenario file."""
    trace_paths(data, base)
    for section, parent, key in (
        ("cluster", None, "fabric_file"),
        ("serving", "arrival", "file"),
    ):
        owner = data.get(section)
        if parent is not None and isinstance(owner, dict):
            owner = owner.get(parent)
        if not isinstance(owner, dict):
            continue
        name = owner.get(key)
        if isinstance(name, str) and name and not Path(name).is_absolute() and "\0" not in name:
            owner[key] = str(base / name)


def _read(path: Path) -> str:
    """The file's text; at most ``MAX_YAML_BYTES`` are read, so ``/dev/zero`` is refused too."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise ScenarioError("", str(path), "scenario file not found") from None
    except OSError as exc:
        raise ScenarioError("", str(path), f"cannot read scenario: {exc.strerror}") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ScenarioError(_part(path.name), MISSING, f"larger than {MAX_YAML_BYTES // 2**20} MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"byte {exc.start}"
        problem = f"not UTF-8 text (invalid byte {raw[exc.start]:#04x} at {where})"
        raise ScenarioError(_part(path.name), MISSING, problem) from None


_TOP_KEYS = tuple(Scenario.model_fields)


def resolve(data: dict[str, Any], *, stack_fit: bool = True) -> Resolved:
    """Validate a raw scenario mapping and resolve its catalog references.

    The chip's calibration constants are the catalog's, under its software stack's fit
    (:mod:`clustersim.catalog.stacks`; left out with ``stack_fit=False``, and for a
    serving scenario), under a catalog overlay's, under the scenario's own
    ``cluster.chip`` keys."""
    check_values(data)  # first: it also bounds what printing a value in a message costs
    for key, value in data.items():
        if not isinstance(key, str) or key not in _TOP_KEYS:
            close = difflib.get_close_matches(_part(key), _TOP_KEYS, n=1)
            valid = ", ".join(_TOP_KEYS)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {valid}"
            raise ScenarioError(_part(key), value, f"unknown key{hint}")
    if data.get("serving") is not None and "training" in data:
        raise ScenarioError(
            "training", data["training"], "a serving scenario has no training: give one of them"
        )
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise catalog.pydantic_error(exc, "") from None

    cl = scenario.cluster
    overlay = load_overlay(scenario.catalog_overlay) if scenario.catalog_overlay else {}
    inst_over: dict[str, Any] = dict(overlay.get("instances", {}).get(cl.instance, {}))
    for field, given in (
        ("fabric", cl.neuronlink),
        ("efa", cl.efa),
        ("ultraserver", cl.ultraserver),
        ("prices_usd_per_hour", cl.prices_usd_per_hour),
    ):
        if given:
            inst_over = catalog.deep_merge(inst_over, {field: given})
    try:
        inst = catalog.instance(cl.instance, inst_over or None, "cluster")
    except ScenarioError as exc:
        # The instance's scale-up fabric is written cluster.neuronlink in a scenario.
        if exc.path == "cluster.fabric" or exc.path.startswith("cluster.fabric."):
            path = "cluster.neuronlink" + exc.path[len("cluster.fabric") :]
            raise ScenarioError(path, exc.value, exc.problem) from None
        raise
    software = stacks.stack_fit(inst.chip, scenario.software.stack)
    # A serving engine is not the training stack: its kernels are the engine's own
    # (measured GEMM and attention tables on GPUs; Transformers-NeuronX's and NxD
    # Inference's compiled programs on Neuron), and no serving runtime is fitted, so a
    # training fit's constants (which absorb a training step's framework costs) stay out.
    if not stack_fit or scenario.serving is not None:
        software = replace(software, fit=None, lent=None, constants={})
    software = _transferred(software, inst.chip)
    rules = {"tp_comm_overlap": software.tp_comm_overlap, "cp_comm_type": software.cp_comm_type}
    unset = {k: v for k, v in rules.items() if getattr(scenario.parallelism, k) is None}
    if unset:  # the stack's rules
        par = scenario.parallelism.model_copy(update=unset)
        scenario = scenario.model_copy(update={"parallelism": par})
    scenario = _compiled(scenario, software)
    if scenario.software.host_op_s is None and software.host_op_s:  # the stack's
        sw = scenario.software.model_copy(update={"host_op_s": software.host_op_s})
        scenario = scenario.model_copy(update={"software": sw})
    par = scenario.parallelism
    stack_policy = par.recompute == "selective" and par.recompute_policy is None
    if stack_policy:  # the stack's rule
        policy = "modules" if par.recompute_modules else software.recompute_policy
        par = par.model_copy(update={"recompute_policy": policy})
        scenario = scenario.model_copy(update={"parallelism": par})
    fill, us = cl.domain_fill, inst.ultraserver
    racks = us is not None and us.topology == "nvl72" and cl.fabric_file is None
    if fill is None and racks and us is not None and cl.count % us.instances:
        fill = "last"  # NVLink racks: whole ones, the last partly filled (the default)
        cl = cl.model_copy(update={"domain_fill": fill})
        scenario = scenario.model_copy(update={"cluster": cl})
    if fill is not None:
        inst = filled(inst, fill, cl.fabric_file)
    chip_over = catalog.deep_merge(overlay.get("chips", {}).get(inst.chip, {}), cl.chip or {})
    if software.constants:
        chip_over = catalog.deep_merge({"calibration": dict(software.constants)}, chip_over)
    chip = catalog.chip(inst.chip, chip_over or None, "cluster.chip")

    model: ModelSpec | None
    if scenario.model is None:  # a trace workload
        model = None
    elif isinstance(scenario.model, str):
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

    if stack_policy and model is not None:
        scenario = _policy_runs(scenario, model)
    lnc = cl.lnc if cl.lnc is not None else chip.lnc_default
    if lnc not in chip.lnc_options:
        raise ScenarioError(
            "cluster.lnc", lnc, f"{chip.name} supports lnc {', '.join(map(str, chip.lnc_options))}"
        )
    return Resolved(scenario, chip, inst, model, lnc, data, software)


def _compiled(scenario: Scenario, software: StackFit) -> Scenario:
    """``software.compile`` as the stack's rule where the scenario sets none; ``false`` is
    refused under a stack with no eager path (only its fused kernels)."""
    given = scenario.software.compile
    if software.compile is None and given is False:
        name = software.stack or "a chip with no software stack"
        problem = f"{name} runs fused kernels only (no eager path); leave it unset or true"
        raise ScenarioError("software.compile", given, problem)
    if software.compile is None or given is not None:
        return scenario
    sw = scenario.software.model_copy(update={"compile": software.compile})
    return scenario.model_copy(update={"software": sw})


def _policy_runs(scenario: Scenario, model: ModelSpec) -> Scenario:
    """``scenario`` with Megatron's module rule where the stack's per-op policy (torchtitan's)
    is not modelled for it (MoE, MLA, unfused attention, CP, FP8): a run left at the stack's
    default is not refused for it, as one that names ``recompute_policy: op`` is."""
    par = scenario.parallelism
    precision = scenario.training.precision if scenario.training is not None else "bf16"
    if par.recompute_policy != "op" or op_policy_problem(model, par, precision) is None:
        return scenario
    par = par.model_copy(update={"recompute_policy": "modules"})
    return scenario.model_copy(update={"parallelism": par})


def _transferred(software: StackFit, chip: str) -> StackFit:
    """``software`` with its efficiencies carried to ``chip`` by its family's ``transfer``
    (``catalog.fits.Transfer``) when the fit's rows ran on another chip of the family."""
    cal = fits.calibration()
    family = fits.family_of(chip, cal)
    transfer = None if family is None else cal.families[family].transfer
    if transfer is None or chip == transfer.fitted_on or not software.constants:
        return software
    ratio = roofline_efficiency(catalog.chip(chip), *transfer.shape) / roofline_efficiency(
        catalog.chip(transfer.fitted_on), *transfer.shape
    )
    constants = {
        k: v * ratio if k.endswith(fits.PRIOR_SUFFIX) and k != "hbm_efficiency" else v
        for k, v in software.constants.items()
    }
    how = f"from {transfer.fitted_on} by the engine model, x{ratio:.3f}"
    return replace(software, constants=constants, scaled=how)


# -- checks on raw values ---------------------------------------------------------------


def check_values(data: Any, prefix: str = "") -> None:
    """Refuse what typed validation cannot see inside free-form mappings.

    Keys must be strings; numbers must be finite and within ``MAX_MAGNITUDE`` (and
    not closer to zero than ``MIN_MAGNITUDE``, which overflows once divided by);
    text must not hold control characters or line breaks, except in
    ``description``, so that every error message stays on one line.
    """
    stack: list[tuple[tuple[Any, ...], Any]] = [((prefix,) if prefix else (), data)]
    text = 0  # characters of keys and values, every alias counted again
    while stack:
        loc, value = stack.pop()
        if isinstance(value, str) and not (loc and loc[0] in _FREE_TEXT):
            text += len(value)
        elif isinstance(value, dict):
            text += sum(len(k) for k in value if isinstance(k, str))
        if text > MAX_TOTAL_TEXT_CHARS:
            raise ScenarioError(
                _path(loc),
                MISSING,
                f"the scenario's text adds up to more than {MAX_TOTAL_TEXT_CHARS:,} characters "
                "once aliases are expanded",
            )
        if len(loc) > MAX_YAML_DEPTH:
            raise ScenarioError(
                _path(loc[:MAX_YAML_DEPTH]), MISSING, f"nested deeper than {MAX_YAML_DEPTH} levels"
            )
        if isinstance(value, dict):
            items: list[tuple[tuple[Any, ...], Any]] = []
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ScenarioError(_path([*loc, key]), key, "keys must be strings")
                if len(key) > MAX_KEY_CHARS or _bad_chars(key):
                    why = "too long" if len(key) > MAX_KEY_CHARS else "control characters"
                    raise ScenarioError(_path(loc), key, f"invalid key ({why})")
                items.append(((*loc, key), item))
            stack.extend(reversed(items))  # so that the first bad value is reported
        elif isinstance(value, list | tuple):
            stack.extend(reversed([((*loc, i), item) for i, item in enumerate(value)]))
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int | float):
            _check_number(loc, value)
        elif isinstance(value, str) and not (loc and loc[0] in _FREE_TEXT):
            number = _as_number(value)
            if number is not None:  # "1e308" is a string in YAML 1.1, a float to pydantic
                _check_number(loc, number, value)
            if len(value) > MAX_TEXT_CHARS:
                raise ScenarioError(_path(loc), value, f"longer than {MAX_TEXT_CHARS} characters")
            if _bad_chars(value):
                raise ScenarioError(
                    _path(loc), value, "control characters and line breaks are not allowed"
                )


def _check_number(loc: tuple[Any, ...], number: float, shown: object = MISSING) -> None:
    shown = number if shown is MISSING else shown
    if isinstance(number, float) and not math.isfinite(number):
        raise ScenarioError(_path(loc), shown, "must be a finite number")
    magnitude = abs(number)
    if magnitude > MAX_MAGNITUDE:
        raise ScenarioError(_path(loc), shown, f"out of range: at most {MAX_MAGNITUDE:g}")
    if 0 < magnitude < MIN_MAGNITUDE:
        raise ScenarioError(
            _path(loc), shown, f"too close to zero: use 0 or at least {MIN_MAGNITUDE:g}"
        )


def _as_number(text: str) -> float | None:
    """The value of ``text`` if it is a decimal number (not "nan" or "inf": pydantic
    refuses those itself), else None."""
    if len(text) > 64 or not _DECIMAL.fullmatch(text.strip()):
        return None
    return float(text)


_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _bad_chars(text: str) -> bool:
    """True if ``text`` holds a control character (tab aside) or a line separator."""
    return any(
        unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs") and c != "\t"
        for c in text
        if not c.isprintable()
    )


def _part(key: Any) -> str:
    """A key as printed in a dotted path: itself, or its repr if that could mislead
    (control or invisible characters, surrounding blanks, the empty string)."""
    text = key if isinstance(key, str) else repr(key)
    if len(text) > _MAX_PART_CHARS:
        return repr(text[: _MAX_PART_CHARS - 3] + "...")
    plain = text.isprintable() and text == text.strip() and text != ""
    return text if plain else repr(text)


_MAX_PART_CHARS = 60


def _path(loc: list[Any] | tuple[Any, ...]) -> str:
    return ".".join(_part(p) for p in loc)
