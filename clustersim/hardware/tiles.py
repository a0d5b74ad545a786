"""Tile streams: what an op becomes in the engine model (``chip_model: engines``).

An op is lowered (:mod:`clustersim.hardware.engines`) into a *tile stream*: every
tile passes through the same chain of stages, each on one engine of the core
(load from HBM on the DMA queues, matmul on Tensor into PSUM, PSUM to SBUF and the
epilogue on Vector, activations on Scalar, custom operators on GPSIMD). The
stages of one tile run in order; different tiles overlap on different engines,
as the compiler software-pipelines them. Tiles are identical, so a lone op's
duration has a closed form (:func:`isolated_s`): the issue overhead, the first
tile through every stage, then one bottleneck-stage time per further tile, then
the store of the last tile.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DMA", "ENGINE_NAMES", "GPSIMD", "SCALAR", "TENSOR", "VECTOR", "Stage", "TiledOp"]

ENGINE_NAMES: tuple[str, ...] = ("tensor", "vector", "scalar", "gpsimd", "dma")
"""The engines of a core in the engine model: the four compute engines and its DMA queues."""
TENSOR, VECTOR, SCALAR, GPSIMD, DMA = range(5)


@dataclass(frozen=True, slots=True)
class Stage:
    """One engine's part of every tile of an op: ``tile_s`` seconds per tile."""

    engine: int
    tile_s: float


@dataclass(frozen=True, slots=True)
class TiledOp:
    """An op as a stream of ``tiles`` identical tiles through ``stages``.

    - ``issue_s``: the op's issue overhead (dispatch, semaphores), before its first
      compute tile; the DMA set-up of its first transfer is part of its first load.
    - ``tail_s``: the store of the last tile, after the last stage.
    - ``fused``: its tiles stream from the previous op's tiles (one fused kernel,
      like flash attention's QK^T, softmax and PV); otherwise it waits for the
      previous op to finish, except for its loads, which may be prefetched.
    - ``load_bytes``: SBUF bytes one tile's operands take on a core, to decide
      whether the next op's loads fit beside this op's (double-buffered) tiles.
    - ``hbm_bytes``: the op's HBM traffic on the rank (for HBM utilisation).
    - ``bound``: the engine whose stage is slowest per tile (an index into
      ``ENGINE_NAMES``).
    """

    stages: tuple[Stage, ...]
    tiles: int
    issue_s: float
    tail_s: float
    fused: bool
    load_bytes: float
    hbm_bytes: float

    @property
    def bound(self) -> int:
        per_engine = self.engine_tile_s()
        return max(range(len(per_engine)), key=per_engine.__getitem__)

    def engine_tile_s(self) -> list[float]:
        """Seconds per tile on each engine (stages on one engine add up)."""
        out = [0.0] * len(ENGINE_NAMES)
        for st in self.stages:
            out[st.engine] += st.tile_s
        return out

    def busy_s(self) -> list[float]:
        """Seconds each engine is busy over the whole op."""
        return [t * self.tiles for t in self.engine_tile_s()]

    def isolated_s(self) -> float:
        """Duration of the op alone on its core (closed form of the pipelined stream).

        ``issue + sum(stage tile times) + (tiles - 1) x (slowest engine's tile time)
        + tail``: the first tile goes through every stage, each further tile adds
        one bottleneck time, and the last tile is stored. Exact when each stage has
        an engine to itself; with two stages on one engine it is the engine's summed
        time per tile that bounds the stream.
        """
        if not self.stages:
            return self.issue_s + self.tail_s
        fill = sum(st.tile_s for st in self.stages)
        return self.issue_s + fill + (self.tiles - 1) * max(self.engine_tile_s()) + self.tail_s
