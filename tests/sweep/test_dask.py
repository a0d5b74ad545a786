"""The Dask executor (a LocalCluster on loopback) gives the local pool's results."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from clustersim.sweep import load_study
from clustersim.sweep.execute import DaskExecutor, LocalExecutor
from clustersim.sweep.run import run_study

from .conftest import GRID_STUDY, VOLATILE

pytest.importorskip("distributed")


def _stable(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in VOLATILE if c in frame.columns])


def test_dask_local_cluster_equals_local_pool(
    write_study: Callable[..., Path], study_dir: Path
) -> None:
    path = write_study(GRID_STUDY.replace("[1, 2]", "[1, 2, 3]"))  # pp 3: failed points too
    local = run_study(load_study(path), study_dir / "local", lambda: LocalExecutor(1))
    executors: list[DaskExecutor] = []

    def dask() -> DaskExecutor:
        # Threads keep CI fast; the tasks still travel through the scheduler by key, and
        # a window of 3 makes the executor top up its tasks as points finish.
        executors.append(DaskExecutor(local_workers=2, processes=False, window=3))
        return executors[-1]

    remote = run_study(load_study(path), study_dir / "dask", dask)
    assert remote.executor == "Dask LocalCluster, 2 workers"
    assert executors[0].client.status == "closed"
    assert (remote.ok, remote.failed) == (local.ok, local.failed) == (6, 3)
    pd.testing.assert_frame_equal(_stable(local.frame), _stable(remote.frame))


def test_unreachable_scheduler_is_bad_input() -> None:
    from clustersim.errors import ScenarioError

    with pytest.raises(ScenarioError, match="--scheduler"):
        DaskExecutor("tcp://127.0.0.1:1", None, connect_timeout_s=0.5).close()


def test_missing_dask_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from clustersim.errors import ScenarioError

    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails
    with pytest.raises(ScenarioError, match=r"--dask-local: Dask is not installed"):
        DaskExecutor(local_workers=1)
