"""FP8 training: FP8 linears with their casts, BF16 attention core; the attention kernel's
efficiency."""

from __future__ import annotations

import pytest

from clustersim import catalog
from clustersim.hardware.chip import ChipModel
from clustersim.hardware.work import Work
from clustersim.workload import make_dims
from clustersim.workload.ops import ACT_BYTES, fp8_cast, layer_block

from .helpers import setup, tiny


def _ops(precision: str) -> dict[str, Work]:
    model = tiny()
    par, train, lay = setup(4, tp=2, global_batch_size=8)
    train = train.model_copy(update={"precision": precision})
    dm = make_dims(model, par, train, lay)
    block = layer_block(dm, precision, "none")
    return {f"{t[2]}:{t[1]}": t[3] for t in (*block.fwd, *block.bwd) if t[3] is not None}


def test_fp8_linears_pay_for_their_casts() -> None:
    fp8, bf16 = _ops("fp8"), _ops("bf16")
    casts = sorted(k for k in fp8 if k.endswith(".cast"))
    assert casts == sorted(
        [
            "fwd:attn.qkv.cast", "fwd:attn.out.cast", "fwd:mlp.up.cast", "fwd:mlp.down.cast",
            "bwd:attn.qkv.grad.cast", "bwd:attn.out.grad.cast", "bwd:mlp.up.grad.cast",
            "bwd:mlp.down.grad.cast",
        ]
    )  # fmt: skip
    assert not any(k.endswith(".cast") for k in bf16)
    # the cast reads the BF16 input and writes FP8 twice (as is and transposed)
    qkv = fp8["fwd:attn.qkv"]
    assert qkv.matmul is not None and qkv.precision == "fp8"
    m, k, _ = qkv.matmul
    assert fp8["fwd:attn.qkv.cast"] == fp8_cast(m, k)
    assert fp8_cast(m, k).hbm_bytes == (ACT_BYTES + 2) * m * k
    # the attention core stays BF16 and runs on the attention kernel
    core = fp8["fwd:attn.core.qk"]
    assert core.precision == "bf16" and core.kernel == "attention"


def test_attention_efficiency_slows_only_the_attention_kernel() -> None:
    spec = catalog.chip("h100", {"calibration": {"attention_efficiency": 0.4}})
    chip = ChipModel(spec, 1)
    gemm = Work((8192, 8192, 8192), 1, "bf16")
    attn = Work((8192, 8192, 8192), 1, "bf16", kernel="attention")
    ratio = chip.op_time(attn).engine_s[0] / chip.op_time(gemm).engine_s[0]
    assert ratio == pytest.approx(spec.calibration.tensor_efficiency / 0.4)
    plain = ChipModel(catalog.chip("h100"), 1)  # not set: the GEMM efficiency
    assert plain.op_time(attn).seconds == plain.op_time(gemm).seconds
