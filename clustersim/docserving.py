"""Figures of the serving page that the measured kernel tables produce.

Each entry of :data:`FIGURES` is ``(name, pattern, compute, noise, what, pages)``, a
figure of ``python -m clustersim.docs``.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FIGURES", "decode_gemms"]

DECODE_GEMM = (8, 8192, 2560)
"""A decode step's GEMM: 8 rows against Llama-3.1-70B's QKV projection at TP 4."""


def decode_gemms(ctx: object = None) -> str:
    """vLLM's FP8 GEMM against TensorRT-LLM's table's at :data:`DECODE_GEMM` on H100."""
    del ctx
    from clustersim.hardware.kernels import gemm_table

    vllm, trt = gemm_table("h100", "vllm"), gemm_table("h100")
    assert vllm is not None and trt is not None
    m, k, n = DECODE_GEMM
    return (
        f"{vllm.time_s(m, k, n, 'fp8') * 1e6:.1f} against {trt.time_s(m, k, n, 'fp8') * 1e6:.1f} us"
    )


_SERVE = ("docs/tutorials/serving.md",)
FIGURES: tuple[tuple[str, str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    ("serve-decode-gemms", r"at 8 rows x 8,192 x 2,560, (\d+\.\d against\s+\d+\.\d us)",
     decode_gemms, 0.0,
     "vLLM's and TensorRT-LLM's FP8 GEMM at a decode step's size on H100", _SERVE),
)  # fmt: skip
