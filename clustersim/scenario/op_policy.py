"""Whether torchtitan's per-op selective checkpointing (``recompute_policy: op``) is modelled
for a setting: the scenario loader falls back to Megatron's module rule where the stack's
default would ask for it and it is not, and ``workload.recompute`` refuses it where a
scenario names it."""

from __future__ import annotations

from clustersim.catalog.schema import ModelSpec
from clustersim.scenario.models import ParallelismCfg

__all__ = ["op_policy_problem"]


def op_policy_problem(model: ModelSpec, par: ParallelismCfg, precision: str) -> str | None:
    """Why torchtitan's op policy (``recompute_policy: op``) cannot run this setting, or None."""
    if par.recompute_modules is not None:
        return "op decides per op, not per module: leave out recompute_modules"
    stay = "; use recompute_policy: modules, or recompute: full or none"
    if model.moe is not None or model.mla is not None:
        kind = "a mixture of experts" if model.moe is not None else "multi-head latent attention"
        return f"torchtitan's op policy is modelled for dense layers; {model.name} has {kind}{stay}"
    if par.attention != "flash":
        return (
            "torchtitan's op policy saves SDPA's output: needs "
            f"attention: flash (attention is {par.attention}){stay}"
        )
    if par.cp > 1:
        why = "torchtitan's context parallelism (ring attention over SDPA) under the op policy is "
        return f"{why}not modelled (cp is {par.cp}){stay}"
    if precision == "fp8":
        why = "torchtitan's FP8 linears run _scaled_mm, which the op policy's mm count does not"
        return f"{why} model (unconfirmed){stay}"
    return None
