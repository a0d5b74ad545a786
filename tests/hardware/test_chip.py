"""The pipelined roofline against closed forms."""

from __future__ import annotations

import pytest

from clustersim import catalog
from clustersim.catalog.schema import ChipSpec
from clustersim.hardware import RESOURCES, ChipModel, Work
from clustersim.hardware.kernel_tiling import (
    roofline_efficiency,
    tensor_instructions_s,
    tiled_matmul_s,
)


def _roofline_gemms(name: str) -> ChipSpec:
    """``name``'s catalog entry with its GEMMs priced by the roofline's closed form (the
    catalog's Trainium chips take them from the tiled kernel, the GPUs from tables)."""
    spec = catalog.chip(name)
    cal = spec.calibration.model_copy(update={"gemm_times": "roofline"})
    return spec.model_copy(update={"calibration": cal})


@pytest.fixture
def trn2() -> ChipModel:
    return ChipModel(_roofline_gemms("trn2"), lnc=2)


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


# -- gemm_times: tiled (the catalog's Trainium chips) --------------------------------


def test_catalog_trainium_gemms_are_tiled() -> None:
    for name in ("trn1", "trn2", "trn3", "inf2"):
        assert catalog.chip(name).calibration.gemm_times == "tiled"


def test_tiled_gemm_is_the_best_tutorial_kernel_on_one_core() -> None:
    """Below the ceiling, a GEMM on one Trn1 core takes the tiled kernel's engine time
    (its DMA free: the op's HBM bytes are the roofline's own term)."""
    spec = catalog.chip("trn1")
    chip = ChipModel(spec, 1)
    peak = spec.core.tensor_tflops.bf16 * 1e12
    for m, k, n in ((2048, 344, 4096), (1, 8192, 320), (512, 128, 4096)):
        kernel = tiled_matmul_s(spec, m, k, n, dma=False)
        assert 2.0 * m * k * n / (kernel * peak) < spec.calibration.tensor_efficiency
        assert kernel <= tiled_matmul_s(spec, m, k, n)
        assert chip.matmul_s(m, k, n) == pytest.approx(kernel, rel=1e-12)
        assert chip.matmul_s(m, k, n, count=3) == pytest.approx(3 * kernel, rel=1e-12)


def test_tiled_gemm_never_beats_the_ceiling() -> None:
    """Trn2's engine facts run a large GEMM above 0.85 of peak; the catalog's
    tensor_efficiency (the best measured kernel's fraction) caps it."""
    spec = catalog.chip("trn2")
    m, k, n = 4096, 8192, 8192
    assert roofline_efficiency(spec, m, k, n) > spec.calibration.tensor_efficiency
    chip = ChipModel(spec, 2)
    peak = spec.core.tensor_tflops.bf16 * 1e12 * 2
    expected = 2.0 * m * k * n / (peak * spec.calibration.tensor_efficiency)
    assert chip.matmul_s(m, k, n) == pytest.approx(expected, rel=1e-12)


def test_tiled_gemm_splits_over_the_logical_cores() -> None:
    """At LNC 2 an op's problems are dealt to the two cores; one problem's rows are split,
    or its columns where it has too few rows."""
    spec = catalog.chip("trn2")
    chip = ChipModel(spec, 2)
    m, k, n = 256, 128, 4096  # below the ceiling on one core
    one = tiled_matmul_s(spec, m, k, n, dma=False)
    assert chip.matmul_s(m, k, n, count=4) == pytest.approx(2 * one, rel=1e-12)
    half = tiled_matmul_s(spec, m // 2, k, n, dma=False)
    assert chip.matmul_s(m, k, n) == pytest.approx(half, rel=1e-12)
    # a decode's one row: its columns split
    cols = tiled_matmul_s(spec, 1, k, n // 2, dma=False)
    assert chip.matmul_s(1, k, n) == pytest.approx(cols, rel=1e-12)


def test_tiled_kernel_cuts_long_row_counts_into_chunks() -> None:
    """The fully blocked kernel's accumulators hold a column block of every row: past
    SBUF the rows run in chunks, so twice the rows take twice the time, not more."""
    spec = catalog.chip("trn1")
    one = tiled_matmul_s(spec, 8192, 4096, 1536)
    assert tiled_matmul_s(spec, 16384, 4096, 1536) == pytest.approx(2 * one, rel=1e-12)


def test_tiled_attention_problem_is_its_rate_or_its_instructions() -> None:
    """A fused attention kernel's problems run at attention_efficiency; a small one takes
    no less than its tensor instructions stream for (matmul_latency_s prices nothing on
    Trainium; what leaves PSUM is the softmax's, inside the kernel's efficiency)."""
    spec = catalog.chip("trn1")
    cal = spec.calibration.model_copy(update={"attention_efficiency": 0.2})
    chip = ChipModel(spec.model_copy(update={"calibration": cal}), 1)
    peak = spec.core.tensor_tflops.bf16 * 1e12
    m, k, n, count = 4096, 128, 2048, 8
    big = chip.matmul_s(m, k, n, count=count, kernel="attention")
    assert big == pytest.approx(count * 2.0 * m * k * n / (peak * 0.2), rel=1e-12)
    cal = cal.model_copy(update={"attention_efficiency": 0.8})
    chip = ChipModel(spec.model_copy(update={"calibration": cal}), 1)
    m, k, n = 1, 128, 512  # one query row: one instruction, 64 + 512 cycles
    tiny = chip.matmul_s(m, k, n, count=count, kernel="attention")
    instructions = tensor_instructions_s(spec, m, k, n)
    assert instructions == pytest.approx(576 / 2.8e9)
    assert 2.0 * m * k * n / (peak * 0.8) < instructions < cal.matmul_latency_s
    assert tiny == pytest.approx(count * instructions, rel=1e-12)
