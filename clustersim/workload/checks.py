"""Whether a model can be cut as a :class:`~.layout.Layout` says: the scenario's checks
of the layout against the model, the training settings and each other.

:func:`validate` raises :class:`~clustersim.errors.ScenarioError` naming the key and
its bad value (exit 2), with the values that would work where there are few: heads,
widths and layers that TP, EP and PP must divide, the batch that DP and the
microbatch size must divide, the sequence that CP and sequence parallelism split,
and the settings that MoE layers, interleaved and DualPipe schedules and sharded
data parallelism are modelled with. How ranks map to groups, and the checks of the
sizes themselves against the cluster, are :func:`~.layout.make_layout`'s.
"""

from __future__ import annotations

from clustersim.catalog.schema import ModelSpec
from clustersim.errors import ScenarioError
from clustersim.scenario.models import ParallelismCfg, TrainingCfg
from clustersim.workload.layout import Layout, divisors
from clustersim.workload.recompute import check_modules, check_op_policy

__all__ = ["validate"]


def validate(model: ModelSpec, par: ParallelismCfg, train: TrainingCfg, layout: Layout) -> None:
    """Check that ``model`` can be cut as ``layout`` says; raise ``ScenarioError`` if not.

    Sizes come from ``layout``; the rest (microbatch size, sequence parallelism)
    from ``par``. A sequence longer than ``model.max_seq_len`` is allowed. The
    vocabulary is padded for TP rather than rejected.
    """
    tp, pp, cp = layout.tp, layout.pp, layout.cp
    check_modules(model, par)
    check_op_policy(model, par, train.precision)
    if train.param_dtype == "fp32" and par.zero >= 2:  # sharding.BYTES is bf16's
        why = "FP32 parameters are modelled for zero 0 and 1 (sharded ones are bf16)"
        raise ScenarioError("training.param_dtype", train.param_dtype, why)
    if not model.causal and cp > 1:
        raise ScenarioError(
            "parallelism.cp",
            cp,
            f"{model.name} is an encoder (model.causal: false); context parallelism is "
            "modelled for causal attention only: set cp: 1",
        )
    if model.moe is not None:
        _validate_moe(model, par, layout)
        if train.precision == "fp8" and train.fp8.bf16_layers:
            raise ScenarioError(
                "training.fp8.bf16_layers",
                train.fp8.bf16_layers,
                "BF16 layers at the ends are modelled for dense models only (an MoE layer's "
                "experts take the recipe's precision)",
            )
    elif layout.ep > 1:
        raise ScenarioError(
            "parallelism.ep",
            layout.ep,
            f"expert parallelism needs a MoE model, and {model.name} is dense; set ep: 1",
        )
    if model.heads % tp:
        raise ScenarioError(
            "parallelism.tp",
            tp,
            f"{model.name} has {model.heads} attention heads, not divisible by tp; "
            f"valid tp: {divisors(model.heads)}",
        )
    if model.kv_heads % tp and tp % model.kv_heads:
        raise ScenarioError(
            "parallelism.tp",
            tp,
            f"{model.name} has {model.kv_heads} KV heads: tp must divide them or be a multiple "
            "of them (KV heads are then replicated)",
        )
    if model.ffn_hidden % tp:
        raise ScenarioError(
            "parallelism.tp",
            tp,
            f"{model.name}'s MLP width {model.ffn_hidden} is not divisible by tp",
        )
    if model.layers < pp or (model.layers % pp and not par.uneven_stages):
        raise ScenarioError(
            "parallelism.pp",
            pp,
            f"{model.name} has {model.layers} layers, not divisible by pp; "
            f"valid pp: {divisors(model.layers)}, or set parallelism.uneven_stages: true",
        )
    per_step = layout.dp * par.microbatch_size
    if train.global_batch_size % per_step:
        raise ScenarioError(
            "training.global_batch_size",
            train.global_batch_size,
            f"must be a multiple of dp*microbatch_size = {layout.dp}*{par.microbatch_size} "
            f"= {per_step}",
        )
    if layout.shard != layout.dp and par.zero < 2:
        raise ScenarioError(
            "parallelism.dp_shard",
            layout.shard,
            f"hybrid sharding (dp_shard < dp = {layout.dp}) shards gradients or parameters; "
            f"set parallelism.zero: 2 or 3 (zero is {par.zero}), or omit dp_shard",
        )
    if layout.vp > 1:
        _validate_interleaving(model, par, train, layout)
    seq_multiple = tp * cp if par.sequence_parallel and tp > 1 else cp
    if train.seq_len % seq_multiple:
        why = (
            "tp*cp (sequence parallelism splits each CP chunk over TP)"
            if seq_multiple != cp
            else "cp"
        )
        raise ScenarioError(
            "training.seq_len",
            train.seq_len,
            f"must be a multiple of {why} = {seq_multiple}",
        )


def _validate_moe(model: ModelSpec, par: ParallelismCfg, layout: Layout) -> None:
    moe = model.moe
    assert moe is not None  # the caller checked
    ep, etp = layout.ep, layout.etp
    if ep > moe.experts:
        raise ScenarioError(
            "parallelism.ep",
            ep,
            f"{model.name} has {moe.experts} experts per layer: ep can be at most that",
        )
    if moe.experts % ep:
        raise ScenarioError(
            "parallelism.ep",
            ep,
            f"{model.name}'s {moe.experts} experts must split evenly over ep; "
            f"valid ep: {divisors(moe.experts)}",
        )
    if moe.expert_ffn_hidden % etp:
        raise ScenarioError(
            "parallelism.etp",
            etp,
            f"{model.name}'s expert width {moe.expert_ffn_hidden} is not divisible by etp",
        )
    if moe.shared_experts and (moe.shared_experts * moe.expert_ffn_hidden) % layout.tp:
        raise ScenarioError(
            "parallelism.tp",
            layout.tp,
            f"{model.name}'s shared-expert width is not divisible by tp",
        )
    if par.zero == 3 and par.overlap_moe_a2a and layout.ep > 1:
        raise ScenarioError(
            "parallelism.overlap_moe_a2a",
            par.overlap_moe_a2a,
            "overlapping two microbatches' all-to-alls interleaves their layers, which FSDP's "
            "per-unit gathers (zero: 3) are not modelled with yet; use zero 0-2 or turn it off",
        )
    if (layout.tp > 1 or etp > 1) and not par.sequence_parallel:
        raise ScenarioError(
            "parallelism.sequence_parallel",
            par.sequence_parallel,
            "MoE layers with tensor parallelism need sequence parallelism (as Megatron-Core "
            "requires): each rank routes its own sequence shard",
        )


def _validate_interleaving(
    model: ModelSpec, par: ParallelismCfg, train: TrainingCfg, layout: Layout
) -> None:
    v, pp = layout.vp, layout.pp
    if pp == 1:
        raise ScenarioError(
            "parallelism.virtual_stages", v, "model chunks interleave pipeline stages; set pp > 1"
        )
    if par.schedule == "dualpipe":
        _validate_dualpipe(model, par, train, layout)
        return
    if par.schedule != "1f1b":
        raise ScenarioError(
            "parallelism.virtual_stages",
            v,
            f"interleaving needs schedule 1f1b (got {par.schedule}); or set virtual_stages: 1",
        )
    chunks = pp * v
    if model.layers < chunks or (model.layers % chunks and not par.uneven_stages):
        raise ScenarioError(
            "parallelism.virtual_stages",
            v,
            f"{model.name} has {model.layers} layers, not divisible by pp*virtual_stages = "
            f"{chunks}; or set parallelism.uneven_stages: true",
        )
    n_mb = train.global_batch_size // (layout.dp * par.microbatch_size)
    if n_mb % pp:
        raise ScenarioError(
            "parallelism.virtual_stages",
            v,
            f"interleaved 1F1B needs the microbatches per replica ({n_mb} = global batch / "
            f"(dp*microbatch_size)) to be a multiple of pp = {pp}",
        )


def _validate_dualpipe(
    model: ModelSpec, par: ParallelismCfg, train: TrainingCfg, layout: Layout
) -> None:
    chunks = layout.chunks
    if model.layers < chunks or (model.layers % chunks and not par.uneven_stages):
        raise ScenarioError(
            "parallelism.schedule",
            par.schedule,
            f"dualpipe cuts {model.name}'s {model.layers} layers into 2 pp = {chunks} chunks, "
            "which do not divide them; set parallelism.uneven_stages: true or change pp",
        )
    n_mb = train.global_batch_size // (layout.dp * par.microbatch_size)
    if n_mb < 2 * layout.pp:
        raise ScenarioError(
            "parallelism.schedule",
            par.schedule,
            f"dualpipe needs at least 2 pp = {2 * layout.pp} microbatches per replica (got "
            f"{n_mb} = global batch / (dp*microbatch_size))",
        )
    if par.zero >= 2:
        raise ScenarioError(
            "parallelism.zero",
            par.zero,
            "schedule dualpipe is lowered with ZeRO 0 or 1; sharded gradients or parameters "
            "are not modelled with it",
        )
