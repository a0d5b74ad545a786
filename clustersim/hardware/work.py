"""What an op asks of a core: work per engine and HBM traffic.

This is the hardware's input language. The workload lowers a model into ops
that carry a ``Work``; the chip model turns a ``Work`` into a duration.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENGINES", "Work"]

ENGINES: tuple[str, ...] = ("tensor", "vector", "scalar", "gpsimd")


@dataclass(frozen=True, slots=True)
class Work:
    """Work of one op on one rank.

    - ``matmul``: (m, k, n) of the matmuls this op runs, each ``count`` times; the
      tensor engine does 2*m*k*n FLOPs per matmul at ``precision``. Empty if no matmul.
    - ``vector_ops``, ``scalar_ops``, ``gpsimd_ops``: element operations on each engine.
    - ``hbm_bytes``: bytes read plus written in HBM.
    - ``kernel``: what kind of kernel runs the matmuls, where its efficiency differs from
      a plain GEMM's: ``attention`` for a fused flash-attention core (its softmax and
      masking interleave with the matmuls; ``attention_bwd`` for its backward), ``""``
      otherwise.
    - ``attention``: for an attention kernel's ops, the kernel's shape (sequence of keys,
      problems (sequences x heads), query/key head width, value head width, query heads
      per key/value head), for a chip that takes its time from a measured table.
    - ``splits``: the matmul runs as ``splits`` GEMMs one after another, each of
      ``m / splits`` rows (a GEMM chunked to overlap a collective chunk by chunk); a
      measured GEMM table prices each chunk, the roofline the whole.
    """

    matmul: tuple[int, int, int] | None = None
    count: int = 1
    precision: str = "bf16"
    vector_ops: float = 0.0
    scalar_ops: float = 0.0
    gpsimd_ops: float = 0.0
    hbm_bytes: float = 0.0
    kernel: str = ""
    attention: tuple[int, int, int, int, int] | None = None
    splits: int = 1

    @property
    def tensor_flops(self) -> float:
        if self.matmul is None:
            return 0.0
        m, k, n = self.matmul
        return 2.0 * m * k * n * self.count
