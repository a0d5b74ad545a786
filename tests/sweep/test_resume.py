"""Killing a study with SIGKILL loses at most the points in flight, and a rerun
finishes it with every point exactly once and the results of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from clustersim.sweep import load_study
from clustersim.sweep.execute import LocalExecutor
from clustersim.sweep.run import run_study
from clustersim.sweep.store import RESULTS

from .conftest import VOLATILE

STUDY = """\
name: mini-kill
base: mini.yaml
axes:
  - grid: {parallelism.tp: [1, 2]}
  - seeds: 12
"""
POINTS = 24


def _stable(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in VOLATILE if c in frame.columns])


def test_sigkill_then_resume_loses_and_duplicates_nothing(
    write_study: Callable[..., Path], study_dir: Path
) -> None:
    path = write_study(STUDY)
    out = study_dir / "out"
    cmd = [sys.executable, "-m", "clustersim", "sweep", str(path), "--out", str(out),
           "--workers", "2", "--quiet"]  # fmt: skip
    proc = subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.PIPE)
    points = out / "points"
    deadline = time.monotonic() + 120
    try:
        while len(list(points.glob("*.json"))) < 3:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no point finished in 120 s"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its pool workers
    finally:
        proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    saved = {p.stem for p in points.glob("*.json")}
    assert 3 <= len(saved) < POINTS, "the study finished before it was killed"
    assert not (out / RESULTS).exists()  # nothing that looks complete

    resumed = run_study(load_study(path), out, lambda: LocalExecutor(1))
    assert (resumed.skipped, resumed.ran) == (len(saved), POINTS - len(saved))
    assert not list(points.glob(".*.tmp"))
    frame = pd.read_parquet(out / RESULTS)
    assert len(frame) == POINTS and frame["point"].is_unique
    assert sorted(frame["index"]) == list(range(POINTS))
    assert (frame["status"] == "ok").all()
    assert set(frame["point"]) == {p.stem for p in points.glob("*.json")}

    whole = run_study(load_study(path), study_dir / "whole", lambda: LocalExecutor(1))
    pd.testing.assert_frame_equal(_stable(frame), _stable(whole.frame))
