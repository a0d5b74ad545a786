"""The pipelined roofline against closed forms."""

from __future__ import annotations

import pytest

from clustersim import catalog
from clustersim.hardware import RESOURCES, ChipModel, Work


@pytest.fixture
def trn2() -> ChipModel:
    return ChipModel(catalog.chip("trn2"), lnc=2)


def test_lone_matmul_equals_flops_over_peak_times_efficiency(trn2: ChipModel) -> None:
    spec = trn2.spec
    m, k, n = 8192, 4096, 4096  # tile-aligned, large: compute-bound
    t = trn2.op_time(Work(matmul=(m, k, n)))
    rate = spec.core.tensor_tflops.bf16 * 1e12 * 2 * spec.calibration.tensor_efficiency
    expected = 2 * m * k * n / rate + spec.calibration.op_overhead_s
    assert t.seconds == pytest.approx(expected, rel=1e-12)
    assert RESOURCES[t.bound] == "tensor"


def test_padding_to_tiles(trn2: ChipModel) -> None:
    aligned = trn2.matmul_s(4096, 4096, 4096)
    ragged = trn2.matmul_s(4096, 4096 - 64, 4096 - 64)  # padded back up to 4096
    assert ragged == pytest.approx(aligned)


def test_small_matmul_is_latency_bound(trn2: ChipModel) -> None:
    lat = trn2.spec.calibration.matmul_latency_s
    assert trn2.matmul_s(1, 128, 128) == pytest.approx(lat)


def test_roofline_takes_busiest_resource(trn2: ChipModel) -> None:
    spec = trn2.spec
    hbm_bytes = 1e9
    t = trn2.op_time(Work(vector_ops=1e3, hbm_bytes=hbm_bytes))
    share = spec.hbm_bw_Bps * spec.calibration.hbm_efficiency * trn2.lnc / spec.cores
    assert t.seconds == pytest.approx(hbm_bytes / share + spec.calibration.op_overhead_s)
    assert RESOURCES[t.bound] == "hbm"


def test_engines_overlap(trn2: ChipModel) -> None:
    v = trn2.op_time(Work(vector_ops=1e9))
    s = trn2.op_time(Work(scalar_ops=1e9))
    both = trn2.op_time(Work(vector_ops=1e9, scalar_ops=1e9))
    assert both.seconds == pytest.approx(max(v.seconds, s.seconds))


def test_lnc_sets_ranks_per_chip() -> None:
    spec = catalog.chip("trn2")
    assert ChipModel(spec, 2).ranks_per_chip == 4
    assert ChipModel(spec, 1).ranks_per_chip == 8
    assert ChipModel(catalog.chip("h100"), 1).ranks_per_chip == 1


def test_gpu_uses_same_abstraction() -> None:
    h100 = ChipModel(catalog.chip("h100"), 1)
    t = h100.op_time(Work(matmul=(8192, 8192, 8192)))
    assert RESOURCES[t.bound] == "tensor"
    assert h100.peak_flops("bf16") == pytest.approx(989e12)
