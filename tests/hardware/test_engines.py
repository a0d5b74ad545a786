"""The engine model (``chip_model: engines``) against closed forms and the roofline."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from clustersim import catalog
from clustersim.catalog.schema import ChipSpec
from clustersim.hardware import ChipModel, Work
from clustersim.hardware.engines import ACT_BYTES, EngineChip
from clustersim.hardware.tiles import DMA, ENGINE_NAMES, SCALAR, TENSOR, VECTOR, TiledOp
from clustersim.sim.engines_exec import SegmentRun, run_segment


def _run(chip: EngineChip, ops: list[TiledOp]) -> SegmentRun:
    return run_segment(ops, chip.hbm_rank_Bps, chip.sbuf_bytes_per_core)


def test_lone_matmul_is_tiles_times_tile_time_plus_prologue_and_epilogue() -> None:
    spec = catalog.chip("trn2")
    eng, cal, lnc = spec.engines, spec.calibration, 2
    assert eng is not None
    chip = EngineChip(spec, lnc)
    m, k, n = 4096, 8192, 8192
    store = ACT_BYTES * m * n
    hbm = 2 * (m * k + k * n) + store
    op = chip.lower(Work((m, k, n), 1, "bf16", hbm_bytes=hbm))
    # By hand, from the NKI rules and the catalog: 128 x 512 output tiles on a
    # 128 x 128 array, 64 instructions of 512 cycles each, dealt to the 2 cores.
    steps = math.ceil(m / 512) * math.ceil(n / 128) // lnc
    instr_s = 2 * 128 * 128 * 512 / (spec.core.tensor_tflops.bf16 * 1e12 * cal.tensor_efficiency)
    tile_s = math.ceil(k / 128) * instr_s
    dma_Bps = lnc * min(
        eng.dma_queues * eng.dma_queue_Bps, spec.hbm_bw_Bps * cal.hbm_efficiency / 8
    )
    load_s = hbm / steps / dma_Bps  # the queues move each tile's operands and the result before
    copy_s = max(64, 512) / (eng.clock_ghz.vector * 1e9)  # PSUM -> SBUF
    store_s = store / steps / dma_Bps
    expected = cal.op_overhead_s + load_s + steps * tile_s + copy_s + store_s
    assert op.tiles == steps == 256
    assert [st.engine for st in op.stages] == [DMA, TENSOR, VECTOR]
    assert op.isolated_s() == pytest.approx(expected, rel=1e-12)
    run = _run(chip, [op])
    assert run.total_s == pytest.approx(expected, rel=1e-12)
    assert run.busy_s[TENSOR] == pytest.approx(steps * tile_s, rel=1e-12)


def _roofline(spec: ChipSpec) -> ChipModel:
    """``spec``'s roofline model, GEMMs priced from its efficiency (not a measured table)."""
    cal = spec.calibration.model_copy(update={"gemm_times": "roofline"})
    return ChipModel(spec.model_copy(update={"calibration": cal}), spec.lnc_default)


@pytest.mark.parametrize("chip_name", ["trn1", "trn2", "trn3", "h100", "a100"])
@pytest.mark.parametrize(
    "work",
    [
        # 38016 = 297 x 128 rows: full waves of CTA tiles on 108 and on 132 SMs
        Work((38016, 4096, 4096), 1, "bf16", hbm_bytes=2.0 * (3 * 4096 * 4096 + 38016 * 4096)),
        Work((38016, 8192, 3584), 2, "bf16", hbm_bytes=3e8),
        Work(vector_ops=4 * 8192 * 4096, scalar_ops=8192, hbm_bytes=2 * 2 * 8192 * 4096),
        Work(scalar_ops=8192 * 14336, vector_ops=8192 * 14336, hbm_bytes=3 * 2 * 8192 * 14336),
    ],
    ids=["matmul", "matmul-x2", "norm", "activation"],
)
def test_engines_match_the_roofline_on_isolated_ops(chip_name: str, work: Work) -> None:
    spec = catalog.chip(chip_name)
    lnc = spec.lnc_default
    roofline = _roofline(spec).op_time(work)
    chip = EngineChip(spec, lnc)
    hbm_core_Bps = spec.hbm_bw_Bps * spec.calibration.hbm_efficiency / spec.cores
    if chip.dma_core_Bps < hbm_core_Bps and ENGINE_NAMES[chip.lower(work).bound] == "dma":
        pytest.skip("the DMA queues, not HBM, bound this op on this chip")
    run = _run(chip, [chip.lower(work)])
    assert run.total_s == pytest.approx(roofline.seconds, rel=0.02)


def test_gpu_tiles_run_in_waves_over_the_sms() -> None:
    spec = catalog.chip("h100")
    work = Work((8192, 4096, 4096), 1, "bf16")  # 64 x 32 = 2,048 CTA tiles on 132 SMs
    chip = EngineChip(spec, 1)
    op = chip.lower(work)
    assert op.tiles == math.ceil(2048 / 132) == 16  # the last wave is half empty
    roofline = _roofline(spec).op_time(work).seconds
    assert _run(chip, [op]).total_s / roofline == pytest.approx(16 / (2048 / 132), rel=0.01)


def _attention(chip: EngineChip) -> list[TiledOp]:
    q, s, d, heads = 4096, 4096, 128, 8
    half = s // 2  # causal
    scores = heads * q * half
    qk = Work((q, d, half), heads, "bf16", hbm_bytes=float(2 * heads * (q + s) * d))
    softmax = Work(scalar_ops=float(scores), vector_ops=float(2 * scores))
    pv = Work((q, half, d), heads, "bf16", hbm_bytes=float(2 * heads * (s + q) * d))
    first = chip.lower(qk)
    middle = chip.lower(softmax, fused=True, prev_tiles=first.tiles)
    return [first, middle, chip.lower(pv, fused=True, prev_tiles=middle.tiles)]


def _chunks(run: SegmentRun, op: int, engine: int) -> list[tuple[float, float]]:
    sel = (run.chunk_op == op) & (run.chunk_engine == engine)
    return sorted(zip(run.chunk_start_s[sel].tolist(), run.chunk_end_s[sel].tolist(), strict=True))


def test_attention_runs_tensor_then_softmax_then_tensor_per_tile_and_overlaps_tiles() -> None:
    chip = EngineChip(catalog.chip("trn2"), 2)
    ops = _attention(chip)
    run = _run(chip, ops)
    qk, soft_v, soft_s, pv = (
        _chunks(run, 0, TENSOR), _chunks(run, 1, VECTOR), _chunks(run, 1, SCALAR),
        _chunks(run, 2, TENSOR),
    )  # fmt: skip
    assert len(qk) == len(soft_s) == len(pv) == 8
    for c in range(8):
        # Tensor (QK^T) -> Vector, Scalar (softmax) -> Tensor (PV), chunk by chunk
        assert qk[c][0] < soft_v[c][0] <= soft_s[c][0] < pv[c][0]
        assert qk[c][1] <= soft_s[c][1] <= pv[c][1]
    # Across tiles, engines overlap: QK^T of a later chunk runs during an earlier chunk's
    # softmax (how far ahead Tensor runs depends on the engines' relative speeds).
    assert any(
        qk[later][0] < soft_s[c][1] and qk[later][1] > soft_s[c][0]
        for c in range(7)
        for later in range(c + 1, 8)
    )
    # ... so the fused block beats its ops one after another.
    alone = sum(_run(chip, [replace(op, fused=False)]).total_s for op in ops)
    assert run.total_s < 0.9 * alone


def test_engine_model_is_deterministic() -> None:
    chip = EngineChip(catalog.chip("trn2"), 2)
    a, b = _run(chip, _attention(chip)), _run(chip, _attention(chip))
    assert a.total_s == b.total_s
    assert (a.chunk_start_s == b.chunk_start_s).all()
    assert a.events == b.events
