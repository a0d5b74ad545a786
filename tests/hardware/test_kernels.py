"""Measured GPU kernel tables: the lookup against the shipped grids, and physics checks."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from clustersim.hardware.kernels import (
    GemmTable,
    _arrays,
    allreduce_table,
    attention_table,
    gemm_table,
)
from clustersim.hardware.kernels_build import CHIPS, peak_tflops, write_npz

BIG = 8192


def _table(chip: str) -> GemmTable:
    table = gemm_table(chip)
    assert table is not None
    return table


def _peak(chip: str, precision: str) -> float:
    return peak_tflops(chip)[0][precision] * 1e12


@pytest.mark.parametrize("chip", list(CHIPS))
def test_lookup_reproduces_every_measured_point(chip: str) -> None:
    table = _table(chip)
    for precision in table.precisions:
        m, n, k, t = table.grid(precision)
        i, j, h = np.nonzero(~np.isnan(t))
        got = table.times_s(m[i], k[h], n[j], precision)
        np.testing.assert_allclose(got, t[i, j, h], rtol=1e-6)
        # and through the cached scalar path, on a few cells
        for c in range(0, len(i), max(1, len(i) // 50)):
            scalar = table.time_s(int(m[i[c]]), int(k[h[c]]), int(n[j[c]]), precision)
            assert scalar == pytest.approx(t[i[c], j[c], h[c]], rel=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "fp8", "fp8_block"])
def test_interpolation_is_monotone_between_grid_points(precision: str) -> None:
    """Along m for n = k = 8192 on H100: between neighbouring measured m the
    lookup moves monotonically from one measured latency to the other."""
    table = _table("h100")
    m, n, _, t = table.grid(precision)
    j = int(np.searchsorted(n, BIG))
    for a in range(len(m) - 1):
        lo, hi = t[a, j, j], t[a + 1, j, j]
        if m[a + 1] - m[a] < 2:
            continue
        ms = np.unique(np.geomspace(m[a], m[a + 1], 12).round())
        got = table.times_s(ms, np.full_like(ms, BIG), np.full_like(ms, BIG), precision)
        steps = np.diff(got) * np.sign(hi - lo)
        assert (steps >= -1e-15).all()
        assert got.min() >= min(lo, hi) * (1 - 1e-9)
        assert got.max() <= max(lo, hi) * (1 + 1e-9)


def test_large_h100_gemm_efficiency_is_plausible() -> None:
    table = _table("h100")
    bf16 = table.efficiency(BIG, BIG, BIG, "bf16", _peak("h100", "bf16"))
    fp8 = table.efficiency(BIG, BIG, BIG, "fp8", _peak("h100", "fp8"))
    assert 0.6 < bf16 < 0.9
    assert 0.5 < fp8 < 0.85
    # FP8 is faster than BF16, though less than twice as fast
    t_bf16 = table.time_s(BIG, BIG, BIG, "bf16")
    assert t_bf16 / 2 < table.time_s(BIG, BIG, BIG, "fp8") < t_bf16


def test_ceilings_stay_below_peak(capsys: pytest.CaptureFixture[str]) -> None:
    lines = []
    for chip in CHIPS:
        table = _table(chip)
        for precision in table.precisions:
            ceiling = table.ceiling(precision, _peak(chip, precision))
            big = table.efficiency(BIG, BIG, BIG, precision, _peak(chip, precision))
            lines.append(f"{chip:6s} {precision:9s} ceiling {ceiling:.3f}  8192^3 {big:.3f}")
            assert 0.3 < ceiling < 1.0
            assert big <= ceiling + 1e-9
    with capsys.disabled():
        print("\nbest measured GEMM efficiency against the dense peak:")
        print("\n".join(lines))


@pytest.mark.parametrize("chip", list(CHIPS))
def test_small_m_is_far_less_efficient(chip: str) -> None:
    """16 tokens against an 8192 x 8192 weight: too few output tiles to fill the
    SMs, and the weights must still stream from HBM."""
    table = _table(chip)
    peak = _peak(chip, "bf16")
    small = table.efficiency(16, BIG, BIG, "bf16", peak)
    large = table.efficiency(BIG, BIG, BIG, "bf16", peak)
    assert small < 0.2 * large


def test_extrapolation_scales_with_flops_above_and_floors_below() -> None:
    table = _table("h100")
    m, n, k, _ = table.grid("bf16")
    top, side = int(m[-1]), int(n[-1])
    edge = table.time_s(top, 4096, 4096, "bf16")
    assert table.time_s(4 * top, 4096, 4096, "bf16") == pytest.approx(4 * edge, rel=1e-12)
    both = table.time_s(2 * top, 4096, 2 * side, "bf16")
    assert both == pytest.approx(4 * table.time_s(top, 4096, side, "bf16"), rel=1e-12)
    floor = table.time_s(1, int(k[0]), int(n[0]), "bf16")
    assert table.time_s(1, 1, 1, "bf16") == pytest.approx(floor, rel=1e-12)


def test_unmeasured_cells_are_filled_at_plausible_efficiency() -> None:
    table = _table("h100")
    m, n, k, t = table.grid("bf16")
    holes = np.argwhere(np.isnan(t))
    assert len(holes) > 0
    peak = _peak("h100", "bf16")
    ceiling = table.ceiling("bf16", peak)
    for i, j, h in holes[:: max(1, len(holes) // 10)]:
        eff = table.efficiency(int(m[i]), int(k[h]), int(n[j]), "bf16", peak)
        assert 0.0 < eff <= ceiling + 1e-9


def test_precision_names() -> None:
    table = _table("h100")
    assert table.time_s(4096, 4096, 4096, "fp16") == table.time_s(4096, 4096, 4096, "bf16")
    with pytest.raises(ValueError, match=r"'fp8'.*available: bf16"):
        _table("a100").time_s(4096, 4096, 4096, "fp8")
    with pytest.raises(ValueError, match="fp32"):
        table.time_s(4096, 4096, 4096, "fp32")


def test_unknown_chip_has_no_table() -> None:
    assert gemm_table("trn2") is None
    assert gemm_table("no-such-chip") is None
    assert attention_table("trn1") is None


def test_attention_lookup_reproduces_measured_cells() -> None:
    table = attention_table("h100")
    assert table is not None
    seqs, problems, lat = table.grid("bf16", 128)
    for s_i, p_i in np.argwhere(~np.isnan(lat[0]))[::37]:
        p, s = int(problems[p_i]), int(seqs[s_i])  # as one sequence of p heads, MHA
        assert table.forward_s(1, s, p, p, 128) == pytest.approx(lat[0, s_i, p_i], rel=1e-6)


def test_attention_forward_physics() -> None:
    table = attention_table("h100")
    assert table is not None
    seq, heads, dim = 8192, 32, 128
    t = table.forward_s(1, seq, heads, 8, dim)
    causal_flops = 4 * seq * seq * heads * dim / 2
    assert 0.3 < causal_flops / (t * _peak("h100", "bf16")) < 0.8
    # twice the batch is about twice the time; past the longest measured sequence, s^2
    assert table.forward_s(2, seq, heads, 8, dim) == pytest.approx(2 * t, rel=0.15)
    longest = int(table.grid("bf16", dim)[0][-1])
    edge = table.forward_s(1, longest, heads, 8, dim)
    assert table.forward_s(1, 2 * longest, heads, 8, dim) == pytest.approx(4 * edge, rel=1e-12)
    # grouped-query attention is no slower than multi-head; FP8 is faster than BF16
    assert t <= table.forward_s(1, seq, heads, heads, dim) * 1.02
    assert table.forward_s(1, seq, heads, 8, dim, precision="fp8") < t
    # an unmeasured head dimension scales from the nearest measured one
    assert table.forward_s(1, seq, heads, 8, 96) == pytest.approx(t * 96 / 128, rel=1e-12)
    with pytest.raises(ValueError, match="kv_heads"):
        table.forward_s(1, seq, heads, 5, dim)


def test_shipped_files_are_small_and_documented() -> None:
    folder = Path(__file__).resolve().parents[2] / "clustersim" / "catalog" / "kernels"
    sizes = {p.name: p.stat().st_size for p in folder.glob("*.npz")}
    stems = set(CHIPS) | {f"{chip}-vllm" for chip, src in CHIPS.items() if src.vllm}
    moe = {f"moe-{chip}" for chip in CHIPS}
    decode = {f"decode-{chip}" for chip in CHIPS}
    assert set(sizes) == {f"{stem}.npz" for stem in stems | moe | decode}
    assert sum(sizes.values()) < 3 << 20
    sources = (folder / "SOURCES.md").read_text(encoding="utf-8")
    assert "Apache-2.0" in sources
    assert all(f"## {stem} " in sources for stem in stems)
    moe_sources = (folder / "MOE_SOURCES.md").read_text(encoding="utf-8")
    assert "Apache-2.0" in moe_sources
    assert all(f"## {stem} " in moe_sources for stem in moe)
    decode_sources = (folder / "DECODE_SOURCES.md").read_text(encoding="utf-8")
    assert "Apache-2.0" in decode_sources
    assert all(f"## {stem} " in decode_sources for stem in decode)


def test_npz_writer_is_reproducible(tmp_path: Path) -> None:
    arrays = {"b.x": np.arange(5, dtype=np.int32), "a.y": np.array([1.5, np.nan], np.float32)}
    write_npz(tmp_path / "one.npz", arrays)
    write_npz(tmp_path / "two.npz", dict(reversed(arrays.items())))
    one = (tmp_path / "one.npz").read_bytes()
    assert one == (tmp_path / "two.npz").read_bytes()
    with np.load(io.BytesIO(one), allow_pickle=False) as npz:
        np.testing.assert_array_equal(npz["a.y"], arrays["a.y"])
        assert npz.files == ["a.y", "b.x"]


def test_vllm_runs_its_own_gemms_where_they_were_measured() -> None:
    vllm, default = gemm_table("h100", "vllm"), gemm_table("h100")
    assert vllm is not None and default is not None
    assert vllm.source("fp8").startswith("vllm 0.24.0")
    assert "CutlassFP8ScaledMM" in vllm.source("fp8")
    assert default.source("fp8").startswith("trtllm")
    # vLLM's CUTLASS scaled_mm is faster than the torch FP8 GEMM at decode's small m
    assert vllm.time_s(8, 8192, 2560, "fp8") < default.time_s(8, 8192, 2560, "fp8")
    # a chip or framework without tables of its own falls back to the default file
    fallback = gemm_table("h100", "no-such-framework")
    assert fallback is not None and fallback.source("fp8") == default.source("fp8")
    assert gemm_table("trn2", "vllm") is None


@pytest.mark.parametrize(("chip", "framework"), [("h100", None), ("h200", "vllm"), ("b200", None)])
def test_allreduce_lookup_is_the_measured_kernel(chip: str, framework: str | None) -> None:
    """At every measured size the engine's all-reduce is the measurement; between two,
    log-log interpolation; below the smallest its latency; past the largest, refused."""
    table = allreduce_table(chip, framework)
    assert table is not None and table.gpus == (2, 4, 8)
    arrays = _arrays(f"{chip}-{framework}" if framework else chip)
    assert arrays is not None
    elements = arrays["allreduce.elements"]
    latency = arrays["allreduce.latency_s"].astype(np.float64)
    for g, gpus in enumerate(table.gpus):
        for e, size in enumerate(elements):
            assert table.time_s(gpus, 2.0 * size) == pytest.approx(latency[g, e], rel=1e-12)
        mid = table.time_s(gpus, 2.0 * np.sqrt(elements[3] * elements[4]))
        assert mid == pytest.approx(np.sqrt(latency[g, 3] * latency[g, 4]), rel=1e-9)
        assert table.time_s(gpus, 2.0) == pytest.approx(latency[g, 0], rel=1e-12)
    with pytest.raises(ValueError, match="no measured all-reduce"):
        table.time_s(8, 2.0 * table.max_bytes)
    with pytest.raises(ValueError, match="over 16 GPUs"):
        table.time_s(16, 1024.0)
    assert table.source.startswith("vllm" if framework else "trtllm")


def test_allreduce_tables_are_each_engines_own() -> None:
    vllm, trt = allreduce_table("h100", "vllm"), allreduce_table("h100")
    assert vllm is not None and trt is not None
    assert "vLLM_custom_graph" in vllm.source and "TRTLLM" in trt.source
    # a decode step's 64 KiB message: a few microseconds, well under NCCL's latency floor
    assert 2e-6 < trt.time_s(8, 65536.0) < 1e-5 and 2e-6 < vllm.time_s(8, 65536.0) < 1e-5
    assert allreduce_table("trn2") is None
