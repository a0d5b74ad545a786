"""The measured decode attention tables: what the build keeps and how a step reads them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from clustersim.hardware.decode_kernels import DecodeTable, decode_table
from clustersim.hardware.decode_kernels_build import decode_arrays


def _frame() -> pd.DataFrame:
    """Two kernels measured at batches 1 and 4 over steps 1 and 1023 (milliseconds), a
    sliding-window row and a head dimension the build drops."""
    rows = []
    for kernel, scale in (("slow", 2.0), ("fast", 1.0)):
        for batch in (1, 4):
            for step in (1, 1023):
                ms = scale * (0.006 + 1e-6 * batch * step)
                rows.append((kernel, batch, step, 8, 1, 128, 0, "fp8", ms))
    rows.append(("fast", 1, 1, 8, 1, 128, 128, "fp8", 9.9))  # a sliding window
    rows.append(("fast", 1, 1, 8, 1, 192, 0, "fp8", 9.9))  # MLA's head size
    cols = ["kernel_source", "batch_size", "step", "num_heads", "num_key_value_heads",
            "head_dim", "window_size", "kv_cache_dtype", "latency"]  # fmt: skip
    frame = pd.DataFrame(rows, columns=cols)
    return frame.assign(beam_width=1, attn_dtype="bfloat16", version="9.9")


def _table() -> DecodeTable:
    return DecodeTable("test", decode_arrays(_frame(), "vllm"))


def test_the_build_keeps_the_fastest_kernel_per_cell_of_full_attention() -> None:
    arrays = decode_arrays(_frame(), "vllm")
    assert sorted(k for k in arrays if k.endswith(".keys")) == ["vllm.fp8.d128.keys"]
    np.testing.assert_array_equal(arrays["vllm.fp8.d128.keys"], [[8, 1]])
    latency = arrays["vllm.fp8.d128.latency_s"][0]
    assert latency[0, 0] == pytest.approx(6.001e-6, rel=1e-3)  # the fast kernel, batch 1, step 1
    assert latency[1, 1] == pytest.approx(1e-3 * (0.006 + 1e-6 * 4 * 1023), rel=1e-3)
    assert "fastest of fast, slow" in str(arrays["vllm.fp8.d128.source"])


def test_lookup_is_log_log_between_points_and_grows_in_proportion_past_them() -> None:
    t = _table()
    at = t.time_s
    grid = {(b, s): 1e-3 * (0.006 + 1e-6 * b * s) for b in (1, 4) for s in (1, 1023)}
    # measured points come back (within the 11-bit rounding)
    assert at(("vllm", "fp8", 128, 8, 1), 4, 1023) == pytest.approx(grid[4, 1023], rel=1e-3)
    # between steps: log-log interpolation
    mid = np.exp((np.log(grid[1, 1]) + np.log(grid[1, 1023])) / 2)
    assert at(("vllm", "fp8", 128, 8, 1), 1, np.sqrt(1023)) == pytest.approx(mid, rel=1e-3)
    # below the first step the launch floor stands; past the last, in proportion
    assert at(("vllm", "fp8", 128, 8, 1), 1, 0.5) == pytest.approx(grid[1, 1], rel=1e-3)
    far = at(("vllm", "fp8", 128, 8, 1), 1, 4092)
    assert far == pytest.approx(4 * at(("vllm", "fp8", 128, 8, 1), 1, 1023), rel=1e-9)
    # past the largest batch, in proportion to the batch
    big = at(("vllm", "fp8", 128, 8, 1), 16, 1023)
    assert big == pytest.approx(4 * at(("vllm", "fp8", 128, 8, 1), 4, 1023), rel=1e-9)
    # FP16 caches read as BF16's (none here), int8 as FP8's; an unmeasured layout is None
    assert at(("vllm", "int8", 128, 8, 1), 1, 1) == at(("vllm", "fp8", 128, 8, 1), 1, 1)
    assert at(("vllm", "bf16", 128, 8, 1), 1, 1) is None
    assert at(("vllm", "fp8", 128, 8, 2), 1, 1) is None
    assert at(("trtllm", "fp8", 128, 8, 1), 1, 1) is None


def test_shipped_tables_cover_the_engines_and_grow_with_the_context() -> None:
    table = decode_table("h100")
    assert table is not None and decode_table("trn2") is None
    for engine in ("trtllm", "vllm"):
        # Llama-3-70B at TP 4: 16 query heads and 2 KV heads a GPU, 128 wide
        short = table.time_s((engine, "fp8", 128, 16, 2), 32, 128)
        long = table.time_s((engine, "fp8", 128, 16, 2), 32, 8192)
        assert short is not None and long is not None
        assert 2e-6 < short < long < 1e-3
