"""Bottom-up matmul kernels on one NeuronCore: a tiling, its traffic and its tile stream.

The engine model's default lowering (:mod:`clustersim.hardware.engines`) runs a
matmul at the roofline's calibrated ``tensor_efficiency`` so that the two chip
models agree. This module derives a kernel's time from the core's mechanisms
alone, for a tiling a kernel writer chooses, as the NKI matmul tutorial does
(``aws-neuron-sdk:general/nki/tutorials/matrix_multiplication.rst``):

- **Tensor.** ``C[m, n] = A[m, k] B[k, n]`` is cut into instructions of a
  ``stationary`` x ``contraction`` block of A (128 x 128) against ``contraction``
  x ``moving`` of B (128 x 512, one PSUM bank). One instruction costs the
  catalog's ``matmul_startup_cycles`` plus ``max(min(64, N_stationary),
  N_moving)`` streaming cycles, times the precision's slowdown against BF16
  (x4 for FP32: the catalog's per-core tensor peaks), at the Tensor clock.
- **DMA.** Every load and store is one transfer on one of the core's
  ``dma_queues``: ``dma_setup_s`` plus its bytes at ``dma_queue_Bps``; the queues
  work in parallel, and the core's share of HBM caps them. This is why the NKI DMA
  guide asks for 2-4 KiB per partition (128 x 4 KiB moves in 31 us on one queue
  at 17 B/ns, beside 1.3 us of set-up).
- **Vector.** Each PSUM accumulation group leaves PSUM through Vector: a copy of
  ``N`` elements per partition costs ``max(64, N)`` cycles; an accumulation into
  an SBUF tile reads two inputs and costs ``2N`` (the NKI ISA notes).
- **Reuse.** What the tiling keeps in SBUF decides how often each operand is read
  from HBM (:class:`MatmulTiling`); blocking a dimension divides the other
  operand's reloads by the block size.

The kernel becomes one :class:`~clustersim.hardware.tiles.TiledOp` whose tiles are
its PSUM accumulation groups, each carrying its share of the DMA traffic, so the
engine model's pipeline (and its simulation, ``run_segment``) gives its time and
each engine's busy time. :func:`roofline_efficiency` turns the best tutorial
tiling's time into the fraction of the tensor peak the roofline model would need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from clustersim.catalog.schema import ChipSpec
from clustersim.hardware.tiles import DMA, TENSOR, VECTOR, Stage, TiledOp

__all__ = [
    "ELEMENT_BYTES",
    "NKI_MATMUL_MEASURED_MS",
    "NKI_MATMUL_TUTORIAL",
    "MatmulKernel",
    "MatmulTiling",
    "Transfers",
    "dma_queue_s",
    "matmul_kernel",
    "roofline_efficiency",
    "tensor_instructions_s",
    "tiled_matmul_s",
]

ELEMENT_BYTES: dict[str, int] = {"fp8": 1, "bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}
"""Bytes of one element of each precision in HBM and SBUF."""

Reuse = Literal["none", "stationary", "moving"]


@dataclass(frozen=True, slots=True)
class MatmulTiling:
    """How a kernel tiles a matmul, in units of instruction tiles.

    - ``reuse``: which operand stays in SBUF across the inner loop. ``none``: every
      instruction loads its own A and B tiles. ``stationary``: the outer loop runs
      over blocks of ``block_m`` A tiles, each loaded once with all of K; B is read
      again for every A block. ``moving``: the outer loop runs over blocks of
      ``block_n`` B tiles; a block of B (one contraction block) is loaded once and
      used by every A block, so A is read again for every B block.
    - ``block_m``, ``block_n``: A and B tiles per block (the free dimensions).
    - ``block_k``: contraction tiles per PSUM accumulation group; 0 accumulates all
      of K in PSUM. With K blocked, each group is added into an SBUF accumulator.
    - ``coalesce``: one transfer moves a block's width (128 partitions x
      ``block`` tiles) rather than one tile, and stores leave a block row at once.
    """

    reuse: Reuse
    block_m: int = 1
    block_n: int = 1
    block_k: int = 0
    coalesce: bool = False


NKI_MATMUL_TUTORIAL: dict[str, MatmulTiling] = {
    "tiled": MatmulTiling("none"),
    "hoist_load": MatmulTiling("stationary"),
    "block_free_dimension": MatmulTiling("stationary", block_m=2, block_n=2),
    "fully_optimized": MatmulTiling("moving", block_m=16, block_n=2, block_k=8, coalesce=True),
}
"""The four kernels of the NKI matmul tutorial (``nki_matmul_tiled_``,
``nki_matmul_hoist_load_``, ``nki_matmul_block_free_dimension_`` and
``nki_matmul_fully_optimized_`` with its default blocks 16 x 2 x 8), as tilings."""

NKI_MATMUL_MEASURED_MS: dict[str, float] = {
    "tiled": 51.80,
    "hoist_load": 42.96,
    "block_free_dimension": 22.07,
    "fully_optimized": 6.97,
}
"""The tutorial's times of those kernels, BF16 [4096, 8192] x [8192, 8192] on one Trn1
NeuronCore (``aws-neuron-sdk:general/nki/tutorials/matrix_multiplication.rst``)."""


@dataclass(frozen=True, slots=True)
class Transfers:
    """``count`` DMA transfers of ``bytes_each`` bytes (128 partitions' worth)."""

    count: int
    bytes_each: float

    @property
    def bytes(self) -> float:
        return self.count * self.bytes_each


@dataclass(frozen=True, slots=True)
class MatmulKernel:
    """A tiled matmul on one core: its counts and its tile stream.

    ``loads`` are A's and B's transfers, ``store`` C's; ``instructions`` and
    ``groups`` count Tensor instructions and PSUM accumulation groups (the tiles of
    ``op``); ``*_s`` are each engine's busy seconds over the kernel.
    """

    tiling: MatmulTiling
    instructions: int
    groups: int
    loads: tuple[Transfers, Transfers]
    store: Transfers
    tensor_s: float
    vector_s: float
    dma_s: float
    sbuf_bytes: float
    op: TiledOp

    @property
    def hbm_bytes(self) -> float:
        return self.loads[0].bytes + self.loads[1].bytes + self.store.bytes


def dma_queue_s(spec: ChipSpec, transfers: tuple[Transfers, ...]) -> float:
    """Seconds the core's DMA queues take for ``transfers``.

    Each transfer holds one queue for its set-up and its bytes at the queue's
    rate; the queues share the work evenly, and the core's HBM share caps them.
    """
    eng = spec.engines
    if eng is None:
        raise ValueError(f"chip {spec.name} has no engine description")
    queue_s = sum(t.count * (eng.dma_setup_s + t.bytes_each / eng.dma_queue_Bps) for t in transfers)
    hbm_core_Bps = spec.hbm_bw_Bps * spec.calibration.hbm_efficiency / spec.cores
    return max(queue_s / eng.dma_queues, sum(t.bytes for t in transfers) / hbm_core_Bps)


def _blocks(tiles: int, block: int) -> tuple[int, int]:
    """(tiles per block, blocks): ``block`` clipped to the dimension, 0 meaning all."""
    size = tiles if block <= 0 else min(block, tiles)
    return size, math.ceil(tiles / size)


def matmul_kernel(
    spec: ChipSpec, shape: tuple[int, int, int], tiling: MatmulTiling, precision: str = "bf16"
) -> MatmulKernel:
    """Lower ``C[m, n] = A[m, k] B[k, n]``, ``shape = (m, k, n)``, with ``tiling``
    onto one core of ``spec``.

    Inputs and output are in ``precision`` (the tutorial's result takes its
    inputs' dtype). Raises ``ValueError`` when the blocks the tiling holds at once
    (A's and B's, and with K blocked C's column block of accumulators) do not fit
    a core's SBUF.
    """
    eng = spec.engines
    if eng is None:
        raise ValueError(f"chip {spec.name} has no engine description")
    m, k, n = shape
    e = ELEMENT_BYTES[precision]
    t_m, t_k, t_n = eng.matmul_tile  # stationary, contraction, moving
    mt, kt, nt = math.ceil(m / t_m), math.ceil(k / t_k), math.ceil(n / t_n)
    bm, mb = _blocks(mt, tiling.block_m)
    bn, nb = _blocks(nt, tiling.block_n)
    bk, kb = _blocks(kt, tiling.block_k)
    n_st, n_mov, n_k = m / mt, n / nt, k / kt  # mean sizes of a tile's dimensions
    a_tile, b_tile = n_k * n_st * e, n_k * n_mov * e  # one instruction's A and B, bytes
    if tiling.reuse == "none":
        a = Transfers(mt * kt * nt, a_tile)
        b = Transfers(mt * kt * nt, b_tile)
        sbuf = a_tile + b_tile
    elif tiling.reuse == "stationary":  # A block once; B again for every A block
        a = Transfers(mb * kt, bm * a_tile) if tiling.coalesce else Transfers(mt * kt, a_tile)
        b = (
            Transfers(mb * nb * kt, bn * b_tile)
            if tiling.coalesce
            else Transfers(mb * nt * kt, b_tile)
        )
        sbuf = kt * (bm * a_tile + bn * b_tile)
    else:  # "moving": a B block once per contraction block; A again for every B block
        b = Transfers(nb * kt, bn * b_tile) if tiling.coalesce else Transfers(nt * kt, b_tile)
        a = (
            Transfers(nb * mb * kt, bm * a_tile)
            if tiling.coalesce
            else Transfers(nb * mt * kt, a_tile)
        )
        accumulators = m * bn * n_mov * e if kb > 1 else 0.0  # C's column block in SBUF
        sbuf = bk * (bm * a_tile + bn * b_tile) + accumulators
    if sbuf > spec.core.sbuf_bytes:
        raise ValueError(f"{tiling} needs {sbuf:.3g} B of SBUF, more than a core's")
    out_tile = n_st * n_mov * e
    store = Transfers(mt * nb, bn * out_tile) if tiling.coalesce else Transfers(mt * nt, out_tile)
    instructions = mt * nt * kt
    groups = mt * nt * kb
    tensor_s = tensor_instructions_s(spec, m, k, n, precision)
    # PSUM -> SBUF: a copy per group (one input), or with K blocked an accumulation
    # into SBUF per group (two inputs) and a copy of each finished tile to pack it.
    copy_cycles = max(eng.instr_min_cycles, n_mov)
    accumulate = groups * 2.0 * n_mov + mt * nt * copy_cycles
    vector_cycles = accumulate if kb > 1 else groups * copy_cycles
    vector_s = vector_cycles / (eng.clock_ghz.vector * 1e9)
    dma_s = dma_queue_s(spec, (a, b, store))
    tail_s = eng.dma_setup_s + store.bytes_each / eng.dma_queue_Bps
    stages = (
        Stage(DMA, dma_s / groups),
        Stage(TENSOR, tensor_s / groups),
        Stage(VECTOR, vector_s / groups),
    )
    op = TiledOp(
        stages,
        groups,
        0.0,
        tail_s,
        False,
        (a.bytes + b.bytes) / groups,
        a.bytes + b.bytes + store.bytes,
    )
    return MatmulKernel(
        tiling, instructions, groups, (a, b), store, tensor_s, vector_s, dma_s, sbuf, op
    )


def tensor_instructions_s(spec: ChipSpec, m: int, k: int, n: int, precision: str = "bf16") -> float:
    """Seconds the Tensor engine of one core streams ``C[m, k] x [k, n]``'s instructions:
    each ``matmul_startup_cycles`` plus ``max(min(instr_min_cycles, N_stationary),
    N_moving)`` cycles (times the precision's slowdown against BF16), with nothing
    loaded, stored or copied out of PSUM: the least time any kernel of this matmul
    takes on the array."""
    eng = spec.engines
    if eng is None:
        raise ValueError(f"chip {spec.name} has no engine description")
    t_m, t_k, t_n = eng.matmul_tile
    mt, kt, nt = math.ceil(m / t_m), math.ceil(k / t_k), math.ceil(n / t_n)
    slowdown = spec.core.tensor_tflops.bf16 / spec.core.tensor_tflops.get(precision)
    cycles = eng.matmul_startup_cycles + slowdown * max(min(eng.instr_min_cycles, m / mt), n / nt)
    return mt * kt * nt * cycles / (eng.clock_ghz.tensor * 1e9)


def _best_tiling_s(spec: ChipSpec, m: int, k: int, n: int, precision: str) -> float:
    """Seconds of the fastest of the NKI tutorial's tilings of ``(m, k, n)`` that fits
    SBUF (``inf`` when none does)."""
    best = math.inf
    for tiling in NKI_MATMUL_TUTORIAL.values():
        try:
            kernel = matmul_kernel(spec, (m, k, n), tiling, precision)
        except ValueError:
            continue
        best = min(best, kernel.op.isolated_s())
    return best


_TILED: dict[tuple[object, ...], float] = {}
_TILED_MAX = 65536


def _without_dma(spec: ChipSpec) -> ChipSpec:
    """``spec`` with DMA free: no set-up, queues and HBM that move any bytes at once."""
    eng = spec.engines
    assert eng is not None
    free = eng.model_copy(update={"dma_setup_s": 0.0, "dma_queue_Bps": math.inf})
    return spec.model_copy(update={"engines": free, "hbm_bw_Bps": math.inf})


def tiled_matmul_s(
    spec: ChipSpec, m: int, k: int, n: int, precision: str = "bf16", *, dma: bool = True
) -> float:
    """Seconds one core takes for ``C[m, k] x [k, n]`` with the best tutorial kernel.

    The fastest of the NKI tutorial's tilings (:data:`NKI_MATMUL_TUTORIAL`), over the
    whole of ``m`` or over ``m`` cut into 2, 4, 8, ... equal row chunks run one after
    another (each chunk at least a stationary tile): a kernel writer cuts the rows where
    a tiling's blocks of the whole ``m`` outgrow SBUF (its accumulators hold a column
    block of all ``m`` rows) or where the chunks run faster. Everything comes from the
    core's engine facts in the catalog (clocks, tiles, start-up and minimum cycles, DMA
    queues, SBUF) and the HBM share at ``calibration.hbm_efficiency``: the instruction
    start-up of small matmuls and partly filled tiles are in the time. ``dma=False``
    times the kernel's engines alone (its loads and stores free): the compute side of
    the kernel, which the roofline model sets beside an op's own HBM traffic.
    Results are cached by what they depend on.
    """
    eng = spec.engines
    if eng is None:
        raise ValueError(f"chip {spec.name} has no engine description")
    key = (eng, spec.core, spec.hbm_bw_Bps, spec.cores, spec.calibration.hbm_efficiency,
           m, k, n, precision, dma)  # fmt: skip
    hit = _TILED.get(key)
    if hit is not None:
        return hit
    on = spec if dma else _without_dma(spec)
    tile = eng.matmul_tile[0]
    best = _best_tiling_s(on, m, k, n, precision)
    chunks = 2
    while math.ceil(m / chunks) >= tile:
        rows = math.ceil(m / chunks)
        best = min(best, chunks * _best_tiling_s(on, rows, k, n, precision))
        chunks *= 2
    if best == math.inf:
        raise ValueError(f"no tutorial tiling of ({m}, {k}, {n}) fits {spec.name}'s SBUF")
    if len(_TILED) >= _TILED_MAX:
        _TILED.clear()
    _TILED[key] = best
    return best


def roofline_efficiency(spec: ChipSpec, m: int, k: int, n: int, precision: str = "bf16") -> float:
    """The fraction of one core's tensor peak a matmul sustains, bottom up.

    ``2mkn / (time x peak)``, with :func:`tiled_matmul_s`'s time: what the roofline
    model's ``tensor_efficiency`` would be for this shape if kernels were as good as
    the tutorial's best.
    """
    peak = spec.core.tensor_tflops.get(precision) * 1e12
    return 2.0 * m * k * n / (tiled_matmul_s(spec, m, k, n, precision) * peak)
