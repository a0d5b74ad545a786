"""Smoke tests of every subcommand, and the bad-input contract (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from program_helpers import BREAKDOWN_PARTS

from clustersim.cli import main

SUMMARY_KEYS = {
    "scenario", "chips", "ranks", "step_time_s", "tokens_per_step", "tokens_per_s",
    "model_flops_per_step", "mfu", "hfu", "breakdown_s", "memory_gib_per_chip", "cost",
    "events", "wall_s", "fidelity", "clustersim_version",
}  # fmt: skip
TRACE_COLUMNS = {
    "rank", "chip", "core", "resource", "op", "layer", "microbatch", "phase",
    "start_s", "end_s", "flops", "bytes",
}  # fmt: skip


def test_run_writes_outputs(
    tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["run", str(tiny_yaml), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "MFU" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_KEYS
    parts = summary["breakdown_s"]
    assert set(parts) == BREAKDOWN_PARTS
    assert sum(parts.values()) == pytest.approx(summary["step_time_s"], rel=1e-9)
    assert set(summary["memory_gib_per_chip"]) == {
        "weights", "grads", "optimizer", "activations", "total", "capacity",
    }  # fmt: skip
    assert 0 < summary["mfu"] <= summary["hfu"] < 1
    trace = pd.read_parquet(out / "trace.parquet")
    assert set(trace.columns) >= TRACE_COLUMNS
    assert (trace["end_s"] >= trace["start_s"]).all()
    assert trace["end_s"].max() == pytest.approx(summary["step_time_s"])
    assert (out / "resolved_scenario.yaml").exists()


def test_run_json_and_set(
    tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "run",
        str(tiny_yaml),
        "--out",
        str(tmp_path / "o"),
        "--json",
        "--set",
        "training.steps=2",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step_time_s"] > 0


def test_run_is_deterministic(tiny_yaml: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", str(tiny_yaml), "--out", str(a), "--quiet"]) == 0
    assert main(["run", str(tiny_yaml), "--out", str(b), "--quiet"]) == 0
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    for s in (sa, sb):
        s.pop("wall_s")
        s.pop("events_per_s")
    assert sa == sb
    assert pd.read_parquet(a / "trace.parquet").equals(pd.read_parquet(b / "trace.parquet"))


def test_check(tiny_yaml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(tiny_yaml)]) == 0
    out = capsys.readouterr().out
    assert "rank placement" in out
    assert "memory per chip" in out
    assert main(["check", str(tiny_yaml), "--set", "parallelism.zero=3"]) == 0
    out = capsys.readouterr().out
    assert "sharding: zero 3 over dp_shard" in out
    assert "prefetch buffer" in out


def test_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog"]) == 0
    assert "trn2" in capsys.readouterr().out
    assert main(["catalog", "chips", "trn2"]) == 0
    assert "hbm_bytes" in capsys.readouterr().out
    assert main(["catalog", "models"]) == 0
    assert "llama3-70b" in capsys.readouterr().out


def test_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "parallelism" in schema["properties"]


@pytest.mark.parametrize(
    ("sets", "path"),
    [
        (["parallelism.tp=3"], "parallelism"),
        (["parallelism.dp=3"], "parallelism"),
        (["model.heads=6", "model.kv_heads=2", "model.hidden=1026"], "parallelism.tp"),
        (["parallelism.pp=3"], "parallelism.pp"),
        (["training.global_batch_size=31"], "training.global_batch_size"),
        (["cluster.instance=nope"], "cluster"),
        (["parallelism.colour=red"], "parallelism.colour"),
        (["training.seq_len=-5"], "training.seq_len"),
        (["cluster.chip.hbm_bytes=100MiB"], "parallelism"),
        (["parallelism.zero=3", "parallelism.dp_shard=3"], "parallelism.dp_shard"),
        (["parallelism.zero=3", "parallelism.fsdp.unit=block"], "parallelism.fsdp.unit"),
        (["parallelism.zero=3", "parallelism.fsdp.prefetch=-1"], "parallelism.fsdp.prefetch"),
        (["parallelism.zero=1", "parallelism.dp_shard=1"], "parallelism.dp_shard"),
        (["parallelism.zero=4"], "parallelism.zero"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str], path: str
) -> None:
    args = ["run", str(tiny_yaml), "--out", str(tmp_path / "o")]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert f"error: {path}" in err, err


def test_yaml_error_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [x\n")
    assert main(["run", str(bad)]) == 2
    assert "YAML error" in capsys.readouterr().err


def test_out_refuses_other_scenario_unless_forced(
    tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "shared"
    assert main(["run", str(tiny_yaml), "--out", str(out), "--quiet", "--no-report"]) == 0
    other = [
        "run",
        str(tiny_yaml),
        "--out",
        str(out),
        "--quiet",
        "--no-report",
        "--set",
        "name=other",
    ]
    assert main(other) == 2
    assert "holds the results of scenario 'tiny'" in capsys.readouterr().err
    assert main([*other, "--force"]) == 0
    assert json.loads((out / "summary.json").read_text())["scenario"] == "other"


def test_fidelity_and_limits_flags(
    tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["run", str(tiny_yaml), "--out", str(tmp_path / "f"), "--json", "--no-report"]
    assert main([*base, "--fidelity", "folded"]) == 0
    assert json.loads(capsys.readouterr().out)["fidelity"] == "folded"
    assert main([*base, "--max-events", "10"]) == 2
    assert "over the limit" in capsys.readouterr().err
    assert main([*base, "--max-memory", "lots"]) == 2
    assert "--max-memory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [[], ["run"], ["run", "--bogus", "x"], ["nonesuch"], ["run", "a.yaml", "--seed", "x"]],
)
def test_usage_errors_are_one_line_with_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "error:" in err
    assert "--help" in err


def test_tiled_gemms_on_a_gpu_exit_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gemm_times: tiled`` prices NKI kernels on a NeuronCore: a GPU refuses it."""
    path = tmp_path / "p5.yaml"
    path.write_text(
        "name: p5-tiled\n"
        "cluster: {instance: p5.48xlarge, count: 1}\n"
        "model: llama3-8b\n"
        "parallelism: {tp: 8}\n"
        "training: {seq_len: 4096, global_batch_size: 8, precision: bf16}\n"
    )
    args = ["run", str(path), "--out", str(tmp_path / "o")]
    assert main([*args, "--set", "cluster.chip.calibration.gemm_times=tiled"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "error: cluster.chip.calibration" in err and "gemm_times 'tiled'" in err, err
    assert not (tmp_path / "o" / "summary.json").exists()
