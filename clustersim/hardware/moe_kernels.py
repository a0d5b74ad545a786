"""Measured fused-MoE kernel times on GPUs, looked up by model shape and expert layout.

One MoE layer's expert computation on one GPU (permute, the gate-up and down grouped
GEMMs, the activation, the un-permute), as NVIDIA measured it per engine, precision,
tokens entering the layer, hidden size, expert intermediate size, top-k, experts and
the layout ``moe_tp`` x ``moe_ep``: ``catalog/kernels/moe-<chip>.npz``, built by
:mod:`clustersim.hardware.moe_kernels_build` (its doc says which kernels and which
routing skew). A shape the tables do not hold returns None and the caller prices the
experts from the GEMM tables and HBM instead.

Between measured token counts the lookup is linear in log tokens on log latency; below
the first, the first stands (a launch floor); past the last, time grows in proportion
to the tokens (the grouped GEMMs' FLOPs at the edge's rate).
"""

from __future__ import annotations

import io
from functools import cache, lru_cache
from importlib import resources

import numpy as np
from numpy.typing import NDArray

__all__ = ["MoeKey", "MoeTable", "moe_table"]

MoeKey = tuple[int, int, int, int, int, int]
"""hidden, expert intermediate size, top-k, experts, moe_tp, moe_ep."""

PRECISIONS: dict[str, str] = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8"}
"""clustersim precision: the table's (FP16 runs BF16's kernels; FP8 is the fastest of
the per-tensor and block-scaled kernels, :mod:`~clustersim.hardware.moe_kernels_build`)."""


class MoeTable:
    """One chip's measured MoE layers, every engine and precision in its file."""

    def __init__(self, chip: str, arrays: dict[str, NDArray[np.generic]]) -> None:
        self.chip = chip
        self._rows: dict[tuple[str, str], dict[MoeKey, int]] = {}
        self._tokens: dict[tuple[str, str], NDArray[np.float64]] = {}
        self._log_t: dict[tuple[str, str], NDArray[np.float64]] = {}
        self._sources: dict[tuple[str, str], str] = {}
        for name, keys in arrays.items():
            if not name.endswith(".keys"):
                continue
            engine, precision, _ = name.split(".")
            lane = (engine, precision)
            self._rows[lane] = {tuple(int(v) for v in k): i for i, k in enumerate(keys)}  # type: ignore[misc]
            self._tokens[lane] = np.asarray(arrays[f"{engine}.{precision}.tokens"], np.float64)
            self._log_t[lane] = np.log(
                np.asarray(arrays[f"{engine}.{precision}.latency_s"], np.float64)
            )
            self._sources[lane] = str(arrays[f"{engine}.{precision}.source"])
        self.time_s = lru_cache(maxsize=65536)(self._time_uncached)

    def source(self, engine: str, precision: str) -> str:
        return self._sources[(engine, precision)]

    def lane(self, engine: str, precision: str, key: MoeKey) -> tuple[str, str] | None:
        """The (engine, table precision) measuring ``key``, or None."""
        lane = (engine, PRECISIONS.get(precision, ""))
        return lane if key in self._rows.get(lane, {}) else None

    def _time_uncached(self, engine: str, precision: str, key: MoeKey, tokens: int) -> float | None:
        """Seconds for ``tokens`` tokens through one MoE layer's experts, or None."""
        lane = self.lane(engine, precision, key)
        if lane is None or tokens <= 0:
            return None if lane is None else 0.0
        row = self._log_t[lane][self._rows[lane][key]]
        ok = np.isfinite(row)
        axis, log_t = self._tokens[lane][ok], row[ok]
        if axis.size == 0:
            return None
        if tokens >= axis[-1]:
            return float(np.exp(log_t[-1]) * tokens / axis[-1])
        if tokens <= axis[0]:
            return float(np.exp(log_t[0]))
        return float(np.exp(np.interp(np.log(tokens), np.log(axis), log_t)))


@cache
def moe_table(chip: str) -> MoeTable | None:
    """The chip's measured MoE table, or None when it has none."""
    path = resources.files("clustersim.catalog").joinpath("kernels", f"moe-{chip}.npz")
    if not path.is_file():
        return None
    with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as npz:
        return MoeTable(chip, {name: npz[name] for name in npz.files})
