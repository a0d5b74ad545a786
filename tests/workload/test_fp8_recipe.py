"""FP8 training: FP8 linears with their casts, BF16 attention core; the attention kernel's
efficiency."""

from __future__ import annotations

import pytest

from clustersim import catalog
from clustersim.errors import ScenarioError
from clustersim.hardware.chip import ChipModel
from clustersim.hardware.work import Work
from clustersim.scenario.models import Fp8Cfg
from clustersim.workload import make_dims, make_layout, validate
from clustersim.workload.layers import LayerBlocks, bf16_layer_count
from clustersim.workload.ops import ACT_BYTES, fp8_amax, fp8_cast, layer_block

from .helpers import setup, tiny


def _ops(precision: str, scaling: str = "delayed") -> dict[str, Work]:
    model = tiny()
    par, train, lay = setup(4, tp=2, global_batch_size=8)
    train = train.model_copy(update={"precision": precision, "fp8": Fp8Cfg(scaling=scaling)})
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
    # the roofline's GEMMs and attention (the catalog's H100 takes both from its tables)
    roofline = {"gemm_times": "roofline", "attention_times": "roofline"}
    spec = catalog.chip("h100", {"calibration": {"attention_efficiency": 0.4, **roofline}})
    chip = ChipModel(spec, 1)
    gemm = Work((8192, 8192, 8192), 1, "bf16")
    attn = Work((8192, 8192, 8192), 1, "bf16", kernel="attention")
    ratio = chip.op_time(attn).engine_s[0] / chip.op_time(gemm).engine_s[0]
    assert ratio == pytest.approx(spec.calibration.tensor_efficiency / 0.4)
    # not set: the GEMM efficiency
    plain = ChipModel(catalog.chip("h100", {"calibration": roofline}), 1)
    assert plain.op_time(attn).seconds == plain.op_time(gemm).seconds


def test_current_scaling_takes_each_casts_amax_in_a_pass_of_its_own() -> None:
    delayed, current = _ops("fp8"), _ops("fp8", "current")
    casts = sorted(k for k in delayed if k.endswith(".cast"))
    amaxes = sorted(k for k in current if k.endswith(".amax"))
    assert amaxes == [k.removesuffix(".cast") + ".amax" for k in casts]
    assert not any(k.endswith(".amax") for k in delayed)
    m, k, _ = current["fwd:attn.qkv"].matmul or (0, 0, 0)
    # one more read of the BF16 input (2 B) and one max per element, before the cast
    assert current["fwd:attn.qkv.amax"] == fp8_amax(m, k)
    assert fp8_amax(m, k).hbm_bytes == ACT_BYTES * m * k
    assert fp8_amax(m, k).vector_ops == m * k
    assert current["fwd:attn.qkv.cast"] == delayed["fwd:attn.qkv.cast"]


def test_bf16_end_layers_run_their_linears_in_bf16() -> None:
    model = tiny()  # 8 layers
    par, train, lay = setup(4, tp=2, global_batch_size=8)
    train = train.model_copy(update={"precision": "fp8", "fp8": Fp8Cfg(bf16_layers=2)})
    dm = make_dims(model, par, train, lay)
    blocks = LayerBlocks(model, dm, precision="fp8", recompute="none", bf16_layers=2)
    kinds = ["bf16" if blocks[k] is blocks.bf16 else "fp8" for k in range(model.layers)]
    assert kinds == ["bf16"] * 2 + ["fp8"] * 4 + ["bf16"] * 2
    assert blocks.bf16 is not None
    ops = [t[3] for t in blocks.bf16.fwd if t[3] is not None]
    assert all(w.precision != "fp8" for w in ops if w.matmul is not None)
    assert not any(t[1].endswith(".cast") for t in (*blocks.bf16.fwd, *blocks.bf16.bwd))
    assert bf16_layer_count(model, train, range(8)) == 4
    assert bf16_layer_count(model, train, [2, 3, 6]) == 1
    bf16_train = train.model_copy(update={"precision": "bf16"})
    assert bf16_layer_count(model, bf16_train, range(8)) == 0  # only an FP8 recipe's


def test_bf16_end_layers_are_refused_for_moe_models() -> None:
    from clustersim.catalog import model as catalog_model

    moe = catalog_model("mixtral-8x7b")
    par, train, _ = setup(8, ep=2, global_batch_size=8)
    train = train.model_copy(update={"precision": "fp8", "fp8": Fp8Cfg(bf16_layers=1)})
    lay = make_layout(par, 8, 4)
    with pytest.raises(ScenarioError) as err:
        validate(moe, par, train, lay)
    assert err.value.path == "training.fp8.bf16_layers"


def test_fp8_grouped_expert_gemms_pay_for_their_casts() -> None:
    from clustersim.workload.layers import moe_sublayer
    from clustersim.workload.moe import stage_routing

    from .test_moe import moe_model

    model = moe_model(shared_experts=1)
    par, train, lay = setup(4, ep=4, global_batch_size=8)
    parts = {}
    for scaling in ("delayed", "current"):
        tr = train.model_copy(update={"precision": "fp8", "fp8": Fp8Cfg(scaling=scaling)})
        part = moe_sublayer(model, par, tr, lay)
        assert part is not None
        parts[scaling] = {f"{t[2]}:{t[1]}": t[3] for t in (*part.forward("fwd"), *part.bwd)}
    route = stage_routing(model, par, train, lay)
    rows, h = route.expert_rows * route.local_experts, model.hidden
    f = model.moe.expert_ffn_hidden if model.moe else 0
    delayed, current = parts["delayed"], parts["current"]
    assert delayed["fwd:moe.experts.up.cast"] == fp8_cast(rows, h)
    assert delayed["fwd:moe.experts.down.cast"] == fp8_cast(rows, f)
    assert delayed["bwd:moe.experts.down.grad.cast"] == fp8_cast(rows, h)
    assert delayed["bwd:moe.experts.up.grad.cast"] == fp8_cast(rows, 2 * f)
    shared = {k for k in delayed if k.split(":")[1].startswith("moe.shared")}
    assert {k for k in shared if k.endswith(".cast")} == {
        "fwd:moe.shared.up.cast", "fwd:moe.shared.down.cast",
        "bwd:moe.shared.down.grad.cast", "bwd:moe.shared.up.grad.cast",
    }  # fmt: skip
    assert not any(k.endswith(".amax") for k in delayed)
    assert current["fwd:moe.experts.up.amax"] == fp8_amax(rows, h)
    bf16 = moe_sublayer(model, par, train, lay)
    assert bf16 is not None
    assert not any(t[1].endswith((".cast", ".amax")) for t in (*bf16.forward("fwd"), *bf16.bwd))
