"""Bottom-up LayerNorm kernel on one NeuronCore, instruction by instruction.

The NKI LayerNorm tutorial (``aws-neuron-sdk:general/nki/tutorials/layernorm.rst``)
normalises a ``(rows, cols)`` FP32 input 128 rows (one per SBUF partition) at a
time. Its first version computes the statistics with ``nl.mean`` (mean, then the
mean of the squares), its second with ``bn_stats``/``bn_aggr`` and a fused
``tensor_scalar`` shift-and-scale. Each instruction is costed from the NKI ISA
notes, as the catalog's ``engines`` entry and the references give them:

- an instruction over ``N`` elements per partition costs about ``N`` cycles per
  input it reads (``2N`` with two), and at least ``instr_min_cycles``;
- an instruction on a ``[128, 1]`` statistic is tiny: the minimum, plus about
  :data:`DEPENDENT_TINY_CYCLES` because each waits for the one before it;
- each row tile is loaded and stored by one DMA transfer (``dma_setup_s`` plus its
  bytes at ``dma_queue_Bps``), as :func:`~clustersim.hardware.kernel_tiling.dma_queue_s`.

The row tiles become the tiles of a :class:`~clustersim.hardware.tiles.TiledOp`, so
Vector, Scalar and the DMA queues overlap across tiles.
"""

from __future__ import annotations

import math

from clustersim.catalog.schema import ChipSpec
from clustersim.hardware.kernel_tiling import ELEMENT_BYTES, Transfers, dma_queue_s
from clustersim.hardware.tiles import DMA, SCALAR, VECTOR, Stage, TiledOp

__all__ = ["DEPENDENT_TINY_CYCLES", "layernorm_kernel"]

DEPENDENT_TINY_CYCLES = 100
"""Cycles a tiny instruction adds when it depends on the one before it
(``aws-neuron-sdk:general/nki/api/nki/isa/__init__.py`` @2ae3525e, in the
references' NeuronCore facts: back-to-back dependent tiny instructions add about
100 cycles each)."""

# Per row tile: (engine, inputs of N elements per partition); inputs 0 is a tiny
# instruction on a [128, 1] statistic.
_V1 = (
    (VECTOR, 1),  # mean = nl.mean(x)
    (SCALAR, 1),  # nl.square(x)
    (VECTOR, 1),  # nl.mean(x^2)
    (VECTOR, 0),  # mean * mean
    (VECTOR, 0),  # var = mean(x^2) - mean^2
    (VECTOR, 0),  # var + epsilon
    (SCALAR, 0),  # nl.rsqrt
    (VECTOR, 1),  # x - mean
    (VECTOR, 1),  # * rstd
    (VECTOR, 2),  # * gamma (broadcast tile)
    (VECTOR, 2),  # + beta
)
_V2 = (
    (VECTOR, 1),  # nisa.bn_stats over the row
    (VECTOR, 0),  # nisa.bn_aggr -> mean, var
    (VECTOR, 0),  # var + epsilon
    (SCALAR, 0),  # nl.rsqrt
    (VECTOR, 1),  # nisa.tensor_scalar: (x - mean) * rstd
    (VECTOR, 2),  # * gamma
    (VECTOR, 2),  # + beta
)


def layernorm_kernel(spec: ChipSpec, rows: int, cols: int, bn_stats: bool) -> TiledOp:
    """The tutorial's LayerNorm of an FP32 ``(rows, cols)`` input on one core.

    ``bn_stats`` picks the second version. The op's ``isolated_s()`` is its time.
    """
    eng = spec.engines
    if eng is None:
        raise ValueError(f"chip {spec.name} has no engine description")
    tiles = math.ceil(rows / eng.lanes)
    clock = {VECTOR: eng.clock_ghz.vector, SCALAR: eng.clock_ghz.scalar}
    per_engine = {VECTOR: 0.0, SCALAR: 0.0}
    for engine, inputs in _V2 if bn_stats else _V1:
        if inputs:
            cycles = max(float(eng.instr_min_cycles), inputs * float(cols))
        else:
            cycles = float(eng.instr_min_cycles + DEPENDENT_TINY_CYCLES)
        per_engine[engine] += cycles / (clock[engine] * 1e9)
    tile_bytes = rows / tiles * cols * ELEMENT_BYTES["fp32"]
    io = Transfers(tiles, tile_bytes)
    params = Transfers(2, cols * ELEMENT_BYTES["fp32"])  # gamma and beta, once
    dma_s = dma_queue_s(spec, (io, io, params))
    stages = (
        Stage(DMA, dma_s / tiles),
        Stage(VECTOR, per_engine[VECTOR]),
        Stage(SCALAR, per_engine[SCALAR]),
    )
    tail_s = eng.dma_setup_s + tile_bytes / eng.dma_queue_Bps  # the last store
    return TiledOp(stages, tiles, 0.0, tail_s, False, tile_bytes, 2 * io.bytes + params.bytes)
