"""The op templates of each layer of a model: which attention, which feed-forward.

A dense model has one kind of layer, so one ``Block`` serves every layer. A
model may mix kinds: multi-head latent attention (``mla``) or grouped-query
attention, and a dense MLP or a mixture of experts (``moe``) after the first
``moe.dense_layers``. Each kind is built once and shared by the layers of that
kind, so the simulator's per-``Work`` duration cache still hits. Under an FP8
recipe with ``training.fp8.bf16_layers: n`` the first and last n dense layers are
a kind of their own, lowered in BF16.
"""

from __future__ import annotations

from collections.abc import Sequence

from clustersim.catalog.schema import ModelSpec
from clustersim.scenario.models import MoECfg, ParallelismCfg, TrainingCfg
from clustersim.workload.dims import Dims, make_dims
from clustersim.workload.layout import Layout
from clustersim.workload.mla import mla_attention_part
from clustersim.workload.moe import moe_part, stage_routing
from clustersim.workload.ops import Block, Part, attention_part, compose, mlp_part
from clustersim.workload.recompute import DEFAULT_MODULES
from clustersim.workload.titan import elementwise_for

__all__ = ["LayerBlocks", "bf16_layer_count", "moe_sublayer"]


def moe_sublayer(
    model: ModelSpec,
    par: ParallelismCfg,
    train: TrainingCfg,
    layout: Layout,
    *,
    cfg: MoECfg | None = None,
    seed: int = 0,
) -> Part | None:
    """The MoE sublayer of the model's MoE layers, with its routing; none for a dense model."""
    if model.moe is None:
        return None
    dm = make_dims(model, par, train, layout)
    route = stage_routing(model, par, train, layout, cfg=cfg, seed=seed)
    return moe_part(dm, model.moe, route, train.precision)


class LayerBlocks:
    """The ``Block`` of every layer index, built once per kind of layer."""

    def __init__(
        self,
        model: ModelSpec,
        dm: Dims,
        *,
        precision: str,
        recompute: str,
        modules: frozenset[str] = DEFAULT_MODULES,
        attention: str = "flash",
        moe_part: Part | None = None,
        bf16_layers: int = 0,
        lowering: str = "fused",
    ) -> None:
        # torchtitan's eager or compiled kernels for a dense Llama-style block, else the
        # fused lowering (``workload.titan``)
        ew = elementwise_for(lowering, model, dm, precision, attention)

        def attn(prec: str) -> Part:
            if model.mla is not None:
                return mla_attention_part(dm, model.mla, prec, recompute)
            return attention_part(dm, prec, recompute, attention, ew)  # FUSED under FP8

        main = attn(precision)
        self.dense = compose(main, mlp_part(dm, precision, ew), recompute, modules)
        self.moe = compose(main, moe_part, recompute, modules) if moe_part is not None else None
        self.dense_layers = model.moe.dense_layers if model.moe is not None else model.layers
        self.layers = model.layers
        # MoE models are refused (workload.checks.validate): their experts' precision
        # is set where the MoE sublayer is built.
        self.bf16_layers = bf16_layers if precision == "fp8" else 0
        self.bf16 = None
        if self.bf16_layers:
            self.bf16 = compose(attn("bf16"), mlp_part(dm, "bf16"), recompute, modules)

    def in_bf16(self, layer: int) -> bool:
        """Whether ``layer`` is one of the FP8 recipe's BF16 layers at either end."""
        n = self.bf16_layers
        return n > 0 and (layer < n or layer >= self.layers - n)

    def __getitem__(self, layer: int) -> Block:
        if self.bf16 is not None and self.in_bf16(layer):
            return self.bf16
        if self.moe is None or layer < self.dense_layers:
            return self.dense
        return self.moe

    def kinds(self) -> list[Block]:
        """The distinct blocks, dense first."""
        out = [self.dense] if self.moe is None else [self.dense, self.moe]
        return out + ([self.bf16] if self.bf16 is not None else [])


def bf16_layer_count(model: ModelSpec, train: TrainingCfg, layers: Sequence[int]) -> int:
    """How many of ``layers`` the FP8 recipe keeps in BF16 (``training.fp8.bf16_layers``)."""
    n = train.fp8.bf16_layers if train.precision == "fp8" else 0
    return sum(1 for k in layers if n > 0 and (k < n or k >= model.layers - n))
