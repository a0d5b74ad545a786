"""``validate --jobs N``: the same rows as a serial run, longest first, errors as today."""

from __future__ import annotations

import os
import pickle
from typing import Any

import pytest

from clustersim import validation
from clustersim.cli import main
from clustersim.errors import MISSING, CatalogError, ClusterSimError
from clustersim.validation import Status, validate
from clustersim.validation import parallel as par
from clustersim.validation.rows import CollectiveRef, References, Row, references

CHEAP = ["megatron-1.7b", "nemo-llama2-7b", "nccom-trn1-2x-all-reduce", "daly-interval-24h"]


def _content(rows: list[Row]) -> list[dict[str, Any]]:
    """A row's figures, without its wall time (the one thing that differs run to run)."""
    out = []
    for row in rows:
        d = row.as_dict()
        d.pop("wall_s")
        out.append(d)
    return out


def test_two_jobs_give_the_serial_rows_to_the_last_bit() -> None:
    serial = validate(CHEAP, jobs=1)
    parallel = validate(CHEAP, jobs=2)
    assert [r.name for r in parallel] == [r.name for r in serial]
    assert len(serial) > len(CHEAP)  # the measured collective is a row per size
    assert _content(parallel) == _content(serial)  # exact equality of every float


def _costed(names_costs: dict[str, float]) -> list[par.Reference]:
    every = {r.name: r for r in references().training}
    return [every[n].model_copy(update={"cost_s": c}) for n, c in names_costs.items()]


def test_the_longest_references_start_first_and_rows_keep_their_order() -> None:
    refs = _costed({"nemo-llama2-7b": 1.0, "megatron-1.7b": 5.0, "trn1-llama2-7b": 3.0})
    started: list[str] = []
    statuses: list[Status] = []

    def progress(st: Status) -> None:
        started.extend(n for n in st.running if n not in started)
        statuses.append(Status(st.total, st.jobs, st.done, dict(st.running), st.finished))
        assert len(st.running) <= 2

    rows = par.run_references(refs, jobs=2, progress=progress)
    assert started == ["megatron-1.7b", "trn1-llama2-7b", "nemo-llama2-7b"]
    assert [r.name for r in rows] == ["nemo-llama2-7b", "megatron-1.7b", "trn1-llama2-7b"]
    finished = [s.finished for s in statuses if s.finished]
    assert sorted(finished) == sorted(started) and statuses[-1].done == 3


def _bad_collective() -> CollectiveRef:
    good = references().collectives[0]
    return CollectiveRef.model_validate({**good.model_dump(), "name": "bad", "instance": "nope"})


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_reference_that_raises_is_reported_as_in_a_serial_run(
    jobs: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    refs = references()
    monkeypatch.setattr(
        validation,
        "references",
        lambda: References(training=(), collectives=(refs.collectives[0], _bad_collective())),
    )
    assert main(["validate", "--jobs", jobs]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("clustersim: error: ") and "nope" in err[-1]


def test_a_worker_that_dies_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def dies(ref: par.Reference) -> list[Row]:
        os._exit(9)  # as the kernel's out-of-memory killer would end it

    monkeypatch.setattr(par, "run_reference", dies)  # the forked workers inherit it
    with pytest.raises(ClusterSimError, match=r"worker running megatron-1\.7b died"):
        par.run_references(_costed({"megatron-1.7b": 2.0, "nemo-llama2-7b": 1.0}), jobs=2)


@pytest.mark.parametrize("value", ["0", "-2", "x", "1.5"])
def test_bad_jobs_exit_2_naming_the_option(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--jobs", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--jobs" in err and f"(got {value})" in err


def test_scenario_errors_cross_processes_whole() -> None:
    for value in (3, MISSING):
        exc = CatalogError("cluster.instance", value, "unknown instance")
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is CatalogError and str(back) == str(exc)
        assert (back.path, back.problem, back.exit_code) == (exc.path, exc.problem, 2)
    assert pickle.loads(pickle.dumps(MISSING)) is MISSING


def test_default_jobs_are_the_usable_cpus() -> None:
    assert par.default_jobs() == len(os.sched_getaffinity(0)) >= 1
