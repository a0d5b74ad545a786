"""Shared fixtures: small scenarios that simulate in well under a second."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests are deterministic by default (same examples on every run, no
# example database), so CI failures reproduce. HYPOTHESIS_PROFILE=dev explores anew.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TINY = """\
name: tiny
seed: 0
cluster: {instance: trn2.48xlarge, count: 1}
model: {name: tiny, layers: 4, hidden: 1024, heads: 8, kv_heads: 2, ffn_hidden: 4096, vocab: 8192}
parallelism: {tp: 4, pp: 2, zero: 1, schedule: 1f1b, recompute: selective}
training: {seq_len: 1024, global_batch_size: 32, steps: 1}
"""


@pytest.fixture
def tiny_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path
