"""Models and configurations shared by the workload tests (explicit numbers, no catalog)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clustersim.catalog.schema import ModelSpec
from clustersim.cli import main
from clustersim.scenario.models import ParallelismCfg, TrainingCfg
from clustersim.workload import Layout, make_layout


def llama3_8b(**over: Any) -> ModelSpec:
    spec: dict[str, Any] = {
        "name": "llama3-8b",
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "kv_heads": 8,
        "ffn_hidden": 14336,
        "vocab": 128256,
    }
    return ModelSpec(**{**spec, **over})


def llama3_70b(**over: Any) -> ModelSpec:
    spec: dict[str, Any] = {
        "name": "llama3-70b",
        "layers": 80,
        "hidden": 8192,
        "heads": 64,
        "kv_heads": 8,
        "ffn_hidden": 28672,
        "vocab": 128256,
    }
    return ModelSpec(**{**spec, **over})


def tiny(**over: Any) -> ModelSpec:
    """A small GQA/SwiGLU model whose vocabulary needs no padding up to tp = 4."""
    spec: dict[str, Any] = {
        "name": "tiny",
        "layers": 8,
        "hidden": 512,
        "heads": 8,
        "kv_heads": 4,
        "ffn_hidden": 1536,
        "vocab": 4096,
        "max_seq_len": 1024,
    }
    return ModelSpec(**{**spec, **over})


def setup(
    ranks: int,
    ranks_per_chip: int = 4,
    *,
    seq_len: int = 256,
    global_batch_size: int = 32,
    **par: Any,
) -> tuple[ParallelismCfg, TrainingCfg, Layout]:
    cfg = ParallelismCfg(**par)
    train = TrainingCfg(seq_len=seq_len, global_batch_size=global_batch_size)
    return cfg, train, make_layout(cfg, ranks, ranks_per_chip)


def check_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: str, sets: list[str], key: str
) -> None:
    """``clustersim check`` of ``scenario`` with ``--set`` of each of ``sets`` exits 2 with
    one line of error that names ``key``."""
    path = tmp_path / "s.yaml"
    path.write_text(scenario)
    args = ["check", str(path)]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err


def tiny_moe_scenario(
    name: str,
    parallelism: str,
    *,
    layers: int = 4,
    count: int = 1,
    moe: str = "experts: 16, top_k: 2, expert_ffn_hidden: 1024",
    global_batch_size: int = 32,
    balanced: bool = True,
) -> str:
    """A scenario of a small MoE model (16 experts, hidden 1024) on p5.48xlarge, for
    ``load_scenario``: ``parallelism`` and ``moe`` are the insides of their flow maps."""
    routing = "moe: {balanced: true}\n" if balanced else ""
    return f"""
name: {name}
seed: 1
cluster: {{instance: p5.48xlarge, count: {count}}}
model:
  name: tiny-moe
  layers: {layers}
  hidden: 1024
  heads: 8
  kv_heads: 8
  ffn_hidden: 2048
  vocab: 8192
  moe: {{{moe}}}
parallelism: {{{parallelism}}}
training: {{seq_len: 2048, global_batch_size: {global_batch_size}}}
{routing}output: {{trace: false, html: false}}
"""
