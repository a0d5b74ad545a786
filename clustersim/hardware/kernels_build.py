"""Derive the measured kernel tables of ``clustersim/catalog/kernels/``.

``python -m clustersim.hardware.kernels_build --data DIR`` reads NVIDIA's
``aiconfigurator-core`` 0.12.0 wheel (Apache-2.0), unpacked, where DIR is its
``aiconfigurator_core/systems/data`` folder, and writes one ``<chip>.npz`` per
chip, a ``<chip>-vllm.npz`` beside it where vLLM's kernels were measured on the
chip, and ``SOURCES.md``. The output is byte-for-byte the same on every run.

What is kept, and why:

* GEMM: TensorRT-LLM's ``torch_flow`` tables, plain torch matmuls on cuBLAS,
  for BF16 and per-tensor scaled FP8 (what Megatron-Core with Transformer
  Engine runs in training), and the block-scaled FP8 table (DeepGEMM on
  Blackwell, TensorRT-LLM's own kernel on Hopper; DeepSeek-V3's recipe). The
  weight-only INT4/INT8, SmoothQuant and NVFP4 tables are inference formats and
  are left out. Each precision is a dense m x n x k grid of latency in seconds,
  NaN where a shape was not measured.
* Attention: TensorRT-LLM's context-phase fused attention (causal), full
  attention (no sliding window), Q and KV in the same dtype, every head
  dimension measured. Rows with equal batch x heads at one sequence length are
  one problem count (the kernel parallelises over batch x heads x query tiles;
  they agree within about 2% at the median), as the median of their latencies.
  Generation-phase (decode) attention is left out: training never runs it.
* vLLM's own GEMMs, for its serving engine: its linear layers (torch for BF16,
  CUTLASS ``scaled_mm`` for per-tensor FP8, DeepGEMM or CUTLASS for block-scaled
  FP8), in the same layout. Its attention tables are left out: they measure BF16
  KV caches only, so the engine takes attention from the chip's default file.

* All-reduce: each framework's own all-reduce kernels for its tensor-parallel
  activations (BF16), by GPU count and message size, measured inside one NVLink
  node: TensorRT-LLM's (its one-shot, two-shot and NCCL strategies as ``AUTO``
  picks them) in ``<chip>.npz``, vLLM's custom all-reduce as its CUDA graphs run it
  in ``<chip>-vllm.npz`` (the eager variant's extra ~16 us is the host's launch,
  which an iteration's queued kernels hide). The serving engines' tensor-parallel
  all-reduces take their time from these.

Latencies are stored as float32 rounded to nearest at ``MANTISSA_BITS``
significant bits (relative error at most 2^-11, about 5e-4: far below the
run-to-run spread of the measured kernels, which is percents), which lets the
ten files compress to under two mebibytes together.
"""

from __future__ import annotations

import argparse
import io
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from clustersim.hardware.kernels import ATTENTION_LAYERS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CHIPS", "build", "main", "peak_tflops"]

WHEEL = "aiconfigurator-core"
WHEEL_VERSION = "0.12.0"
FRAMEWORK = "trtllm"
"""The framework of each chip's default file, ``<chip>.npz``: what training and the
``trtllm`` serving engine run."""
MANTISSA_BITS = 11
OUT = Path(__file__).resolve().parent.parent / "catalog" / "kernels"


@dataclass(frozen=True)
class ChipSource:
    """Where a chip's tables are in the wheel, and its dense peaks for SOURCES.md."""

    folder: str
    version: str
    peak_note: str = "catalog chips.yaml chip_tflops"
    peaks_tflops: tuple[tuple[str, float], ...] = ()  # only for chips not in the catalog
    vllm: str | None = None
    """vLLM's GEMM table version, for ``<chip>-vllm.npz``."""


CHIPS: dict[str, ChipSource] = {
    "a100": ChipSource("a100_sxm", "1.0.0", vllm="0.14.0"),
    "h100": ChipSource("h100_sxm", "1.3.0rc20", vllm="0.24.0"),
    "h200": ChipSource("h200_sxm", "1.3.0rc20", vllm="0.24.0"),
    "b200": ChipSource("b200_sxm", "1.3.0rc20", vllm="0.24.0"),
    "gb200": ChipSource(
        "gb200",
        "1.3.0rc20",
        "NVIDIA GB200 NVL72 datasheet, dense, per GPU (180 / 360 PFLOP/s over 72 GPUs)",
        (("bf16", 2500.0), ("fp8", 5000.0), ("fp8_block", 5000.0)),
        vllm="0.24.0",
    ),
}

GEMM_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "bf16": ("bfloat16", ("torch_flow",)),
    "fp8": ("fp8", ("torch_flow",)),
    "fp8_block": ("fp8_block", ("deepgemm", "torch_flow")),
}
"""clustersim precision: (the tables' gemm_dtype, kernel_source in order of preference)."""
VLLM_GEMM_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "bf16": ("bfloat16", ("torch.nn.functional.linear", "vllm_default")),
    "fp8": ("fp8", ("CutlassFP8ScaledMMLinearKernel",)),
    "fp8_block": (
        "fp8_block",
        ("DeepGemmFp8BlockScaledMMKernel", "CutlassFp8BlockScaledMMKernel",
         "FlashInferFp8BlockScaledMMKernel"),
    ),
}  # fmt: skip
"""vLLM's linear layers: unquantized (torch, cuBLAS), per-tensor FP8 (CUTLASS
``scaled_mm``, vLLM's ``CutlassFP8ScaledMMLinearKernel``) and block-scaled FP8."""

ATTENTION_DTYPES: dict[str, str] = {"bf16": "bfloat16", "fp8": "fp8"}

ALLREDUCE_KERNELS: dict[str, str] = {"trtllm": "TRTLLM", "vllm": "vLLM_custom_graph"}
"""Each framework's all-reduce kernel_source in the tables (module doc)."""


def _round(latency_s: NDArray[np.float64]) -> NDArray[np.float32]:
    """float32 rounded to nearest at MANTISSA_BITS significant bits (NaN kept)."""
    x = np.ascontiguousarray(latency_s, dtype=np.float32)
    drop = 23 - (MANTISSA_BITS - 1)
    bits = x.view(np.uint32).astype(np.uint64)
    bits = (bits + (1 << (drop - 1))) & ~np.uint64((1 << drop) - 1)
    out = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out)


def _read(path: Path) -> pd.DataFrame:
    import pandas as pd

    if not path.is_file():
        raise SystemExit(f"kernels_build: missing table {path}")
    return pd.read_parquet(path)


@dataclass
class Table:
    """One derived table, for SOURCES.md."""

    what: str
    source: str
    shape: str
    measured: int
    cells: int


def gemm_arrays(
    df: pd.DataFrame, precision: str, device: str, framework: str = FRAMEWORK
) -> tuple[dict[str, NDArray[np.generic]], Table] | None:
    """The dense grid of one precision, or None when the chip has no such table."""
    dtype, kernels = (VLLM_GEMM_SOURCES if framework == "vllm" else GEMM_SOURCES)[precision]
    rows = df[(df["op_name"] == "gemm") & (df["gemm_dtype"] == dtype)]
    kernel = next((k for k in kernels if (rows["kernel_source"] == k).any()), None)
    if kernel is None:
        return None
    rows = rows[rows["kernel_source"] == kernel]
    if rows.duplicated(["m", "n", "k"]).any():
        raise SystemExit(f"kernels_build: duplicate GEMM shapes in {device} {dtype} {kernel}")
    axes = [np.unique(rows[a].to_numpy()) for a in ("m", "n", "k")]
    grid = np.full(tuple(len(a) for a in axes), np.nan)
    idx = tuple(np.searchsorted(a, rows[c].to_numpy()) for a, c in zip(axes, "mnk", strict=True))
    grid[idx] = rows["latency"].to_numpy() * 1e-3  # the tables are in milliseconds
    p = f"gemm.{precision}"
    arrays: dict[str, NDArray[np.generic]] = {
        f"{p}.{c}": a.astype(np.int32) for a, c in zip(axes, "mnk", strict=True)
    }
    arrays[f"{p}.latency_s"] = _round(grid)
    source = f"{framework} {rows['version'].iloc[0]} gemm_dtype={dtype} kernel_source={kernel}"
    arrays[f"{p}.source"] = np.array(f"{source} ({device})")
    shape = " x ".join(str(len(a)) for a in axes)
    return arrays, Table(f"GEMM {precision}", source, f"m x n x k = {shape}", len(rows), grid.size)


def attention_arrays(
    df: pd.DataFrame, precision: str, head_dim: int, device: str, framework: str = FRAMEWORK
) -> tuple[dict[str, NDArray[np.generic]], Table]:
    """One precision and head dimension: latency [layer, seq, batch x heads]."""
    rows = df[df["head_dim"] == head_dim]
    rows = rows.assign(problems=rows["batch_size"] * rows["num_heads"])
    rows = rows.assign(layer=np.where(rows["num_key_value_heads"] == rows["num_heads"], 0, 1))
    med = rows.groupby(["layer", "isl", "problems"])["latency"].median()
    seqs = np.unique(rows["isl"].to_numpy())
    problems = np.unique(rows["problems"].to_numpy())
    grid = np.full((len(ATTENTION_LAYERS), len(seqs), len(problems)), np.nan)
    lay, isl, prob = (med.index.get_level_values(i).to_numpy() for i in range(3))
    grid[lay, np.searchsorted(seqs, isl), np.searchsorted(problems, prob)] = med.to_numpy() * 1e-3
    p = f"attn.{precision}.d{head_dim}"
    kernel = "+".join(sorted(rows["kernel_source"].unique()))
    source = (
        f"{framework} {rows['version'].iloc[0]} context attention kernel_source={kernel} "
        f"attn_dtype=kv_cache_dtype={ATTENTION_DTYPES[precision]} window_size=0 "
        f"head_dim={head_dim}"
    )
    arrays: dict[str, NDArray[np.generic]] = {
        f"{p}.seq": seqs.astype(np.int32),
        f"{p}.problems": problems.astype(np.int32),
        f"{p}.latency_s": _round(grid),
        f"{p}.source": np.array(f"{source} ({device})"),
    }
    shape = f"layer x seq x batch*heads = 2 x {len(seqs)} x {len(problems)}"
    measured = int(np.count_nonzero(~np.isnan(grid)))
    what = f"attention {precision} d{head_dim} ({len(rows)} rows)"
    return arrays, Table(what, source, shape, measured, grid.size)


def allreduce_arrays(
    df: pd.DataFrame, device: str, framework: str
) -> tuple[dict[str, NDArray[np.generic]], Table]:
    """The framework's all-reduce: latency [GPUs, message elements] (BF16)."""
    kernel = ALLREDUCE_KERNELS[framework]
    rows = df[(df["kernel_source"] == kernel) & (df["allreduce_dtype"] == "bfloat16")]
    if rows.duplicated(["num_gpus", "message_size"]).any():
        raise SystemExit(f"kernels_build: duplicate all-reduce sizes in {device} {kernel}")
    gpus = np.unique(rows["num_gpus"].to_numpy())
    sizes = np.unique(rows["message_size"].to_numpy())
    grid = np.full((len(gpus), len(sizes)), np.nan)
    grid[
        np.searchsorted(gpus, rows["num_gpus"].to_numpy()),
        np.searchsorted(sizes, rows["message_size"].to_numpy()),
    ] = rows["latency"].to_numpy() * 1e-3
    source = f"{framework} {rows['version'].iloc[0]} all_reduce kernel_source={kernel} bfloat16"
    arrays: dict[str, NDArray[np.generic]] = {
        "allreduce.gpus": gpus.astype(np.int32),
        "allreduce.elements": sizes.astype(np.int64),
        "allreduce.latency_s": _round(grid),
        "allreduce.source": np.array(f"{source} ({device})"),
    }
    shape = f"GPUs x elements = {len(gpus)} x {len(sizes)}"
    measured = int(np.count_nonzero(~np.isnan(grid)))
    return arrays, Table("all-reduce", source, shape, measured, grid.size)


def chip_arrays(
    data: Path, chip: str, framework: str = FRAMEWORK
) -> tuple[dict[str, NDArray[np.generic]], list[Table]]:
    """Every array of one chip's file for ``framework``, and what went into it."""
    src = CHIPS[chip]
    base = data / src.folder
    version = src.version if framework == FRAMEWORK else src.vllm or ""
    gemm = _read(base / "gemm" / framework / version / "gemm_perf.parquet")
    device = str(gemm["device"].iloc[0])
    arrays: dict[str, NDArray[np.generic]] = {}
    tables: list[Table] = []
    for precision in GEMM_SOURCES:
        got = gemm_arrays(gemm, precision, device, framework)
        if got is not None:
            arrays.update(got[0])
            tables.append(got[1])
    arrays["gemm.precisions"] = np.array(sorted({k.split(".")[1] for k in arrays}))
    comm = base / "comm" / framework / version / "custom_allreduce_perf.parquet"
    if comm.is_file():
        a, t = allreduce_arrays(_read(comm), device, framework)
        arrays.update(a)
        tables.append(t)
    if framework != FRAMEWORK:  # GEMMs and the all-reduce only (module doc)
        return arrays, tables
    attn = _read(base / "attention" / framework / src.version / "context_attention_perf.parquet")
    attn = attn[(attn["window_size"] == 0) & (attn["attn_dtype"] == attn["kv_cache_dtype"])]
    for precision, dtype in ATTENTION_DTYPES.items():
        rows = attn[attn["attn_dtype"] == dtype]
        for head_dim in sorted(int(d) for d in rows["head_dim"].unique()):
            a, t = attention_arrays(rows, precision, head_dim, device, framework)
            arrays.update(a)
            tables.append(t)
    return arrays, tables


def write_npz(path: Path, arrays: Mapping[str, NDArray[Any]]) -> None:
    """An ``np.load``-able archive with fixed entry order and timestamps (reproducible)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name in sorted(arrays):
            item = io.BytesIO()
            np.lib.format.write_array(item, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            z.writestr(info, item.getvalue(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    path.write_bytes(buf.getvalue())


def peak_tflops(chip: str) -> tuple[dict[str, float], str]:
    """The dense peak per table precision in TFLOP/s, and where it comes from: the
    catalog's ``chip_tflops`` where the chip is there, else the datasheet above."""
    src = CHIPS[chip]
    if src.peaks_tflops:
        return dict(src.peaks_tflops), src.peak_note
    from clustersim import catalog

    tf = catalog.chip(chip).chip_tflops
    return {p: tf.get("fp8" if p == "fp8_block" else p) for p in GEMM_SOURCES}, src.peak_note


def _ceilings(chip: str, path: Path) -> list[str]:
    """SOURCES.md lines: the best measured efficiency per precision against the peak."""
    from clustersim.hardware.kernels import GemmTable

    with np.load(path, allow_pickle=False) as npz:
        table = GemmTable(chip, {n: npz[n] for n in npz.files})
    peaks, note = peak_tflops(chip)
    out = []
    for p in table.precisions:
        ceiling = table.ceiling(p, peaks[p] * 1e12)
        out.append(f"  - GEMM {p} ceiling {ceiling:.3f} of {peaks[p]:g} TFLOP/s ({note})")
    return out


def sources_md(report: dict[str, list[Table]], ceilings: dict[str, list[str]]) -> str:
    """SOURCES.md; ``report`` keys are file stems: ``<chip>`` or ``<chip>-vllm``."""
    lines = [
        "# Measured kernel tables",
        "",
        f"Derived from NVIDIA's `{WHEEL}` {WHEEL_VERSION} wheel (Apache-2.0, NVIDIA): its",
        "`aiconfigurator_core/systems/data/<system>/` tables, measured by NVIDIA on each GPU.",
        "Regenerate (same bytes every run):",
        "",
        "```",
        f"pip download --no-deps {WHEEL}=={WHEEL_VERSION}",
        "unzip aiconfigurator_core-*.whl -d aic",
        "python -m clustersim.hardware.kernels_build --data aic/aiconfigurator_core/systems/data",
        "```",
        "",
        "Each `<chip>.npz` holds, per precision `p`, `gemm.<p>.{m,n,k}` (grid axes),",
        "`gemm.<p>.latency_s` (float32 [m, n, k], seconds, NaN where not measured) and",
        "`gemm.<p>.source`; `allreduce.{gpus,elements}` and `allreduce.latency_s` (float32",
        "[GPUs, BF16 elements], seconds) where the framework's all-reduce was measured;",
        "and per attention precision and head dimension `d`,",
        "`attn.<p>.d<d>.{seq,problems}` (sequence length; batch x heads) and",
        "`attn.<p>.d<d>.latency_s` (float32 [layer, seq, problems], layer 0: KV heads equal",
        "to heads, 1: fewer). Latencies are rounded to nearest at "
        f"{MANTISSA_BITS} significant bits.",
        "`clustersim.hardware.kernels` reads them. The GEMM cells not measured are the",
        "largest corner of each grid (m = 32768 with n or k = 65536; for fp8_block also",
        "n or k of 51200 and more); the lookup fills them from the nearest measured cell",
        "at its efficiency. A ceiling below is the best 2mnk / (latency x dense peak) on",
        "the grid, the bound any fitted GEMM efficiency for that chip must respect.",
        "",
        f"`<chip>.npz` holds {FRAMEWORK}'s kernels: what training (cuBLAS through torch)",
        "and the `trtllm` serving engine run. `<chip>-vllm.npz` holds vLLM's own GEMMs",
        "(its CUTLASS FP8 `scaled_mm`) and its custom all-reduce, which the `vllm` serving",
        "engine runs, with attention from `<chip>.npz`.",
        "",
    ]
    for stem, tables in report.items():
        chip, _, framework = stem.partition("-")
        src = CHIPS[chip]
        version = src.version if not framework else src.vllm
        lines.append(f"## {stem} (`{src.folder}`, {framework or FRAMEWORK} {version})")
        lines.append("")
        for t in tables:
            pct = 100.0 * t.measured / t.cells
            lines.append(
                f"- {t.what}: `{t.source}`; {t.shape}, {t.measured} of {t.cells} cells "
                f"measured ({pct:.1f}%)"
            )
        lines.extend(ceilings[stem])
        lines.append("")
    return "\n".join(lines)


def build(data: Path, out: Path = OUT, chips: Sequence[str] = tuple(CHIPS)) -> list[Path]:
    """Write every chip's tables and SOURCES.md; return the files written."""
    if not data.is_dir():
        raise SystemExit(f"kernels_build: {data} is not a folder (the wheel's systems/data)")
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, list[Table]] = {}
    ceilings: dict[str, list[str]] = {}
    written = []
    for chip in chips:
        for framework in (FRAMEWORK, "vllm") if CHIPS[chip].vllm else (FRAMEWORK,):
            stem = chip if framework == FRAMEWORK else f"{chip}-{framework}"
            arrays, report[stem] = chip_arrays(data, chip, framework)
            path = out / f"{stem}.npz"
            write_npz(path, arrays)
            ceilings[stem] = _ceilings(chip, path)
            written.append(path)
    md = out / "SOURCES.md"
    md.write_text(sources_md(report, ceilings), encoding="utf-8")
    return [*written, md]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clustersim.hardware.kernels_build")
    parser.add_argument("--data", type=Path, required=True, help="the wheel's systems/data folder")
    parser.add_argument("--out", type=Path, default=OUT, help="output folder")
    args = parser.parse_args(argv)
    for path in build(args.data, args.out):
        print(f"{path.name}: {path.stat().st_size} bytes")
    print((args.out / "SOURCES.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
