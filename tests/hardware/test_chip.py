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


def _h100(scope: str) -> ChipModel:
    spec = catalog.chip("h100")
    # the roofline's GEMMs (the catalog's H100 takes them from its measured table)
    cal = spec.calibration.model_copy(
        update={
            "matmul_latency_scope": scope,
            "gemm_times": "roofline",
            "attention_times": "roofline",
        }
    )
    return ChipModel(spec.model_copy(update={"calibration": cal}), 1)


def test_batched_kernel_pays_its_fixed_latency_once() -> None:
    """Under ``kernel`` a GPU kernel of ``count`` problems costs max(count * flops / rate,
    floor): its problems share one launch's prologue and wave tail."""
    h100 = _h100("kernel")
    cal = h100.spec.calibration
    m, k, n, count = 512, 128, 256, 64  # one problem well under the floor
    rate = h100.spec.core.tensor_tflops.bf16 * 1e12 * cal.tensor_efficiency
    one_s = 2 * m * k * n / rate
    assert one_s < cal.matmul_latency_s
    t = h100.op_time(Work(matmul=(m, k, n), count=count))
    assert t.engine_s[0] == pytest.approx(max(count * one_s, cal.matmul_latency_s), rel=1e-12)
    few = h100.op_time(Work(matmul=(m, k, n), count=2))
    assert few.engine_s[0] == pytest.approx(cal.matmul_latency_s, rel=1e-12)
    # as shipped (matmul), each problem pays the floor
    per = _h100("matmul").op_time(Work(matmul=(m, k, n), count=count))
    assert per.engine_s[0] == pytest.approx(count * cal.matmul_latency_s, rel=1e-12)


def test_attention_kernel_floor_is_not_scaled_by_its_efficiency() -> None:
    """Under ``kernel`` the fused attention kernel's problems run at its efficiency and
    its floor stays the floor."""
    h100 = _h100("kernel")
    cal = h100.spec.calibration.model_copy(update={"attention_efficiency": 0.4})
    h100 = ChipModel(h100.spec.model_copy(update={"calibration": cal}), 1)
    m, k, n, count = 4096, 128, 2048, 256
    rate = h100.spec.core.tensor_tflops.bf16 * 1e12 * 0.4
    t = h100.op_time(Work(matmul=(m, k, n), count=count, kernel="attention"))
    expected = max(count * 2 * m * k * n / rate, cal.matmul_latency_s)
    assert t.engine_s[0] == pytest.approx(expected, rel=1e-12)
    tiny = h100.op_time(Work(matmul=(128, 128, 128), count=1, kernel="attention"))
    assert tiny.engine_s[0] == pytest.approx(cal.matmul_latency_s, rel=1e-12)


def test_systolic_array_pays_its_latency_per_matmul(trn2: ChipModel) -> None:
    """A NeuronCore runs each of an op's matmuls as its own instruction stream:
    count * max(flops / rate, floor)."""
    cal = trn2.spec.calibration
    assert cal.matmul_latency_scope == "matmul"
    count = 16
    t = trn2.op_time(Work(matmul=(1, 128, 128), count=count))
    assert t.engine_s[0] == pytest.approx(count * cal.matmul_latency_s, rel=1e-12)
