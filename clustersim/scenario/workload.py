"""The ``workload`` section of a scenario: a workload read from execution traces
instead of built from a model and a layout.

``workload: {chakra: PREFIX}`` (or the mapping form below) runs Chakra execution
traces, one file per rank, ``PREFIX.{rank}.et``, in place of ``model``,
``parallelism`` and ``moe``; of ``training`` only ``steps`` (times the traces run,
each ended by a barrier of every rank) and ``precision`` (the tensor peak that
``compute: model`` times ``num_ops`` at) apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from clustersim.catalog import register_model
from clustersim.catalog.schema import Strict

__all__ = ["TRACE_TRAINING_KEYS", "ChakraCfg", "WorkloadCfg", "trace_paths", "trace_scenario"]

TRACE_TRAINING_KEYS = ("steps", "precision")
"""The ``training`` keys a trace workload reads."""
_MODEL_KEYS = ("model", "parallelism", "moe")


@register_model
class ChakraCfg(Strict):
    """Chakra execution traces (``et_def.proto``), one file per rank.

    - ``prefix``: rank r's trace is ``PREFIX.r.et`` (or ``PREFIX.r.et.gz``); relative
      to the scenario file. The cluster's ranks must match the files one to one.
    - ``replicate``: run ``PREFIX.0.et`` on every rank (SPMD), the others unread.
    - ``compute``: ``replay`` times a compute node by its ``duration_micros`` times
      ``scale``; ``model`` by ``num_ops`` and ``tensor_size`` on the chip's roofline
      (a node with neither keeps its duration).
    - ``comm_groups``: ASTRA-sim's ``comm_group.json`` (``{"1": [0, 1, 2, 3], ...}``);
      absent: ``comm_group.json`` beside the traces if there is one. ``pg_name`` ``""``
      or ``"0"`` is every rank unless a group says otherwise; groups may also come
      from a METADATA node.
    - ``drop_dangling_ctrl_deps``: drop ``ctrl_deps`` on nodes the file does not
      hold (PyTorch traces have them) instead of refusing the trace.
    """

    prefix: str = Field(min_length=1, max_length=4096)
    """Rank r's trace is `PREFIX.r.et` (or `PREFIX.r.et.gz`); relative to the scenario file."""
    replicate: bool = False
    """Run `PREFIX.0.et` on every rank (SPMD); the other files are not read."""
    compute: Literal["replay", "model"] = "replay"
    """`replay` times compute nodes by their recorded `duration_micros`; `model` by `num_ops` and
    `tensor_size` on the chip's roofline."""
    scale: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False)
    """Factor on the recorded compute durations, with `compute: replay`."""
    comm_groups: str | None = Field(default=None, min_length=1, max_length=4096)
    """ASTRA-sim's `comm_group.json` (the ranks of each process group); absent: `comm_group.json`
    beside the traces, if there is one."""
    drop_dangling_ctrl_deps: bool = False
    """Drop `ctrl_deps` on nodes the file does not hold (PyTorch traces have them) instead of
    refusing the trace."""


def _prefix_only(value: Any) -> Any:
    return {"prefix": value} if isinstance(value, str) else value


@register_model
class WorkloadCfg(Strict):
    """A workload from traces: ``chakra: PREFIX`` or ``chakra: {prefix: ..., ...}``."""

    chakra: Annotated[ChakraCfg, BeforeValidator(_prefix_only)]
    """Chakra execution traces, one file per rank: a prefix, or a mapping."""


def trace_scenario(data: Any) -> Any:
    """Before validation: a scenario with ``workload`` has no model, layout or MoE
    section, and its ``training`` holds only ``TRACE_TRAINING_KEYS``. The model-only
    training keys are given placeholder values of 1 there (never read: a trace
    workload never builds a model), so that the section validates as it does elsewhere.
    """
    if not isinstance(data, dict) or data.get("workload") is None:
        return data
    for key in _MODEL_KEYS:
        if key in data:
            raise ValueError(f"{key} and workload exclude each other: a trace is the workload")
    training = data.get("training", {})
    if not isinstance(training, dict):
        return data
    for key in training:
        if key not in TRACE_TRAINING_KEYS:
            keys = ", ".join(TRACE_TRAINING_KEYS)
            raise ValueError(f"training.{key} does not apply to a trace workload (only {keys})")
    return {**data, "training": {**training, "seq_len": 1, "global_batch_size": 1}}


def trace_paths(data: dict[str, Any], base: Path) -> None:
    """Make ``workload.chakra``'s relative ``prefix`` and ``comm_groups`` relative to
    ``base`` (the scenario file's folder), in place."""
    workload = data.get("workload")
    if not isinstance(workload, dict):
        return
    chakra = workload.get("chakra")
    if isinstance(chakra, str):
        chakra = workload["chakra"] = {"prefix": chakra}
    if not isinstance(chakra, dict):
        return
    for key in ("prefix", "comm_groups"):
        name = chakra.get(key)
        if isinstance(name, str) and name and not Path(name).is_absolute() and "\0" not in name:
            chakra[key] = str(base / name)
