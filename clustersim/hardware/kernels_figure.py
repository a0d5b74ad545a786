"""Draw a chip's measured GEMM efficiency surface (BF16 and FP8).

``python -m clustersim.hardware.kernels_figure --out docs/figures/h100-gemm-efficiency.png``

Efficiency is 2mnk / (time x dense peak), the time from the measured kernel
table (``clustersim.hardware.kernels``) and the peak from the catalog. The
surface shows what a single fitted efficiency constant cannot: small m (few
tokens, or a small expert's share) leaves most of the chip idle, since there are
fewer output tiles than SMs, and only large square-ish GEMMs approach the
ceiling.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clustersim.hardware.kernels import gemm_table
from clustersim.hardware.kernels_build import peak_tflops

__all__ = ["draw", "main"]

CHIP_NAMES = {
    "a100": "A100 SXM",
    "h100": "H100 SXM",
    "h200": "H200 SXM",
    "b200": "B200",
    "gb200": "GB200 (per GPU)",
}


def draw(out: Path, chip: str = "h100", precisions: Sequence[str] = ("bf16", "fp8")) -> Path:
    """Heatmaps of efficiency over m and n = k, one per precision, into ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    table = gemm_table(chip)
    if table is None:
        raise SystemExit(f"kernels_figure: no measured kernel table for chip {chip!r}")
    peaks, _ = peak_tflops(chip)
    m = np.exp2(np.arange(0.0, 15.0 + 1e-9, 0.125))  # 1 .. 32768
    nk = np.exp2(np.arange(5.0, 16.0 + 1e-9, 0.125))  # 32 .. 65536
    mm, kk = np.meshgrid(m, nk)
    fig, axes = plt.subplots(
        1, len(precisions), figsize=(6.2 * len(precisions), 5.4), layout="constrained"
    )
    sizes = FuncFormatter(lambda v, _: f"{v:,.0f}")
    axes = np.atleast_1d(axes)
    image = None
    for ax, precision in zip(axes, precisions, strict=True):
        peak = peaks[precision] * 1e12
        t = table.times_s(mm, kk, kk, precision)
        eff = 2.0 * mm * kk * kk / (t * peak)
        image = ax.pcolormesh(mm, kk, eff, cmap="viridis", vmin=0.0, vmax=1.0, shading="nearest")
        lines = ax.contour(mm, kk, eff, levels=[0.2, 0.4, 0.6], colors="white", linewidths=0.8)
        ax.clabel(lines, fmt="%.2f", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        for axis, lo, hi in ((ax.xaxis, 0, 15), (ax.yaxis, 5, 16)):
            axis.set_major_locator(
                FixedLocator(np.exp2(np.arange(lo + (hi - lo) % 2, hi + 1, 2)).tolist())
            )
            axis.set_minor_locator(NullLocator())
            axis.set_major_formatter(sizes)
        ax.set_xlabel("m: rows of A and C (tokens), elements")
        ax.set_ylabel("n = k: weight matrix side, elements")
        ceiling = table.ceiling(precision, peak)
        ax.set_title(
            f"{precision.upper()}: peak {peaks[precision]:,.0f} TFLOP/s, "
            f"best measured {ceiling:.2f}",
            fontsize=10,
        )
    assert image is not None
    bar = fig.colorbar(image, ax=list(axes), fraction=0.04, pad=0.01)
    bar.set_label("efficiency: 2mnk / (time x dense peak)")
    name = CHIP_NAMES.get(chip, chip)
    fig.suptitle(
        f"{name} GEMM efficiency, C[m,n] = A[m,k] B[k,n], from measured kernel times\n"
        "(TensorRT-LLM torch GEMMs on cuBLAS, aiconfigurator-core 0.12.0; "
        "efficiency against the dense datasheet peak; contours at 0.2, 0.4, 0.6)",
        fontsize=11,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clustersim.hardware.kernels_figure")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    parser.add_argument("--chip", default="h100", help="chip with a kernel table (default h100)")
    args = parser.parse_args(argv)
    print(draw(args.out, args.chip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
