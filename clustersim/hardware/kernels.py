"""Measured GPU kernel times: GEMM and fused attention forward, looked up in tables.

A GPU op's compute time is taken bottom up from kernels measured on the chip,
not from a fitted fraction of the datasheet peak. The tables are NVIDIA's
``aiconfigurator-core`` measurements (Apache-2.0; TensorRT-LLM's cuBLAS-backed
torch GEMMs and its fused multi-head attention), reduced to one ``.npz`` per chip
in ``clustersim/catalog/kernels/`` by ``clustersim.hardware.kernels_build``;
``SOURCES.md`` there names every table.

GEMM, C[m,n] = A[m,k] B[k,n]: latency measured on a grid of m, n and k.
Between grid points the lookup is trilinear in log m, log n and log k on log
latency (a power law between neighbours: exact at the measured points, smooth
in between). Outside the grid:

* beyond the largest size of an axis, time grows in proportion to that axis,
  i.e. with the FLOPs 2mnk at the efficiency of the grid's edge (a large GEMM
  is a sequence of full waves of output tiles, each as fast as the edge's);
* below the smallest size, the edge's latency stands (a launch and
  pipeline-fill floor: a smaller problem runs in one wave no faster).

Grid cells never measured (only in the largest corner of each grid) take their
nearest measured neighbour in log size, scaled the same way.

The m axis holds pairs such as 4096 and 4097: the second measures the step
when one more row of output tiles is needed. Interpolating between 4097 and
4352 then follows the plateau of equal tile counts. On Hopper the block-scaled
FP8 kernel also pays a large penalty at unaligned m (1025, 4097 and the like),
which interpolation carries into the interval after it: an aligned m there
(1040, say) reads up to about 1.7x slower than its aligned neighbours suggest.

Fused attention forward (causal, the context phase): latency measured over
batch, sequence length, query heads and KV heads. The kernel parallelises over
batch x heads x query tiles, so the table keys on problems = batch x heads and
sequence length, with one layer for multi-head (KV heads = heads) and one for
grouped-query attention (fewer KV heads, which load less K/V and run about 8%
faster). Lookup is piecewise linear in log-log, growing linearly in problems and
with the square of sequence length (causal FLOPs) beyond the measured range.

The measured op is the serving engine's: besides the attention core it applies
RoPE to the queries and keys and writes the KV cache, work linear in the
sequence. Per problem count its latency is ``c0 + c1 s + c2 s^2`` to within a few
percent (non-negative least squares over s >= 512); a training step prices
RoPE as an op of its own and writes no cache, so its fused attention kernel
(:meth:`AttentionTable.training_s`) is ``c0 + c2 s^2``: the launch and the
causal core, which on Hopper runs at 0.52-0.64 of the BF16 peak, the rate
flash-attention kernels reach.

Only numpy, the standard library and the catalog's data files are used.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from functools import cache, lru_cache
from importlib import resources

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "PRECISIONS",
    "AllReduceTable",
    "AttentionTable",
    "GemmTable",
    "allreduce_table",
    "attention_table",
    "gemm_table",
]

F64 = NDArray[np.float64]

PRECISIONS: dict[str, str] = {
    "bf16": "bf16",
    "fp16": "bf16",
    "fp8": "fp8",
    "fp8_block": "fp8_block",
}
"""clustersim's precision names mapped to the tables' (FP16 runs BF16's kernels)."""

ATTENTION_LAYERS = ("mha", "gqa")
"""Attention table layers: KV heads equal to query heads, and fewer."""


def _table_key(precision: str, available: tuple[str, ...], what: str) -> str:
    key = PRECISIONS.get(precision)
    if key is None or key not in available:
        raise ValueError(
            f"no measured {what} for precision {precision!r}; available: {', '.join(available)}"
        )
    return key


@cache
def _arrays(chip: str) -> dict[str, NDArray[np.generic]] | None:
    """Every array of a chip's kernel file, or None when the chip has none."""
    path = resources.files("clustersim.catalog").joinpath("kernels", f"{chip}.npz")
    if not path.is_file():
        return None
    with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


class _Grid:
    """One precision's GEMM grid: log axes and log latency with holes filled."""

    def __init__(self, m: F64, n: F64, k: F64, latency_s: F64) -> None:
        self.axes = (m, n, k)
        self.measured = latency_s
        self.log_axes = tuple(np.log(a) for a in self.axes)
        self.log_t = np.log(_fill_holes(self.axes, latency_s))

    def times(self, m: F64, n: F64, k: F64) -> F64:
        """Vectorised trilinear lookup in log-log, extrapolated as the module says."""
        weights: list[tuple[NDArray[np.intp], F64]] = []
        scale = np.ones(np.broadcast(m, n, k).shape)
        for x, axis, log_axis in zip((m, n, k), self.axes, self.log_axes, strict=True):
            scale = scale * np.maximum(1.0, x / axis[-1])  # FLOP scaling past the edge
            lx = np.clip(np.log(x), log_axis[0], log_axis[-1])  # floor below the edge
            i = np.clip(np.searchsorted(log_axis, lx, side="right") - 1, 0, len(axis) - 2)
            frac = (lx - log_axis[i]) / (log_axis[i + 1] - log_axis[i])
            weights.append((i, frac))
        (im, fm), (in_, fn), (ik, fk) = weights
        out = np.zeros(scale.shape)
        for dm in (0, 1):
            wm = fm if dm else 1.0 - fm
            for dn in (0, 1):
                wn = fn if dn else 1.0 - fn
                for dk in (0, 1):
                    wk = fk if dk else 1.0 - fk
                    out = out + wm * wn * wk * self.log_t[im + dm, in_ + dn, ik + dk]
        return np.asarray(np.exp(out) * scale, dtype=np.float64)


def _fill_holes(axes: tuple[F64, F64, F64], latency_s: F64) -> F64:
    """Each unmeasured cell from its nearest measured cell in log size, scaled up by
    the ratio of sizes along every axis where the hole is larger (FLOPs at the
    neighbour's efficiency), kept at the neighbour's latency where it is smaller."""
    holes = np.argwhere(np.isnan(latency_s))
    if len(holes) == 0:
        return latency_s
    known = np.argwhere(~np.isnan(latency_s))
    logs = [np.log2(a) for a in axes]
    known_xyz = np.stack([logs[d][known[:, d]] for d in range(3)], axis=1)
    filled = latency_s.copy()
    for hole in holes:
        xyz = np.array([logs[d][hole[d]] for d in range(3)])
        nearest = known[int(np.argmin(((known_xyz - xyz) ** 2).sum(axis=1)))]
        ratio = np.prod([max(1.0, axes[d][hole[d]] / axes[d][nearest[d]]) for d in range(3)])
        filled[tuple(hole)] = latency_s[tuple(nearest)] * ratio
    return filled


class GemmTable:
    """A chip's measured GEMM latencies, one grid per precision."""

    def __init__(self, chip: str, arrays: dict[str, NDArray[np.generic]]) -> None:
        self.chip = chip
        self.precisions: tuple[str, ...] = tuple(
            sorted(str(a) for a in arrays["gemm.precisions"].tolist())
        )
        self._arrays = arrays
        self._grids: dict[str, _Grid] = {}
        self._time: Callable[[int, int, int, str], float] = lru_cache(maxsize=1 << 16)(
            self._time_uncached
        )

    def measures(self, precision: str) -> bool:
        """Whether the table has GEMMs at ``precision`` (clustersim's name)."""
        return PRECISIONS.get(precision) in self.precisions

    def source(self, precision: str) -> str:
        """Where the ``precision`` grid was measured: framework, version, kernel, GPU."""
        key = _table_key(precision, self.precisions, f"GEMM on {self.chip}")
        return str(np.asarray(self._arrays[f"gemm.{key}.source"]).ravel()[0])

    def grid(self, precision: str) -> tuple[F64, F64, F64, F64]:
        """The measured grid: m, n and k axes and latency [m, n, k] in s (NaN: not measured)."""
        g = self._grid(precision)
        return (*g.axes, g.measured)

    def _grid(self, precision: str) -> _Grid:
        key = _table_key(precision, self.precisions, f"GEMM on {self.chip}")
        if key not in self._grids:
            m, n, k, t = (
                self._arrays[f"gemm.{key}.{name}"].astype(np.float64)
                for name in ("m", "n", "k", "latency_s")
            )
            self._grids[key] = _Grid(m, n, k, t)
        return self._grids[key]

    def time_s(self, m: int, k: int, n: int, precision: str) -> float:
        """Seconds for one GEMM C[m,n] = A[m,k] B[k,n] (cached per shape and precision)."""
        return self._time(int(m), int(k), int(n), precision)

    def _time_uncached(self, m: int, k: int, n: int, precision: str) -> float:
        if min(m, k, n) < 1:
            raise ValueError(f"GEMM dimensions must be positive: m={m}, k={k}, n={n}")
        g = self._grid(precision)
        return float(g.times(np.array(float(m)), np.array(float(n)), np.array(float(k))))

    def times_s(self, m: ArrayLike, k: ArrayLike, n: ArrayLike, precision: str) -> F64:
        """``time_s`` over arrays of shapes at once (broadcast), uncached."""
        args = [np.asarray(x, dtype=np.float64) for x in (m, n, k)]
        if any(np.any(a < 1) for a in args):
            raise ValueError("GEMM dimensions must be positive")
        return self._grid(precision).times(*args)

    def efficiency(self, m: int, k: int, n: int, precision: str, peak_flops: float) -> float:
        """Achieved fraction of ``peak_flops`` (FLOP/s): 2mnk / (time x peak)."""
        return 2.0 * m * n * k / (self.time_s(m, k, n, precision) * peak_flops)

    def ceiling(self, precision: str, peak_flops: float) -> float:
        """The best efficiency measured anywhere on the grid: the ceiling that a
        fitted efficiency constant for this chip and precision must stay under."""
        m, n, k, t = self.grid(precision)
        flops = 2.0 * m[:, None, None] * n[None, :, None] * k[None, None, :]
        return float(np.nanmax(flops / t) / peak_flops)


class AttentionTable:
    """A chip's measured fused attention forward (causal) latencies.

    Per precision and head dimension: sequence lengths ``seq``, problems
    (batch x heads) ``problems`` and latency [layer, seq, problems] in s, NaN
    where no such shape was measured (long sequences only at small batch).
    """

    def __init__(self, chip: str, arrays: dict[str, NDArray[np.generic]]) -> None:
        self.chip = chip
        self._arrays = arrays
        keys = [k.split(".") for k in arrays if k.startswith("attn.") and k.endswith(".seq")]
        self.head_dims: dict[str, tuple[int, ...]] = {}
        for _, prec, dim, _ in keys:
            self.head_dims[prec] = tuple(sorted((*self.head_dims.get(prec, ()), int(dim[1:]))))
        self.precisions = tuple(sorted(self.head_dims))
        self._forward: Callable[[tuple[int, int, int, int, int], str], float] = lru_cache(
            maxsize=1 << 14
        )(self._forward_uncached)
        self._terms: Callable[[str, int, int], tuple[F64, F64]] = cache(self._terms_uncached)

    def grid(self, precision: str, head_dim: int) -> tuple[F64, F64, F64]:
        """Measured seq and problems axes and latency [layer, seq, problems] in s."""
        key = _table_key(precision, self.precisions, f"attention on {self.chip}")
        if head_dim not in self.head_dims[key]:
            raise ValueError(
                f"attention on {self.chip} measured at head_dim {self.head_dims[key]}, "
                f"not {head_dim}"
            )
        a = self._arrays
        p = f"attn.{key}.d{head_dim}"
        return (
            a[f"{p}.seq"].astype(np.float64),
            a[f"{p}.problems"].astype(np.float64),
            a[f"{p}.latency_s"].astype(np.float64),
        )

    def forward_s(
        self,
        batch: int,
        seq: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        *,
        precision: str = "bf16",
    ) -> float:
        """Seconds for one causal fused attention forward (cached per shape).

        A head dimension not measured is taken from the nearest measured one,
        scaled by the ratio of head dimensions (FLOPs grow with it).
        """
        shape = (int(batch), int(seq), int(heads), int(kv_heads), int(head_dim))
        return self._forward(shape, precision)

    def _table_of(
        self, shape: tuple[int, int, int, int, int], precision: str
    ) -> tuple[str, int, int]:
        """(table key, nearest measured head dimension, layer index) for ``shape``
        (batch, seq, heads, kv_heads, head_dim); refuses a shape no kernel runs."""
        batch, seq, heads, kv_heads, head_dim = shape
        if min(shape) < 1 or heads % kv_heads:
            raise ValueError(
                f"attention shape needs positive sizes and kv_heads dividing heads: "
                f"batch={batch} seq={seq} heads={heads} kv_heads={kv_heads} head_dim={head_dim}"
            )
        key = _table_key(precision, self.precisions, f"attention on {self.chip}")
        dims = np.array(self.head_dims[key], dtype=np.float64)
        near = int(dims[np.argmin(np.abs(np.log(dims / head_dim)))])
        return key, near, ATTENTION_LAYERS.index("mha" if kv_heads == heads else "gqa")

    def _forward_uncached(self, shape: tuple[int, int, int, int, int], precision: str) -> float:
        batch, seq, heads, _, head_dim = shape
        key, near, index = self._table_of(shape, precision)
        seqs, problems, latency = self.grid(key, near)
        layer = latency[index]
        if np.isnan(layer).all():  # a layer never measured at this head dim: use the other
            layer = latency[1 - index]
        t = _seq_interp(seqs, problems, layer, float(seq), float(batch * heads))
        return t * head_dim / near

    def training_s(
        self,
        batch: int,
        seq: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        *,
        precision: str = "bf16",
    ) -> float:
        """Seconds for one causal fused attention forward as a training step runs it:
        the measured op's launch and quadratic terms (``c0 + c2 s^2``), without its
        per-token RoPE and KV-cache work. Between measured problem counts the terms
        are interpolated log-log; past the largest they grow in proportion (more
        waves), below the smallest the smallest's stand."""
        shape = (int(batch), int(seq), int(heads), int(kv_heads), int(head_dim))
        key, near, layer = self._table_of(shape, precision)
        problems, terms = self._terms(key, near, layer)
        if not problems.size:  # a layer never measured at this head dim: use the other
            problems, terms = self._terms(key, near, 1 - layer)
        p = float(batch * heads)
        if p >= problems[-1]:
            c0, c2 = terms[-1, 0], terms[-1, 1] * p / problems[-1]
        elif p <= problems[0]:
            c0, c2 = terms[0]
        else:
            lp = np.log(problems)
            c0 = float(np.exp(np.interp(np.log(p), lp, np.log(terms[:, 0]))))
            c2 = float(np.exp(np.interp(np.log(p), lp, np.log(terms[:, 1]))))
        return float((c0 + c2 * float(seq) ** 2) * head_dim / near)

    def _terms_uncached(self, key: str, head_dim: int, layer: int) -> tuple[F64, F64]:
        """Problem counts with at least four sequence lengths from 512 on, and each one's
        (c0, c2) of ``c0 + c1 s + c2 s^2`` (non-negative least squares, relative)."""
        seqs, problems, latency = self.grid(key, head_dim)
        kept: list[float] = []
        terms: list[tuple[float, float]] = []
        for j, p in enumerate(problems):
            ok = ~np.isnan(latency[layer, :, j]) & (seqs >= TERMS_MIN_SEQ)
            if np.count_nonzero(ok) < 4:
                continue
            s, t = seqs[ok], latency[layer, ok, j]
            c = _nnls_relative(np.stack([np.ones_like(s), s, s * s], axis=1), t)
            if c[0] > 0 and c[2] > 0:
                kept.append(float(p))
                terms.append((float(c[0]), float(c[2])))
        return np.asarray(kept), np.asarray(terms).reshape(-1, 2)


TERMS_MIN_SEQ = 512
"""Shortest sequence the per-problem-count terms are fitted on (below it the launch
floor and the first wave dominate)."""


def _nnls_relative(a: F64, t: F64) -> F64:
    """Non-negative coefficients x minimising ||(a x - t) / t||: the best of the
    least-squares fits on every subset of columns whose solution is non-negative."""
    w = a / t[:, None]
    ones = np.ones_like(t)
    n = a.shape[1]
    best, best_err = np.zeros(n), float(np.sum(ones**2))
    for mask in range(1, 1 << n):
        cols = [i for i in range(n) if mask >> i & 1]
        x, *_ = np.linalg.lstsq(w[:, cols], ones, rcond=None)
        if np.any(x < 0):
            continue
        err = float(np.sum((w[:, cols] @ x - ones) ** 2))
        if err < best_err:
            best, best_err = np.zeros(n), err
            best[cols] = x
    return best


def _problems_interp(problems: F64, row: F64, p: float) -> float:
    """Along one sequence length: log-log between measured problem counts, linear
    in problems past the largest (more waves), the smallest's latency below it."""
    ok = ~np.isnan(row)
    px, ty = problems[ok], row[ok]
    if p >= px[-1]:
        return float(ty[-1] * p / px[-1])
    return float(np.exp(np.interp(np.log(p), np.log(px), np.log(ty))))


def _seq_interp(seqs: F64, problems: F64, layer: F64, s: float, p: float) -> float:
    """Across sequence lengths: log-log between measured rows, growing with s^2
    (causal FLOPs) past the longest, the shortest row's latency below it."""
    rows = [i for i in range(len(seqs)) if not np.isnan(layer[i]).all()]
    sx = seqs[rows]
    if s >= sx[-1]:
        return _problems_interp(problems, layer[rows[-1]], p) * (s / float(sx[-1])) ** 2
    if s <= sx[0]:
        return _problems_interp(problems, layer[rows[0]], p)
    j = int(np.searchsorted(sx, s, side="right")) - 1
    lo = _problems_interp(problems, layer[rows[j]], p)
    hi = _problems_interp(problems, layer[rows[j + 1]], p)
    f = (np.log(s) - np.log(sx[j])) / (np.log(sx[j + 1]) - np.log(sx[j]))
    return float(np.exp((1.0 - f) * np.log(lo) + f * np.log(hi)))


@cache
def gemm_table(chip: str, framework: str | None = None) -> GemmTable | None:
    """The chip's measured GEMM table, or None for chips without one (Trainium).

    ``framework`` ``"vllm"`` takes vLLM's own GEMMs (``<chip>-vllm.npz``) where they
    were measured on the chip, else the default file's (TensorRT-LLM's torch GEMMs,
    what training runs)."""
    name = chip.lower()
    arrays = _arrays(f"{name}-{framework}") if framework else None
    if arrays is None:
        arrays = _arrays(name)
    return None if arrays is None else GemmTable(name, arrays)


@cache
def attention_table(chip: str) -> AttentionTable | None:
    """The chip's measured attention forward table, or None for chips without one."""
    arrays = _arrays(chip.lower())
    return None if arrays is None else AttentionTable(chip.lower(), arrays)


class AllReduceTable:
    """A serving framework's measured all-reduce of BF16 activations inside one NVLink
    node, by GPU count and message size (``allreduce.*`` of a kernel file)."""

    def __init__(self, chip: str, arrays: dict[str, NDArray[np.generic]]) -> None:
        self.chip = chip
        self.gpus = tuple(int(g) for g in arrays["allreduce.gpus"])
        self._elements = np.asarray(arrays["allreduce.elements"], dtype=np.float64)
        self.max_bytes = 2.0 * float(self._elements[-1])
        """The largest message measured, in bytes (2 per BF16 element)."""
        self._latency = np.asarray(arrays["allreduce.latency_s"], dtype=np.float64)
        self.source = str(np.asarray(arrays["allreduce.source"]).ravel()[0])

    def measures(self, gpus: int) -> bool:
        return gpus in self.gpus

    def time_s(self, gpus: int, nbytes: float) -> float:
        """Seconds of one all-reduce of ``nbytes`` of BF16 over ``gpus`` GPUs: log-log
        interpolation between measured sizes, the smallest size's latency below it (a
        launch and a barrier, whatever the message); ``gpus`` must be measured and
        ``nbytes`` at most :attr:`max_bytes`."""
        if not self.measures(gpus) or nbytes > self.max_bytes:
            raise ValueError(
                f"no measured all-reduce of {nbytes:g} bytes over {gpus} GPUs on {self.chip}"
            )
        row = self._latency[self.gpus.index(gpus)]
        return _problems_interp(self._elements, row, max(nbytes / 2.0, 1.0))


@cache
def allreduce_table(chip: str, framework: str | None = None) -> AllReduceTable | None:
    """The all-reduce a serving ``framework`` runs on ``chip`` (``"vllm"``: its custom
    all-reduce; None: TensorRT-LLM's), or None where none was measured."""
    name = chip.lower()
    arrays = _arrays(f"{name}-{framework}" if framework else name)
    if arrays is None or "allreduce.latency_s" not in arrays:
        return None
    return AllReduceTable(name, arrays)
