"""The op templates of each layer of a model: which attention, which feed-forward.

A dense model has one kind of layer, so one ``Block`` serves every layer. A
model may mix kinds: multi-head latent attention (``mla``) or grouped-query
attention, and a dense MLP or a mixture of experts (``moe``) after the first
``moe.dense_layers``. Each kind is built once and shared by the layers of that
kind, so the simulator's per-``Work`` duration cache still hits.
"""

from __future__ import annotations

from clustersim.catalog.schema import ModelSpec
from clustersim.scenario.models import MoECfg, ParallelismCfg, TrainingCfg
from clustersim.workload.dims import Dims, make_dims
from clustersim.workload.layout import Layout
from clustersim.workload.mla import mla_attention_part
from clustersim.workload.moe import moe_part, stage_routing
from clustersim.workload.ops import Block, Part, attention_part, compose, mlp_part

__all__ = ["LayerBlocks", "moe_sublayer"]


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
        attention: str = "flash",
        moe_part: Part | None = None,
    ) -> None:
        if model.mla is not None:
            attn = mla_attention_part(dm, model.mla, precision, recompute)
        else:
            attn = attention_part(dm, precision, recompute, attention)
        self.dense = compose(attn, mlp_part(dm, precision), recompute)
        self.moe = compose(attn, moe_part, recompute) if moe_part is not None else None
        self.dense_layers = model.moe.dense_layers if model.moe is not None else model.layers

    def __getitem__(self, layer: int) -> Block:
        if self.moe is None or layer < self.dense_layers:
            return self.dense
        return self.moe

    def kinds(self) -> list[Block]:
        """The distinct blocks, dense first."""
        return [self.dense] if self.moe is None else [self.dense, self.moe]
