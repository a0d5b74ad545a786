"""Decode attention on a NeuronCore, instruction by instruction from the engine facts.

At decode each sequence contributes one query row per head, so a decode step's
attention is many tiny problems: for each sequence and each KV head on the rank, the
``g`` query heads that share it (GQA) against that sequence's ``L`` cached keys. Its
FLOPs are negligible, and its KV reads are what the iteration model already streams
from HBM; what it costs on a NeuronCore is instructions whose length follows ``L``,
not the FLOPs: the ``g`` query rows sit on ``g`` of the 128 SBUF partitions with the
keys along the free dimension, so every engine pass over the scores takes about ``L``
cycles however few rows there are. From the catalog's engine facts (``engines``:
clocks, the matmul tile, ``instr_min_cycles``, ``matmul_startup_cycles``; the NKI
architecture and ISA guides), one (sequence, KV head) problem is:

- **Tensor:** ``Q K^T``, ``ceil(L / 512)`` matmul instructions streaming up to 512 keys
  each (``startup + max(min(64, g), 512)`` cycles), then the transposes of the
  probabilities and ``P V``, ``ceil(L / 128)`` instructions each contracting 128 keys
  (``startup + max(min(64, g), 128)`` cycles each, twice);
- **Vector:** the scores copied out of PSUM (``max(64, L)`` cycles, the ISA guide's
  PSUM-to-SBUF rule) and their row maximum (``L`` cycles);
- **Scalar:** ``exp(s - max)`` with the row sum accumulated in the same activation
  (``L`` cycles).

The problems of a step are independent, so the engines pipeline them: the first takes
the sum of its engines' times and each further one the busiest engine's (a ``lnc``-core
rank deals them to its cores). GPUs are not priced this way: their decode attention is
a memory-bound kernel whose time is the KV read (:mod:`clustersim.serve.iteration`).
"""

from __future__ import annotations

import math

from clustersim.catalog.schema import ChipSpec

__all__ = ["DecodeAttention"]

QK_KEYS = 512
"""Keys one ``Q K^T`` instruction streams: the moving free size of a matmul (one PSUM bank)."""
CACHED = 65536
"""Shapes kept (a continuously batching engine's average context takes many values)."""
CONTRACTION = 128
"""Keys one ``P V`` (or transpose) instruction contracts: the partition dimension."""


class DecodeAttention:
    """``self(seqs, keys)``: seconds of a decode step's attention in one layer on one
    rank, for ``seqs`` sequences attending over ``keys`` cached keys each (module doc)."""

    def __init__(self, chip: ChipSpec, lnc: int, kv_heads: int, group: int) -> None:
        eng = chip.engines
        assert eng is not None
        self.kv_heads, self.group, self.lnc = kv_heads, group, lnc
        self.clock = eng.clock_ghz
        self.min_cycles = eng.instr_min_cycles
        self.startup = eng.matmul_startup_cycles
        self.stationary = min(64, group)
        self._cache: dict[tuple[int, int], float] = {}

    def engines_s(self, keys: int) -> tuple[float, float, float]:
        """Tensor, Vector and Scalar seconds of one (sequence, KV head) problem."""
        qk = math.ceil(keys / QK_KEYS) * (self.startup + max(self.stationary, QK_KEYS))
        pv = 2 * math.ceil(keys / CONTRACTION) * (self.startup + max(self.stationary, CONTRACTION))
        tensor = (qk + pv) / (self.clock.tensor * 1e9)
        vector = (max(self.min_cycles, keys) + keys) / (self.clock.vector * 1e9)
        scalar = max(self.min_cycles, keys) / (self.clock.scalar * 1e9)
        return tensor, vector, scalar

    def __call__(self, seqs: int, keys: int) -> float:
        if seqs <= 0 or keys <= 0:
            return 0.0
        found = self._cache.get((seqs, keys))
        if found is None:  # a padded batch repeats its few (batch, bucket) shapes
            if len(self._cache) >= CACHED:
                self._cache.clear()
            per_core = math.ceil(seqs * self.kv_heads / self.lnc)
            engines = self.engines_s(keys)
            found = self._cache[(seqs, keys)] = sum(engines) + (per_core - 1) * max(engines)
        return found
