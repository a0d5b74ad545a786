"""Build ``clustersim/catalog/kernels/moe-<chip>.npz`` from measured fused-MoE kernel tables.

    pip download --no-deps aiconfigurator-core==0.12.0
    unzip aiconfigurator_core-*.whl -d aic
    python -m clustersim.hardware.moe_kernels_build --data aic/aiconfigurator_core/systems/data

The source is the same NVIDIA ``aiconfigurator-core`` 0.12.0 wheel (Apache-2.0) as the
GEMM and attention tables (:mod:`clustersim.hardware.kernels_build`): its
``<system>/moe/<framework>/<version>/moe_perf.parquet``, the latency of one MoE layer's
fused expert computation (routing's permute, the gate-up and down grouped GEMMs, the
activation and the un-permute; not the router GEMM, not the all-reduce) on one GPU,
measured by tokens entering the layer, model shape (hidden, expert intermediate size,
top-k, experts) and the expert layout (``moe_tp`` x ``moe_ep``, up to
:data:`MAX_RANKS`).

Per engine (``trtllm``: the version of the chip's default GEMM file; ``vllm``: the
version of its ``-vllm`` file) and precision, each cell keeps the fastest measured
kernel of the engine's gated (SwiGLU) BF16 and FP8 kernels (:data:`MOE_DTYPES`): an
engine picks the MoE backend it ranks fastest for the shape (vLLM's ``fused_moe`` backend selection,
TensorRT-LLM's ``moe_backend`` auto choice). Int4, MXFP4, NVFP4 and non-gated kernels
are left out (clustersim's serving precisions are BF16 and FP8).

The routing distribution is ``power_law_1.01``: the token-to-expert skew that
aiconfigurator itself assumes for real traffic (``sdk/models/deepseek.py``,
``_power_law_alpha = 1.01``), between its ``balanced`` and ``power_law_1.2`` tables.

Each file holds, per ``<engine>.<precision>``: ``keys`` (int64 [N, 6]: hidden,
intermediate, top-k, experts, moe_tp, moe_ep), ``tokens`` (the token axis) and
``latency_s`` (float32 [N, tokens], seconds, NaN where not measured), rounded as the
GEMM files are. Same bytes on every run.
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

__all__ = ["DISTRIBUTION", "build", "main", "moe_arrays"]

DISTRIBUTION = "power_law_1.01"
MOE_DTYPES: dict[str, tuple[str, ...]] = {"bf16": ("bfloat16",), "fp8": ("fp8", "fp8_block")}
"""clustersim precision: the tables' moe_dtypes it may run. FP8 weights run the engine's
fastest FP8 kernel for the shape, per-tensor or block-scaled: vLLM 0.24's per-tensor
FlashInfer CUTLASS kernel on Hopper is 4-6x slower than its block-scaled Triton kernel
at decode's token counts, and FP8 checkpoints of MoE models (Qwen3's, DeepSeek's) are
block-scaled."""
EXCLUDED = ("nongated", "marlin", "mxfp4", "nvfp4", "w4a4", "gptoss", "min_latency")
"""Kernel sources left out (module doc); ``min_latency`` is TensorRT-LLM's special
low-latency path for DeepSeek-style models at tiny batches, not its default."""
MAX_RANKS = 8
"""Layouts kept: ``moe_tp x moe_ep`` up to one 8-GPU node (the tables go to 256; a
replica wider than a node falls back to the GEMM tables, :mod:`clustersim.serve.moe`)."""
KEY_COLUMNS = ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size")


def moe_arrays(frame: pd.DataFrame, engine: str) -> dict[str, NDArray[np.generic]]:
    """The npz entries of one engine's table (module doc)."""
    rows = frame[frame["distribution"] == DISTRIBUTION]
    keep = ~rows["kernel_source"].str.contains("|".join(EXCLUDED))
    rows = rows[keep & (rows["moe_tp_size"] * rows["moe_ep_size"] <= MAX_RANKS)]
    out: dict[str, NDArray[np.generic]] = {}
    for precision, dtypes in MOE_DTYPES.items():
        sel = rows[rows["moe_dtype"].isin(dtypes)]
        if sel.empty:
            continue
        best = sel.groupby([*KEY_COLUMNS, "num_tokens"])["latency"].min().reset_index()
        table = best.pivot_table(index=list(KEY_COLUMNS), columns="num_tokens", values="latency")
        table = table.sort_index().sort_index(axis=1)
        keys = np.array([list(map(int, k)) for k in table.index], dtype=np.int64)
        tokens = np.array(table.columns, dtype=np.int64)
        latency_s = table.to_numpy(dtype=np.float64) * 1e-3  # the tables hold milliseconds
        out[f"{engine}.{precision}.keys"] = keys
        out[f"{engine}.{precision}.tokens"] = tokens
        out[f"{engine}.{precision}.latency_s"] = _round(latency_s)
        kernels = sorted(sel["kernel_source"].unique())
        version = str(sel["version"].iloc[0])
        out[f"{engine}.{precision}.source"] = np.array(
            f"{engine} {version} moe moe_dtype={'|'.join(dtypes)} distribution={DISTRIBUTION} "
            f"kernel_source=fastest of {', '.join(kernels)}"
        )
    return out


def _shape(arrays: dict[str, NDArray[np.generic]], lane: str) -> str:
    return f"{len(arrays[f'{lane}.keys'])} shapes x layouts"


def build(data: Path, out: Path = OUT, chips: Sequence[str] = tuple(CHIPS)) -> list[Path]:
    """Write ``moe-<chip>.npz`` for each chip with a measured MoE table, and
    ``MOE_SOURCES.md``; the npz paths."""
    report = build_engine_files(
        data, out, chips, prefix="moe", table=("moe", "moe_perf.parquet"), arrays_of=moe_arrays
    )
    text = sources_md(
        report,
        title="Measured MoE kernel tables",
        table="moe/<framework>/<version>/moe_perf.parquet",
        module="clustersim.hardware.moe_kernels_build",
        reader="clustersim.serve.moe",
        shape=_shape,
    )
    (out / "MOE_SOURCES.md").write_text(text, encoding="utf-8")
    return [out / f"{stem}.npz" for stem in report]


def main(argv: Sequence[str] | None = None) -> int:
    return build_main("clustersim.hardware.moe_kernels_build", build, argv)


if __name__ == "__main__":
    raise SystemExit(main())
