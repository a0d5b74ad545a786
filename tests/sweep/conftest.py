"""Small studies for the sweep tests: a base scenario whose points simulate in a
fraction of a second (8 ranks on one p5.48xlarge, a two-layer model)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

MINI = """\
name: mini
seed: 0
cluster: {instance: p5.48xlarge, count: 1}
model: {name: mini, layers: 2, hidden: 256, heads: 8, kv_heads: 2, ffn_hidden: 1024, vocab: 1024}
parallelism: {tp: 2, pp: 1, zero: 1}
training: {seq_len: 256, global_batch_size: 8, steps: 1}
"""

GRID_STUDY = """\
name: mini-grid
base: mini.yaml
axes:
  - grid:
      parallelism.tp: [1, 2, 4]
      parallelism.pp: [1, 2]
"""

VOLATILE = ("wall_s", "events_per_s", "point_wall_s")
"""Columns that measure the machine, not the simulated cluster."""


@pytest.fixture
def study_dir(tmp_path: Path) -> Path:
    (tmp_path / "mini.yaml").write_text(MINI)
    return tmp_path


@pytest.fixture
def write_study(study_dir: Path) -> Callable[[str, str], Path]:
    def write(text: str, name: str = "study.yaml") -> Path:
        path = study_dir / name
        path.write_text(text)
        return path

    return write
