"""Build ``clustersim/catalog/kernels/decode-<chip>.npz`` from measured decode attention.

    pip download --no-deps aiconfigurator-core==0.12.0
    unzip aiconfigurator_core-*.whl -d aic
    python -m clustersim.hardware.decode_kernels_build --data aic/aiconfigurator_core/systems/data

The source is the same NVIDIA ``aiconfigurator-core`` 0.12.0 wheel (Apache-2.0) as the
GEMM, attention and MoE tables (:mod:`clustersim.hardware.kernels_build`): its
``<system>/attention/<framework>/<version>/generation_attention_perf.parquet``, the
latency of one layer's generation-phase (decode) attention kernel on one GPU: a batch
of sequences, one new token each, attending over ``step`` cached tokens, by query
heads, KV heads, head dimension and KV-cache dtype (BF16 queries). The kernel reads
the KV cache itself, so its time holds that read, its launch and its tail.

Per engine (``trtllm``: the version of the chip's default GEMM file; ``vllm``: the
version of its ``-vllm`` file) each cell keeps the fastest measured kernel of the
engine's decode backends (vLLM's FlashAttention 3 and 4 on Hopper, FlashInfer's
TensorRT-LLM decode kernel and Triton on Blackwell; TensorRT-LLM's own and its
FlashInfer path): an engine runs the backend it ranks fastest for the shape. Full
attention only (``window_size`` 0), beam width 1.

Each file holds, per ``<engine>.<kv dtype>.d<head dim>``: ``keys`` (int32 [N, 2]: query
heads, KV heads on one GPU), ``batch`` and ``step`` (the axes) and ``latency_s``
(float32 [N, batch, step], seconds, NaN where not measured), rounded as the GEMM files
are. Same bytes on every run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from clustersim.hardware.engine_tables_build import build_engine_files, build_main, sources_md
from clustersim.hardware.kernels_build import CHIPS, OUT, _round

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["build", "decode_arrays", "main"]

KV_DTYPES: dict[str, str] = {"bfloat16": "bf16", "fp8": "fp8"}
"""The tables' kv_cache_dtype: clustersim's ``serving.kv_dtype``."""
HEAD_DIMS = (64, 128, 256)
"""The head dimensions kept: grouped-query attention's (the 192 and 512 of the tables
are multi-head latent attention's, which serving does not model)."""


def decode_arrays(frame: pd.DataFrame, engine: str) -> dict[str, NDArray[np.generic]]:
    """The npz entries of one engine's table (module doc)."""
    for column, full in (("window_size", 0), ("beam_width", 1)):  # older tables lack them
        if column not in frame:
            frame = frame.assign(**{column: full})
    rows = frame[
        (frame["window_size"] == 0)
        & (frame["beam_width"] == 1)
        & (frame["attn_dtype"] == "bfloat16")
        & frame["kv_cache_dtype"].isin(list(KV_DTYPES))
        & frame["head_dim"].isin(HEAD_DIMS)
    ]
    out: dict[str, NDArray[np.generic]] = {}
    for (dtype, head_dim), sel in rows.groupby(["kv_cache_dtype", "head_dim"], sort=True):
        best = sel.groupby(["num_heads", "num_key_value_heads", "batch_size", "step"])[
            "latency"
        ].min()
        keys = sorted({(int(h), int(k)) for h, k, _b, _s in best.index})
        batch = np.unique(best.index.get_level_values("batch_size").to_numpy())
        step = np.unique(best.index.get_level_values("step").to_numpy())
        grid = np.full((len(keys), len(batch), len(step)), np.nan)
        where = {k: i for i, k in enumerate(keys)}
        h, k, b, s = (best.index.get_level_values(i).to_numpy() for i in range(4))
        lane = np.array([where[(int(x), int(y))] for x, y in zip(h, k, strict=True)])
        grid[lane, np.searchsorted(batch, b), np.searchsorted(step, s)] = best.to_numpy() * 1e-3
        name = f"{engine}.{KV_DTYPES[str(dtype)]}.d{head_dim}"
        kernels = ", ".join(sorted(map(str, sel["kernel_source"].unique())))
        version = str(sel["version"].iloc[0])
        out[f"{name}.keys"] = np.array(keys, dtype=np.int32).reshape(-1, 2)
        out[f"{name}.batch"] = batch.astype(np.int32)
        out[f"{name}.step"] = step.astype(np.int32)
        out[f"{name}.latency_s"] = _round(grid)
        out[f"{name}.source"] = np.array(
            f"{engine} {version} generation_attention kv_cache_dtype={dtype} "
            f"head_dim={head_dim} window_size=0 kernel_source=fastest of {kernels}"
        )
    return out


def _shape(arrays: dict[str, NDArray[np.generic]], lane: str) -> str:
    heads, batches = len(arrays[f"{lane}.keys"]), len(arrays[f"{lane}.batch"])
    return f"{heads} head layouts x {batches} batches x {len(arrays[f'{lane}.step'])} steps"


def build(data: Path, out: Path = OUT, chips: Sequence[str] = tuple(CHIPS)) -> list[Path]:
    """Write ``decode-<chip>.npz`` for each chip with a measured decode attention table,
    and ``DECODE_SOURCES.md``; the npz paths."""
    table = ("attention", "generation_attention_perf.parquet")
    report = build_engine_files(
        data, out, chips, prefix="decode", table=table, arrays_of=decode_arrays
    )
    text = sources_md(
        report,
        title="Measured decode attention tables",
        table="attention/<framework>/<version>/generation_attention_perf.parquet",
        module="clustersim.hardware.decode_kernels_build",
        reader="clustersim.hardware.decode_kernels",
        shape=_shape,
    )
    (out / "DECODE_SOURCES.md").write_text(text, encoding="utf-8")
    return [out / f"{stem}.npz" for stem in report]


def main(argv: Sequence[str] | None = None) -> int:
    return build_main("clustersim.hardware.decode_kernels_build", build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
