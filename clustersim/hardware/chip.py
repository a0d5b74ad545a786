"""Chip model: cores with Tensor, Vector, Scalar and GPSIMD engines, and shared HBM.

An op's duration is a pipelined roofline. The engines of a core work at once
and overlap with HBM traffic, so an op lasts as long as its busiest engine or
its HBM transfer, plus a fixed issue overhead.

A rank owns ``lnc`` cores (a logical NeuronCore; a whole GPU on GPUs). HBM
bandwidth is shared by every core of the chip: a rank gets the fraction of it
that its cores make up of the chip, since all ranks of a chip run the same
program in step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clustersim.catalog.schema import ChipSpec
from clustersim.hardware.kernel_tiling import (
    ELEMENT_BYTES,
    tensor_instructions_s,
    tiled_matmul_s,
)
from clustersim.hardware.kernels import attention_table, gemm_table
from clustersim.hardware.work import ENGINES, Work

__all__ = ["HBM", "ChipModel", "OpTime"]

HBM = len(ENGINES)
"""Index of HBM in ``OpTime.bound`` (after the engine indices)."""

RESOURCES: tuple[str, ...] = (*ENGINES, "hbm")


@dataclass(frozen=True, slots=True)
class OpTime:
    """The duration of one op and what bounds it (an index into ``RESOURCES``)."""

    seconds: float
    bound: int
    engine_s: tuple[float, float, float, float, float]  # tensor, vector, scalar, gpsimd, hbm


class ChipModel:
    """Turns ``Work`` into time on one rank of a chip.

    Every constant comes from the chip's catalog entry; nothing here is tuned.
    """

    def __init__(self, spec: ChipSpec, lnc: int) -> None:
        if spec.cores % lnc:
            raise ValueError(f"lnc {lnc} does not divide the {spec.cores} cores of {spec.name}")
        self.spec = spec
        self.lnc = lnc
        self.ranks_per_chip = spec.cores // lnc
        cal = spec.calibration
        core = spec.core
        self._tensor_peak = {
            p: core.tensor_tflops.get(p) * 1e12 * lnc for p in ("bf16", "fp16", "fp8", "fp32")
        }
        fp8_eff = cal.fp8_tensor_efficiency
        self._attention_eff = cal.attention_efficiency
        self._tensor_eff = {
            p: fp8_eff if p == "fp8" and fp8_eff is not None else cal.tensor_efficiency
            for p in self._tensor_peak
        }
        self._tile_k, self._tile_n = cal.tile
        self._mm_latency_s = cal.matmul_latency_s
        self._latency_per_kernel = cal.matmul_latency_scope == "kernel"
        self._vector_Bps = core.vector_tflops * 1e12 * lnc
        self._scalar_Bps = core.scalar_tflops * 1e12 * lnc
        # Cores without a GPSIMD engine run custom operators on the vector engine.
        self._gpsimd_Bps = (core.gpsimd_tflops or core.vector_tflops) * 1e12 * lnc
        self._hbm_Bps = spec.hbm_bw_Bps * cal.hbm_efficiency * lnc / spec.cores
        self._overhead_s = cal.op_overhead_s
        self._gemm = gemm_table(spec.name) if cal.gemm_times == "measured" else None
        if cal.gemm_times == "measured" and self._gemm is None:
            raise ValueError(f"{spec.name} has no measured GEMM table (gemm_times: measured)")
        self._tiled = cal.gemm_times == "tiled"
        if self._tiled and spec.engines is None:
            raise ValueError(f"{spec.name} has no engine description (gemm_times: tiled)")
        self._tile_rows = spec.engines.matmul_tile[0] if spec.engines is not None else 1
        self._attn = attention_table(spec.name) if cal.attention_times == "measured" else None
        if cal.attention_times == "measured" and self._attn is None:
            raise ValueError(
                f"{spec.name} has no measured attention table (attention_times: measured)"
            )
        self._attn_bwd = cal.attention_backward_efficiency or 1.0
        self._factor = 1.0 / cal.compute_efficiency

    @property
    def hbm_bytes_per_rank(self) -> float:
        return self.spec.hbm_bytes / self.ranks_per_chip

    def peak_flops(self, precision: str) -> float:
        """Dense peak of the whole chip at ``precision`` (the MFU denominator)."""
        return self.spec.chip_tflops.get(precision) * 1e12

    def matmul_s(
        self,
        m: int,
        k: int,
        n: int,
        precision: str = "bf16",
        *,
        count: int = 1,
        kernel: str = "",
        splits: int = 1,
    ) -> float:
        """``count`` matmuls (m, k, n) of one op on one rank's tensor engines.

        The contraction (k) and output (n) dimensions map onto the systolic
        array (or the GPU's MMA tile) and are padded up to its size. The op
        never takes less than the fixed latency (``matmul_latency_s``), so small
        ones are latency-bound. ``matmul_latency_scope`` says what pays it:
        ``matmul``, each of the op's ``count`` matmuls, ``count * max(flops /
        rate, latency)`` (a NeuronCore's one systolic array runs each as its own
        instruction stream; and, as shipped, GPUs: see the catalog's source);
        ``kernel``, the op once, ``max(count * flops / rate, latency)``: its
        problems are one launch tiled over the SMs together (a batched or
        grouped GEMM, a fused attention kernel's (sequence, head) problems).
        ``kernel == "attention"`` runs at the fused attention kernel's
        efficiency; under ``matmul`` that scales the floored time too, as the
        shipped fits were made.

        With ``gemm_times: measured`` every other matmul takes the chip's measured
        GEMM time (:mod:`clustersim.hardware.kernels`) instead: no efficiency, tile or
        floor of the catalog applies to it. With ``gemm_times: tiled`` it takes the
        time of the best tutorial kernel on one core (:meth:`_tiled_s`), and a fused
        attention problem's floor is its tensor instructions' time, not the latency.
        """
        fused = kernel.startswith("attention")
        if self._gemm is not None and not fused and self._gemm.measures(precision):
            # Measured: the kernel's own time, waves, tiles and launch floor included. An
            # op's ``count`` problems run as one batched or grouped launch whose output
            # tiles fill the SMs together, like one GEMM of count x m rows; chunked, as
            # ``splits`` such GEMMs of a share of the rows each.
            if splits > 1:
                rows = max(math.ceil(m * count / splits), 1)
                return splits * self._gemm.time_s(rows, k, n, precision)
            return self._gemm.time_s(m * count, k, n, precision)
        tiled = self._tiled and precision in ELEMENT_BYTES
        if tiled and not fused:
            rows = math.ceil(m / splits)
            problems = count * splits
            work = problems * 2.0 * rows * k * n
            ceiling_s = work / (self._tensor_peak[precision] * self._tensor_eff[precision])
            return self._tiled_s(rows, k, n, precision, problems=problems, floor_s=ceiling_s)
        k_pad = math.ceil(k / self._tile_k) * self._tile_k
        n_pad = math.ceil(n / self._tile_n) * self._tile_n
        flops = 2.0 * m * k_pad * n_pad
        eff = self._tensor_eff[precision]
        attention = fused and self._attention_eff is not None
        if tiled and attention:
            # The fused kernel's matmuls at its efficiency; a small problem no faster than
            # its instructions stream through the array (in place of matmul_latency_s);
            # what leaves PSUM is the softmax's, inside the kernel's efficiency.
            rate_s = count * flops / (self._tensor_peak[precision] * (self._attention_eff or eff))
            per_core = math.ceil(count / self.lnc)
            return max(per_core * tensor_instructions_s(self.spec, m, k, n, precision), rate_s)
        if self._latency_per_kernel:
            if attention:
                eff = self._attention_eff or eff
            return max(count * flops / (self._tensor_peak[precision] * eff), self._mm_latency_s)
        seconds = count * max(flops / (self._tensor_peak[precision] * eff), self._mm_latency_s)
        if attention:
            seconds *= eff / (self._attention_eff or eff)
        return seconds

    def _tiled_s(
        self, rows: int, k: int, n: int, precision: str, *, problems: int, floor_s: float
    ) -> float:
        """``problems`` matmuls of ``rows`` x ``k`` x ``n`` on the rank's ``lnc`` cores, each
        the engines' time of the fastest NKI tutorial kernel for its shape on one core
        (:func:`~clustersim.hardware.kernel_tiling.tiled_matmul_s` with its DMA free: the
        op's HBM traffic is the roofline's own term beside it): the problems dealt to
        the cores where they divide evenly, else each problem's rows split among them
        (its columns where it has fewer rows than a stationary tile per core). Never
        below ``floor_s``, the GEMM's time at ``tensor_efficiency`` of the peak (the
        best measured kernel's fraction, the ceiling)."""
        lnc = self.lnc
        per_core, rows_core, n_core = problems, rows, n
        if problems % lnc == 0:
            per_core = problems // lnc
        elif rows >= lnc * self._tile_rows:
            rows_core = math.ceil(rows / lnc)
        else:  # too few rows to split (a decode's): the columns
            n_core = math.ceil(n / lnc)
        kernel_s = per_core * tiled_matmul_s(self.spec, rows_core, k, n_core, precision, dma=False)
        return max(kernel_s, floor_s)

    def attention_rate(self, work: Work) -> float:
        """FLOP/s of a measured fused attention kernel's matmuls for ``work``'s kernel shape.

        The forward's rate is the measured kernel's (its causal FLOPs over its time, the
        softmax and masking inside it); the backward's that times
        ``attention_backward_efficiency``.
        """
        assert self._attn is not None and work.attention is not None
        seq, problems, qk_dim, v_dim, group = work.attention
        fwd_s = self._attn.training_s(
            1, seq, problems, max(problems // group, 1), qk_dim, precision=work.precision
        )
        flops = 2.0 * problems * seq * max(seq // 2, 1) * (qk_dim + v_dim)
        rate = flops / fwd_s
        return rate * self._attn_bwd if work.kernel == "attention_bwd" else rate

    def op_time(self, work: Work) -> OpTime:
        if self._attn is not None and work.attention is not None:
            # Inside a measured fused kernel: its matmuls at the kernel's rate, its softmax,
            # masking and launch already in the measured time.
            seconds = work.tensor_flops / self.attention_rate(work) if work.matmul else 0.0
            seconds *= self._factor
            return OpTime(seconds, 0, (seconds, 0.0, 0.0, 0.0, 0.0))
        tensor_s = 0.0
        if work.matmul is not None:
            m, k, n = work.matmul
            tensor_s = self.matmul_s(
                m, k, n, work.precision, count=work.count, kernel=work.kernel, splits=work.splits
            )
        f = self._factor  # 1 but where a stack's fit sets it: x * 1.0 is x, bit for bit
        times = (
            tensor_s * f,
            work.vector_ops / self._vector_Bps * f,
            work.scalar_ops / self._scalar_Bps * f,
            work.gpsimd_ops / self._gpsimd_Bps * f,
            work.hbm_bytes / self._hbm_Bps * f,
        )
        bound = max(range(len(times)), key=times.__getitem__)
        return OpTime(times[bound] + self._overhead_s, bound, times)
