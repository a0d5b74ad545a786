"""Selective recompute by module, as Megatron-Core runs it (``recompute_modules``).

With ``parallelism.recompute: selective``, ``parallelism.recompute_modules`` lists
the modules whose forward is rerun in the backward instead of keeping what they
saved (Megatron-Core 0.14 ``TransformerConfig.recompute_modules``; absent, Megatron's
default ``[core_attn]``). What each one reruns and what it no longer keeps, from
Megatron-Core 0.14's ``transformer_layer``, ``multi_latent_attention``, ``moe_layer``
and ``moe/experts``:

- ``core_attn``: the attention core (its scores; the model's earlier ``selective``);
- ``mla_up_proj`` (MLA only): the latent norms, the query and key-value
  up-projections and RoPE (``qkv_up_proj_and_rope_apply`` under
  ``CheckpointWithoutOutput``); Q, K and V are freed once the core has run, so the
  core's saved inputs go too; the latents stay (the checkpoint's inputs);
- ``layernorm``: the norms that are modules of their own (MLA's input norm, an MoE
  layer's pre-MLP norm; a norm fused into the next linear, as Transformer Engine
  fuses the dense layers', is not affected); their outputs are not kept;
- ``mlp``: a dense layer's whole MLP, fused norm and TP collectives included (MoE
  layers are not affected); only its input is kept;
- ``moe``: an MoE layer's router, dispatch, experts, combine and shared experts,
  all-to-alls included; only the norm's output (its input) is kept;
- ``moe_act``: the experts' activation; the down-projection's input is not kept;
- ``shared_experts``: the shared experts' MLP; only its input is kept.

``parallelism.recompute_policy: op`` is torchtitan's selective activation checkpointing
instead (``activation_checkpoint.mode: selective`` with ``selective_ac_option: op``, the
stack's rule under ``software.stack: torchtitan``; torchtitan/distributed/
activation_checkpoint.py). Each transformer block runs under torch.utils.checkpoint with
a policy that saves the outputs of the ops in ``_save_list`` (``aten.mm``, the flash,
memory-efficient and cuDNN SDPA kernels, ``c10d_functional.reduce_scatter_tensor``,
``aten.max``) except every second ``mm`` (a counter per block and pass:
``to_save = func in _save_list and not (func == mm and count % 2 == 0)``, counted from 1),
and reruns every other op in the backward. A Llama block's matmuls run in the order wq,
wk, wv, wo, w1, w3, w2 (``w2(silu(w1(x)) * w3(x))``), so the outputs of wq, wv, w1 and w2
are kept, with the attention's output and log-sum-exp, the row-parallel reduce-scatters'
outputs (wo's and w2's, under sequence parallelism) and the block's input; wk, wo and w3
rerun (``op_kept`` and ``op_reruns``). A GeLU MLP's two matmuls are the fifth and
sixth: fc1's output is kept, fc2 reruns. The recompute is eager PyTorch's: every op that
is not saved reruns, the norms, RoPE, the activation and the sequence-parallel
all-gathers among them (unconfirmed under torch.compile, whose partitioner may drop the
reruns whose results are not needed, such as wo's GEMM when its reduce-scatter's output
is kept). Modelled for dense grouped-query-attention layers with flash attention in BF16
or FP16 without context parallelism: MoE experts (grouped GEMMs), MLA, FP8 linears
(``_scaled_mm``, not ``mm``) and ring attention depend on torchtitan versions this model
does not follow, and are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import get_args

from clustersim.catalog.schema import ModelSpec
from clustersim.errors import ScenarioError
from clustersim.scenario.models import ParallelismCfg, RecomputeModule
from clustersim.scenario.op_policy import op_policy_problem
from clustersim.workload.program import Phase
from clustersim.workload.templates import Tpl

__all__ = [
    "DEFAULT_MODULES",
    "MODULES",
    "OP_POLICY",
    "check_modules",
    "check_op_policy",
    "modules_of",
    "recompute_templates",
]

MODULES: tuple[str, ...] = get_args(RecomputeModule)
"""Megatron-Core's recompute modules, in forward order (``scenario.models.RecomputeModule``)."""

DEFAULT_MODULES: frozenset[str] = frozenset({"core_attn"})
"""Megatron-Core's default under ``recompute_granularity: selective``."""

OP_POLICY: frozenset[str] = frozenset({"op"})
"""What ``modules_of`` gives under torchtitan's op policy (``recompute_policy: op``): the
sublayers' ``op`` pieces rerun, and ``memory`` counts what the policy keeps."""

_MOE_ONLY = ("moe", "moe_act", "shared_experts")

Pieces = Mapping[str, Callable[[str], list[Tpl]]]


def modules_of(par: ParallelismCfg) -> frozenset[str]:
    """The modules selective recompute reruns (none without ``recompute: selective``)."""
    if par.recompute != "selective":
        return frozenset()
    if par.recompute_policy == "op":
        return OP_POLICY
    if par.recompute_modules is None:
        return DEFAULT_MODULES
    return frozenset(par.recompute_modules)


def check_op_policy(model: ModelSpec, par: ParallelismCfg, precision: str) -> None:
    """Refuse a ``recompute_policy`` the setting or the model cannot run (``ScenarioError``)."""
    policy = par.recompute_policy
    key = "parallelism.recompute_policy"
    if policy is not None and par.recompute != "selective":
        why = f"applies to recompute: selective only (recompute is {par.recompute})"
        raise ScenarioError(key, policy, why)
    if policy != "op":
        return
    problem = op_policy_problem(model, par, precision)
    if problem is not None:
        raise ScenarioError(key, policy, problem)


def check_modules(model: ModelSpec, par: ParallelismCfg) -> None:
    """Refuse modules that the setting or the model cannot run (``ScenarioError``)."""
    mods = par.recompute_modules
    if mods is None:
        return
    key = "parallelism.recompute_modules"
    if par.recompute != "selective":
        raise ScenarioError(
            key, mods, f"applies to recompute: selective only (recompute is {par.recompute})"
        )
    if "mla_up_proj" in mods and model.mla is None:
        raise ScenarioError(
            key, mods, f"mla_up_proj needs multi-head latent attention; {model.name} has none"
        )
    moe_only = [m for m in mods if m in _MOE_ONLY]
    if moe_only and model.moe is None:
        raise ScenarioError(key, mods, f"{moe_only[0]} needs a MoE model; {model.name} is dense")
    if model.moe is not None and model.moe.shared_experts == 0 and "shared_experts" in mods:
        raise ScenarioError(key, mods, f"shared_experts: {model.name} has no shared experts")


def recompute_templates(attn: Pieces, ffn: Pieces, modules: frozenset[str]) -> tuple[Tpl, ...]:
    """What selective recompute reruns of one layer, from its sublayers' pieces.

    A sublayer offers the modules it has (``ops.Part.pieces``); a dense MLP has
    ``mlp``, an MoE sublayer ``moe``, ``moe_act`` and ``shared_experts``. ``moe``
    reruns the other two with it.
    """
    if modules == OP_POLICY:  # torchtitan's: each sublayer's op piece
        return tuple(t for part in (attn, ffn) for t in part["op"](Phase.RECOMPUTE))
    chosen = set(modules)
    if "moe" in chosen:
        chosen -= {"moe_act", "shared_experts"}
    out: list[Tpl] = []
    for part in (attn, ffn):
        for name in MODULES:
            if name in chosen and name in part:
                out += part[name](Phase.RECOMPUTE)
    return tuple(out)
