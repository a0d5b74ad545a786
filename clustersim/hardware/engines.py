"""Lowering of ``Work`` into tile streams on one rank's cores (``chip_model: engines``).

The rules follow the NKI architecture guides (``engines`` in the chip catalog holds
their figures):

- **matmul** ``(m, k, n)``: the output is cut into tiles of ``stationary`` (n) x
  ``moving`` (m) elements, one PSUM bank on a NeuronCore (128 x 512); each tile
  accumulates ``ceil(k / contraction)`` matmul instructions in PSUM. An instruction
  costs ``max(instr_min_cycles, moving)`` cycles at full rate, the Tensor engine's
  per-core peak (times the family's calibrated ``tensor_efficiency``, the same
  fraction the roofline model applies). A tile is loaded into SBUF by the DMA
  queues, multiplied on Tensor, copied PSUM -> SBUF on Vector (``max(64, N)``
  cycles), given its epilogue on Vector/Scalar, and stored.
- **element-wise ops and norms** are cut into transfer-sized tiles
  (``dma_tile_bytes``, 4 KiB per partition on a NeuronCore) and run on the engines
  their ``Work`` names, each instruction at least ``instr_min_cycles``.
- A rank owns ``lnc`` cores, and a GPU's engine runs ``units`` tiles at once (its
  SMs): tiles are dealt to ``lnc x units`` slots and the stream has one step per
  slot-full (a GPU's waves), so the last step can be partly empty (tile and wave
  quantisation).
- The DMA queues of a core move its tiles at ``min(dma_queues x dma_queue_Bps,
  its share of HBM x hbm_efficiency)``.

Where tiles are full and the stream is long, an op's time is its busiest engine's
work, which is the roofline model's figure: the two models agree within the fill
and drain of the pipeline (a test holds them to 2%).
"""

from __future__ import annotations

import math

from clustersim.catalog.schema import ChipSpec
from clustersim.hardware.tiles import DMA, GPSIMD, SCALAR, TENSOR, VECTOR, Stage, TiledOp
from clustersim.hardware.work import Work

__all__ = ["ACT_BYTES", "EngineChip"]

ACT_BYTES = 2
"""Bytes of a stored output element (bf16 activations, as the workload counts them)."""


class EngineChip:
    """Turns ``Work`` into :class:`TiledOp` on one rank (``lnc`` cores) of a chip."""

    def __init__(self, spec: ChipSpec, lnc: int) -> None:
        eng = spec.engines
        if eng is None:
            raise ValueError(f"chip {spec.name} has no engine description")
        self.spec = spec
        self.engines = eng
        self.lnc = lnc
        core, cal = spec.core, spec.calibration
        self.slots = eng.units * lnc
        """Tiles in flight at once on the rank: cores x units per engine."""
        self._tensor_eff = cal.tensor_efficiency
        self._tensor_unit = {
            p: core.tensor_tflops.get(p) * 1e12 / eng.units for p in ("bf16", "fp16", "fp8", "fp32")
        }
        self._vector_rank = core.vector_tflops * 1e12 * lnc
        self._scalar_rank = core.scalar_tflops * 1e12 * lnc
        self._gpsimd_rank = core.gpsimd_tflops * 1e12 * lnc
        hbm_core = spec.hbm_bw_Bps * cal.hbm_efficiency / spec.cores
        self.dma_core_Bps = min(eng.dma_queues * eng.dma_queue_Bps, hbm_core)
        self.hbm_rank_Bps = hbm_core * lnc
        self._clock = eng.clock_ghz
        self._min = eng.instr_min_cycles
        self._issue_s = cal.op_overhead_s
        self._sbuf_core = core.sbuf_bytes
        self._cache: dict[tuple[int, bool], TiledOp] = {}

    @property
    def sbuf_bytes_per_core(self) -> float:
        return self._sbuf_core

    def _floor_s(self, clock_ghz: float) -> float:
        return self._min / (clock_ghz * 1e9)

    def lower(self, work: Work, fused: bool = False, prev_tiles: int = 0) -> TiledOp:
        """The tile stream of ``work``. ``fused``: it streams from the previous op,
        whose tile count (``prev_tiles``) an op without a matmul takes over."""
        key = (id(work), fused)
        hit = self._cache.get(key)
        if hit is not None and (not fused or hit.tiles == max(prev_tiles, 1)):
            return hit
        op = (
            self._matmul(work, fused)
            if work.matmul is not None
            else self._elementwise(work, fused, prev_tiles)
        )
        self._cache[key] = op
        return op

    def _dma(self, load_bytes: float, store_bytes: float, steps: int) -> tuple[float, float]:
        """Seconds per step on the DMA queues (loads and stores), and the last store."""
        per_rank = self.dma_core_Bps * self.lnc
        return (load_bytes + store_bytes) / steps / per_rank, store_bytes / steps / per_rank

    def _epilogue(self, work: Work, steps: int) -> list[Stage]:
        out: list[Stage] = []
        vector_ops = work.vector_ops
        if work.gpsimd_ops and not self._gpsimd_rank:
            vector_ops += work.gpsimd_ops  # no GPSIMD engine (GPUs): the ALUs run it
        if vector_ops:
            t = max(vector_ops / steps / self._vector_rank, self._floor_s(self._clock.vector))
            out.append(Stage(VECTOR, t))
        if work.scalar_ops:
            t = max(work.scalar_ops / steps / self._scalar_rank, self._floor_s(self._clock.scalar))
            out.append(Stage(SCALAR, t))
        if work.gpsimd_ops and self._gpsimd_rank:
            t = max(work.gpsimd_ops / steps / self._gpsimd_rank, self._floor_s(self._clock.gpsimd))
            out.append(Stage(GPSIMD, t))
        return out

    def _matmul(self, work: Work, fused: bool) -> TiledOp:
        assert work.matmul is not None
        m, k, n = work.matmul
        eng = self.engines
        stationary, contraction, moving = eng.matmul_tile
        m_tiles = math.ceil(m / moving)
        tiles = work.count * m_tiles * math.ceil(n / stationary)
        steps = math.ceil(tiles / self.slots)
        moving_avg = m / m_tiles
        # One instruction: a stationary x contraction block against `moving_avg` columns.
        instr_s = max(
            self._floor_s(self._clock.tensor),
            2.0
            * stationary
            * contraction
            * moving_avg
            / (self._tensor_unit[work.precision] * self._tensor_eff),
        )
        tensor_s = math.ceil(k / contraction) * instr_s
        # PSUM -> SBUF: max(64, N) cycles for N elements per lane (partition).
        copy_cycles = max(self._min, stationary * moving_avg / eng.lanes)
        copy_s = copy_cycles / (self._clock.vector * 1e9)
        store = min(work.hbm_bytes, float(ACT_BYTES * m * n * work.count))
        load = work.hbm_bytes - store
        dma_s, tail_s = self._dma(load, store, steps)
        stages: list[Stage] = []
        if work.hbm_bytes:
            stages.append(Stage(DMA, dma_s))
        stages.append(Stage(TENSOR, tensor_s))
        epilogue = self._epilogue(work, steps)
        if epilogue:  # the epilogue's first engine reads PSUM itself
            first = epilogue[0]
            clock = (self._clock.vector, self._clock.scalar, self._clock.gpsimd)[first.engine - 1]
            epilogue[0] = Stage(first.engine, first.tile_s + copy_cycles / (clock * 1e9))
        else:
            stages.append(Stage(VECTOR, copy_s))
        stages += epilogue
        load_tile = load / max(tiles, 1)
        return TiledOp(
            tuple(stages), steps, 0.0 if fused else self._issue_s, tail_s, fused, load_tile,
            work.hbm_bytes,
        )  # fmt: skip

    def _elementwise(self, work: Work, fused: bool, prev_tiles: int) -> TiledOp:
        eng = self.engines
        elems = max(work.vector_ops, work.scalar_ops, work.gpsimd_ops)
        tiles = max(
            1,
            math.ceil(work.hbm_bytes / eng.dma_tile_bytes),
            math.ceil(elems * ACT_BYTES / eng.dma_tile_bytes),
        )
        steps = max(prev_tiles, 1) if fused else math.ceil(tiles / self.slots)
        # A streaming op reads its inputs and writes its output: half its bytes are stores.
        store = work.hbm_bytes / 2
        dma_s, tail_s = self._dma(work.hbm_bytes - store, store, steps)
        stages = [Stage(DMA, dma_s)] if work.hbm_bytes else []
        stages += self._epilogue(work, steps)
        return TiledOp(
            tuple(stages), steps, 0.0 if fused else self._issue_s, tail_s, fused,
            (work.hbm_bytes - store) / tiles, work.hbm_bytes,
        )  # fmt: skip
