"""Measured decode (generation-phase) attention kernel times on GPUs.

One layer's decode attention on one GPU: a batch of sequences, one new token each,
attending over their cached tokens, as NVIDIA measured it per engine, KV-cache dtype,
head dimension and the heads one GPU holds: ``catalog/kernels/decode-<chip>.npz``,
built by :mod:`clustersim.hardware.decode_kernels_build` (its doc says which kernels).
The time holds the kernel's read of the KV cache, its launch and its tail. A layout
the tables do not hold returns None, and the caller reads the KV cache at the chip's
HBM rate instead.

The lookup is log-log in the cached tokens per sequence, then in the batch, between
measured points. Below the first point the first stands (a launch floor); past the
last, time grows in proportion (a kernel bound by its KV reads): with the context
beyond the longest measured at that batch, with the batch beyond the largest measured.
"""

from __future__ import annotations

import io
from functools import cache, lru_cache
from importlib import resources

import numpy as np
from numpy.typing import NDArray

__all__ = ["DecodeTable", "Layout", "decode_table"]

KV_DTYPES: dict[str, str] = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int8": "fp8"}
"""``serving.kv_dtype``: the table's (FP16 caches read as BF16's, 8-bit ones as FP8's)."""

Lane = tuple[str, str, int]
"""Engine, table KV dtype, head dimension."""
Layout = tuple[str, str, int, int, int]
"""Engine, ``serving.kv_dtype``, head dimension, query heads and KV heads on one GPU."""


class DecodeTable:
    """One chip's measured decode attention, every engine, KV dtype and head size."""

    def __init__(self, chip: str, arrays: dict[str, NDArray[np.generic]]) -> None:
        self.chip = chip
        self._keys: dict[Lane, dict[tuple[int, int], int]] = {}
        self._batch: dict[Lane, NDArray[np.float64]] = {}
        self._step: dict[Lane, NDArray[np.float64]] = {}
        self._latency: dict[Lane, NDArray[np.float64]] = {}
        self._sources: dict[Lane, str] = {}
        for name, keys in arrays.items():
            if not name.endswith(".keys"):
                continue
            engine, dtype, dim = name.removesuffix(".keys").split(".")
            lane = (engine, dtype, int(dim.removeprefix("d")))
            base = name.removesuffix(".keys")
            self._keys[lane] = {(int(h), int(k)): i for i, (h, k) in enumerate(keys)}
            self._batch[lane] = np.asarray(arrays[f"{base}.batch"], np.float64)
            self._step[lane] = np.asarray(arrays[f"{base}.step"], np.float64)
            self._latency[lane] = np.asarray(arrays[f"{base}.latency_s"], np.float64)
            self._sources[lane] = str(arrays[f"{base}.source"])
        self.time_s = lru_cache(maxsize=262144)(self._time_uncached)

    def lane(self, layout: Layout) -> Lane | None:
        """The lane measuring ``layout``, or None."""
        engine, kv_dtype, head_dim, heads, kv_heads = layout
        lane = (engine, KV_DTYPES.get(kv_dtype, ""), head_dim)
        return lane if (heads, kv_heads) in self._keys.get(lane, {}) else None

    def source(self, lane: Lane) -> str:
        return self._sources[lane]

    def _time_uncached(self, layout: Layout, batch: int, context: float) -> float | None:
        """Seconds of one layer's decode attention for ``batch`` sequences of ``context``
        cached tokens each (a mean), or None where the layout was not measured."""
        lane = self.lane(layout)
        if lane is None or batch <= 0:
            return None if lane is None else 0.0
        grid = self._latency[lane][self._keys[lane][layout[3:]]]
        batches = self._batch[lane]
        context = max(float(context), 1.0)

        def at(i: int) -> float:
            row = grid[i]
            ok = np.isfinite(row)
            steps, times = self._step[lane][ok], row[ok]
            if steps.size == 0:
                return float("nan")
            if context >= steps[-1]:
                return float(times[-1] * context / steps[-1])
            if context <= steps[0]:
                return float(times[0])
            return float(np.exp(np.interp(np.log(context), np.log(steps), np.log(times))))

        measured = [i for i in range(batches.size) if np.isfinite(grid[i]).any()]
        if not measured:
            return None
        if batch <= batches[measured[0]]:
            return at(measured[0])
        last = measured[-1]
        if batch >= batches[last]:
            return at(last) * batch / float(batches[last])
        j = max(i for i in measured if batches[i] <= batch)
        k = min(i for i in measured if batches[i] > batch)
        lo, hi = at(j), at(k)
        f = (np.log(batch) - np.log(batches[j])) / (np.log(batches[k]) - np.log(batches[j]))
        return float(np.exp((1.0 - f) * np.log(lo) + f * np.log(hi)))


@cache
def decode_table(chip: str) -> DecodeTable | None:
    """The chip's measured decode attention, or None where none was measured."""
    name = f"decode-{chip.lower()}.npz"
    ref = resources.files("clustersim.catalog").joinpath("kernels", name)
    if not ref.is_file():
        return None
    with np.load(io.BytesIO(ref.read_bytes()), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return DecodeTable(chip.lower(), arrays)
