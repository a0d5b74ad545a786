"""The memory check: the runtime's reserve, the allocator's fragmentation, and the rule
that refuses only what cannot fit (``workload.memcheck``, ``catalog.reserve``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scenario_texts import TINY

from clustersim import catalog
from clustersim.catalog.reserve import RuntimeReserve, memory_file, runtime_reserve
from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.hardware.chip import ChipModel
from clustersim.scenario import load_scenario
from clustersim.validation.rows import references
from clustersim.validation.training import scenario_text
from clustersim.workload import check_fits, make_layout, memory_check, memory_per_rank
from clustersim.workload.memcheck import communicators

from .helpers import check_refuses, llama3_8b, setup

GIB = 2.0**30
MIB = 2.0**20


def test_every_figure_names_its_source() -> None:
    for family, entry in memory_file().items():
        figures = [*entry.per_rank.values(), *entry.per_communicator.values()]
        for fig in [*figures, entry.fragmentation]:
            assert len(fig.source) > 20, family


def test_gpu_reserve_by_hand() -> None:
    # 512 MiB CUDA context + 2 x 32 MiB cuBLAS workspaces; 16 channels x 2 peers x 4 MiB
    # of NCCL buffers for each communicator.
    r = runtime_reserve(catalog.chip("h100"))
    assert r.per_rank_bytes == 512 * MIB + 64 * MIB
    assert r.per_communicator_bytes == 16 * 2 * 4 * MIB
    assert r.reserve_bytes(3) == 576 * MIB + 3 * 128 * MIB
    _, _, lay = setup(64, 1, tp=8, pp=2, global_batch_size=64)
    assert communicators(lay) == 3  # tp, dp, pp


def test_chip_keys_replace_the_family_figures() -> None:
    r = runtime_reserve(catalog.chip("h100", {"memory": {"reserve_bytes": "1GiB"}}))
    assert (r.reserve_bytes(5), r.fragmentation) == (GIB, 0.10)
    r = runtime_reserve(catalog.chip("h100", {"memory": {"fragmentation": 0.3}}))
    assert r.fragmentation == 0.3 and r.per_communicator_bytes == 128 * MIB


def test_refused_only_when_the_reserve_does_not_fit() -> None:
    model = llama3_8b()
    par, train, lay = setup(64, 1, tp=8, recompute="none", seq_len=4096, global_batch_size=64)
    mem = memory_per_rank(model, par, train, lay, 0)  # one rank per chip, one stage
    counted, acts = mem.total, mem.activations
    reserve = RuntimeReserve(per_rank_bytes=GIB, per_communicator_bytes=0.0, fragmentation=0.2)
    need = counted + GIB
    # fits with the fragmentation: no warning
    ok = check_fits(model, par, train, lay, need + 0.2 * acts + 1.0, reserve=reserve)
    assert ok.warning is None and ok.need_bytes == pytest.approx(need)
    # fits only without it: runs, with a warning
    tight = check_fits(model, par, train, lay, need + 0.1 * acts, reserve=reserve)
    assert tight.warning is not None and "may not fit" in tight.warning
    assert tight.gib()["fragmentation"] == pytest.approx(0.2 * acts / GIB)
    # the counted state fits, the reserve does not: refused, the reserve named
    with pytest.raises(ScenarioError, match=r"runtime reserve 1\.0 per chip") as err:
        check_fits(model, par, train, lay, counted + 0.5 * GIB, reserve=reserve)
    assert err.value.path == "parallelism"
    # without a reserve the check is the counted state alone
    assert memory_check(model, par, train, lay, counted).warning is None


def test_no_validation_row_is_refused() -> None:
    """Every published training run ran, so none may be refused: the counted state and
    the runtime's reserve fit in HBM (memory only, nothing simulated)."""
    for ref in references().training:
        res = load_scenario(scenario_text(ref))
        sc = res.scenario
        lay = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
        mc = memory_check(
            res.model,
            sc.parallelism,
            sc.training,
            lay,
            ChipModel(res.chip, res.lnc).hbm_bytes_per_rank,
            reserve=runtime_reserve(res.chip),
            moe=sc.moe,
            seed=sc.seed,
        )
        assert mc.need_bytes <= mc.capacity_bytes, (ref.name, mc.gib())


def test_check_prints_the_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(TINY)
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "runtime reserve" in out and "allocator fragmentation" in out


def test_bad_memory_keys_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    check_refuses(tmp_path, capsys, TINY, ["cluster.chip.memory.fragmentation=1.5"], "memory")
    check_refuses(tmp_path, capsys, TINY, ["cluster.chip.memory.reserve_bytes=-1"], "memory")


def test_a_run_that_fits_only_without_fragmentation_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(TINY)
    res = load_scenario(path)
    sc = res.scenario
    lay = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
    rpc = res.ranks_per_chip
    mc = memory_check(res.model, sc.parallelism, sc.training, lay, res.chip.hbm_bytes / rpc)
    # all of the activations again as fragmentation; HBM halfway between
    hbm = mc.counted_bytes + mc.per_rank.activations * rpc / 2
    sets = ["--set", "cluster.chip.memory.fragmentation=1.0"]
    sets += ["--set", f"cluster.chip.hbm_bytes={hbm:.0f}"]
    assert main(["check", str(path), *sets]) == 0
    assert "may not fit" in capsys.readouterr().err
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet", *sets]) == 0
    assert "may not fit" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert "may not fit" in summary["memory_check"]["warning"]
    sets[-1] = f"cluster.chip.hbm_bytes={mc.counted_bytes * 0.9:.0f}"
    assert main(["check", str(path), *sets]) == 2
