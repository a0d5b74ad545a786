"""GPU kernels from measured tables: the fused attention core and chunked GEMMs."""

from __future__ import annotations

import numpy as np
import pytest

from clustersim import catalog
from clustersim.hardware import ChipModel, Work
from clustersim.hardware.kernels import _nnls_relative, attention_table, gemm_table
from clustersim.workload.cp_ring import attention_step

BACKWARD = 0.7  # an attention_backward_efficiency inside its range (0.4-1)


@pytest.fixture(scope="module")
def h100() -> ChipModel:
    """H100 with its GEMMs and fused attention forward from the measured tables."""
    spec = catalog.chip("h100")
    cal = spec.calibration.model_copy(
        update={
            "gemm_times": "measured",
            "attention_times": "measured",
            "attention_backward_efficiency": BACKWARD,
        }
    )
    return ChipModel(spec.model_copy(update={"calibration": cal}), lnc=1)


def _step(heads: int = 16, kv_heads: int = 2, seq: int = 4096, micro: int = 1) -> object:
    return attention_step(
        micro, heads, seq, seq, causal=True, prec="bf16", qk_dim=128, v_dim=128, kv_heads=kv_heads
    )


@pytest.mark.parametrize(
    ("heads", "kv_heads", "seq"), [(16, 2, 4096), (32, 32, 2048), (24, 8, 8192)]
)
def test_forward_is_the_measured_kernel_as_training_runs_it(
    h100: ChipModel, heads: int, kv_heads: int, seq: int
) -> None:
    """A causal forward's two matmuls together take the measured kernel's training time
    for its shape (the table's launch and quadratic terms); the softmax inside the
    fused kernel adds nothing."""
    st = _step(heads, kv_heads, seq)
    table = attention_table("h100")
    assert table is not None
    measured = table.training_s(1, seq, heads, kv_heads, 128)
    t = [h100.op_time(w).seconds for w in (st.qk, st.softmax, st.pv)]
    assert t[1] == 0.0
    assert t[0] + t[2] == pytest.approx(measured, rel=1e-12)


def test_backward_runs_at_the_fitted_fraction_of_the_forward_rate(h100: ChipModel) -> None:
    st = _step()
    fwd = h100.op_time(st.qk).seconds + h100.op_time(st.pv).seconds
    bwd = sum(h100.op_time(w).seconds for w in (st.s_dp, st.softmax_b, st.dq, st.dkv))
    # five matmuls of the forward's size against two
    assert bwd == pytest.approx(fwd * 2.5 / BACKWARD, rel=1e-12)


def test_chunked_gemm_is_priced_chunk_by_chunk(h100: ChipModel) -> None:
    table = gemm_table("h100")
    assert table is not None
    m, k, n = 2048, 12288, 9216
    whole = h100.matmul_s(m, k, n, "fp8")
    chunked = h100.matmul_s(m, k, n, "fp8", splits=4)
    assert whole == table.time_s(m, k, n, "fp8")
    assert chunked == pytest.approx(4 * table.time_s(m // 4, k, n, "fp8"), rel=1e-12)
    assert chunked > whole  # a quarter of the rows fills the SMs less well


def test_roofline_chips_keep_one_attention_efficiency() -> None:
    """Without a measured table (Trainium), the backward's matmuls run at the same
    attention efficiency as the forward's, and splits change nothing."""
    trn2 = ChipModel(catalog.chip("trn2"), lnc=2)
    st = _step()
    flops_rate = [
        w.tensor_flops / trn2.op_time(w).engine_s[0] for w in (st.qk, st.pv, st.s_dp, st.dq)
    ]
    assert max(flops_rate) == pytest.approx(min(flops_rate), rel=1e-9)
    w = Work(matmul=(4096, 4096, 4096))
    assert trn2.op_time(w) == trn2.op_time(Work(matmul=(4096, 4096, 4096), splits=4))


def test_relative_nnls_recovers_non_negative_terms() -> None:
    s = np.array([512.0, 1024, 2048, 4096, 8192])
    a = np.stack([np.ones_like(s), s, s * s], axis=1)
    exact = np.array([2e-5, 3e-8, 1.5e-11])
    assert _nnls_relative(a, a @ exact) == pytest.approx(exact, rel=1e-6)
    # A term that would fit negative is dropped, not made negative.
    falling = a @ np.array([4e-5, 0.0, 1e-11]) - 1e-9 * s
    c = _nnls_relative(a, falling)
    assert np.all(c >= 0) and c[1] == 0.0


def test_training_attention_drops_the_serving_ops_per_token_work() -> None:
    """The training kernel is the measured op less its term linear in the sequence (RoPE
    and KV-cache writes): faster than the op, most of all at short sequences, and on
    H100 at a flash-attention rate from 2K tokens on (about half to two thirds of the
    BF16 peak)."""
    table = attention_table("h100")
    assert table is not None
    shares = []
    for seq in (1024, 2048, 4096, 8192, 16384):
        op = table.forward_s(1, seq, 32, 8, 128)
        training = table.training_s(1, seq, 32, 8, 128)
        assert training < op
        shares.append(training / op)
        rate = 2.0 * 2.0 * 32 * seq * seq / 2 * 128 / training
        if seq >= 2048:  # shorter, the launch floor weighs
            assert 0.45 < rate / 989e12 < 0.70
    assert shares == sorted(shares)  # the per-token term matters less as s^2 grows
    with pytest.raises(ValueError, match="kv_heads dividing heads"):
        table.training_s(1, 1024, 32, 5, 128)


def test_compute_efficiency_scales_every_op() -> None:
    spec = catalog.chip("h100")
    base = ChipModel(spec, lnc=1)
    slow = ChipModel(
        spec.model_copy(
            update={"calibration": spec.calibration.model_copy(update={"compute_efficiency": 0.8})}
        ),
        lnc=1,
    )
    overhead = spec.calibration.op_overhead_s
    st = _step()
    for w in (Work(matmul=(4096, 4096, 4096), precision="fp8"), Work(hbm_bytes=1e9), st.qk):
        a, b = base.op_time(w), slow.op_time(w)
        assert b.seconds - (overhead if w.attention is None else 0.0) == pytest.approx(
            1.25 * (a.seconds - (overhead if w.attention is None else 0.0)), rel=1e-12
        )
