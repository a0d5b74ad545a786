"""Shared fixtures: small scenarios that simulate in well under a second."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings
from scenario_texts import TINY

# Property tests are deterministic by default (same examples on every run, no
# example database), so CI failures reproduce. HYPOTHESIS_PROFILE=dev explores anew.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def tiny_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path
