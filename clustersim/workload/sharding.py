"""Sharded data parallelism: ZeRO-2, ZeRO-3 (PyTorch FSDP2 semantics) and hybrid sharding.

The state ZeRO-2 and 3 shard is split over the ``dp_shard`` group
(``parallelism.dp_shard`` consecutive DP ranks, all of ``dp`` by default, with
every CP rank of theirs: ``Layout.shard_size`` ranks; ZeRO-1 shards over ``dp``,
or ``dp_cp`` under CP); the ``dp / dp_shard`` replicas of each shard (the
``dp_replicate`` group) all-reduce their gradient shards (HSDP):

- ``zero: 1`` shards the Adam state (Megatron's distributed optimizer);
- ``zero: 2`` also the gradients: every microbatch's backward reduce-scatters its
  gradient buckets into the shards as they complete, and after the Adam step the
  updated bf16 parameters are all-gathered in the same buckets;
- ``zero: 3`` also the parameters (FSDP). Each FSDP unit (``fsdp.unit``: a
  transformer block, the embedding and the LM head each a unit of their own; or
  every parameter of a stage's model chunk) is all-gathered before its forward
  and, with ``fsdp.reshard_after_forward`` (the default), again before its
  backward (a recompute counts as the backward's use); its gradients are
  reduce-scattered after each backward. The gathers run one after another, as on
  FSDP2's all-gather stream: before a unit computes, the rank waits for the
  unit's gather, then starts the gathers of the next ``fsdp.prefetch`` units (0
  gathers on demand), so they overlap with the unit's compute. There is no
  gather after the optimizer: the next step's forward gathers again.

With replicas (``dp_shard < dp``) each unit's (or bucket's) gradient shard is
all-reduced over ``dp_replicate`` once per step, after its last microbatch's
reduce-scatter: the rank waits for that reduce-scatter when it starts the next
one, so the two never overlap on the same bytes.

MoE models: the routed experts' parameters, gradients and Adam state are sharded over
the expert shard group (``Layout.expert_shard_group``: ``edp``, the ranks holding the
same experts, or with replicas ``edp_shard``, those of one replica) instead of
``dp_shard``, and each unit's experts are gathered and reduce-scattered over it,
beside its dense part over ``dp_shard``. With replicas the expert gradient shards
are all-reduced over ``dp_replicate`` too, after their own final reduce-scatter, as
torchtitan's HSDP does over its replicate dimension.

Memory per rank (P parameters on the rank after TP and PP, S = dp_shard x cp, U the
largest unit, B the gradient bucket in bytes; bf16 weights and gradients, 12 B of Adam
state per parameter; for MoE models read P/S as P_dense/S + P_experts/E with E the
expert shard group's size, ``edp / (dp / dp_shard)``):

- zero 0: weights 2P, gradients 2P, optimizer 12P;
- zero 1: optimizer 12P/S;
- zero 2: gradients 2P/S + min(2B, 2P) (two buckets: one filling, one reducing),
  optimizer 12P/S;
- zero 3: weights 2P/S + 2 (1 + prefetch) U (the unit computing and those
  prefetched), gradients 2P/S + 2 * 2U (a unit's gradients computing, and the
  previous unit's being reduce-scattered), optimizer 12P/S.

Without ``reshard_after_forward`` a ZeRO-3 rank keeps every unit it gathered until
its backward: 2P/S + 2P of weights; with a pipeline (pp > 1) it keeps them for the
whole step, as PyTorch's pipelining schedules do with FSDP, so each unit is
gathered once per step rather than once per microbatch. Divisions round up.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.catalog.schema import ModelSpec
from clustersim.scenario.models import ParallelismCfg
from clustersim.workload.dims import (
    EXPERT_PIECES,
    chunk_layers,
    embed_pieces,
    head_pieces,
    is_moe_layer,
    layer_pieces,
    moe_layer_pieces,
    stage_pieces,
)
from clustersim.workload.layout import Layout
from clustersim.workload.program import Instr, Kind, Phase, Program

__all__ = [
    "EMBED_UNIT",
    "HEAD_UNIT",
    "ShardedState",
    "adam_bytes",
    "shard_program",
    "sharded_state",
    "stage_units",
    "unit_parts",
]

# As ``memory.WEIGHT_BYTES_PER_PARAM`` (= GRAD_) and ``OPTIMIZER_BYTES_PER_PARAM``.
BYTES = 2  # bf16 weights and gradients, on the wire too
ADAM_BYTES = 12
EMBED_UNIT = "embed"
HEAD_UNIT = "head"
_HEAD_OPS = frozenset({"final_norm", "lm_head", "loss"})


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def unit_parts(
    model: ModelSpec, layout: Layout, stage: int, unit: str
) -> dict[str, tuple[int, int]]:
    """(dense, routed-expert) parameters one rank of ``stage`` holds per FSDP unit, in
    forward order: the dense part is sharded over ``dp_shard``, the experts' over
    the expert shard group (MoE models; 0 for dense ones).

    ``unit: layer``: the embedding (first stage), each layer (``L<index>``), the head
    (last stage). ``unit: stage``: one unit per local model chunk (``C<chunk>``),
    holding its layers and the embedding or head that run with it.
    """
    tp = layout.tp
    dense_layer = (sum(n for _, n in layer_pieces(model, tp)), 0)
    moe_layer = dense_layer
    if model.moe is not None:
        pieces = moe_layer_pieces(model, layout)
        expert = sum(n for name, n in pieces if name in EXPERT_PIECES)
        moe_layer = (sum(n for _, n in pieces) - expert, expert)
    embed = (sum(n for _, n in embed_pieces(model, tp)), 0)
    head = (sum(n for _, n in head_pieces(model, tp)), 0)
    out: dict[str, tuple[int, int]] = {}
    for k in range(layout.vp):
        first = stage == 0 and k == 0
        last = stage == layout.pp - 1 and k == layout.vp - 1
        layers = [moe_layer if is_moe_layer(model, i) else dense_layer
                  for i in chunk_layers(model, layout, stage, k)]  # fmt: skip
        if unit == "stage":
            parts = [*layers, *([embed] if first else []), *([head] if last else [])]
            out[f"C{k}"] = (sum(d for d, _ in parts), sum(e for _, e in parts))
            continue
        if first:
            out[EMBED_UNIT] = embed
        for i, part in zip(chunk_layers(model, layout, stage, k), layers, strict=True):
            out[f"L{i}"] = part
        if last:
            out[HEAD_UNIT] = head
    return out


def stage_units(model: ModelSpec, layout: Layout, stage: int, unit: str) -> dict[str, int]:
    """Parameters one rank of ``stage`` holds per FSDP unit, in forward order
    (:func:`unit_parts`, dense and expert parts together)."""
    return {k: d + e for k, (d, e) in unit_parts(model, layout, stage, unit).items()}


# -- memory ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardedState:
    """Bytes per rank of the model state under one ZeRO level, with their parts."""

    weights: float
    grads: float
    optimizer: float
    parts: tuple[tuple[str, float], ...] = ()
    """Named components (shards, gathered units, prefetch buffer, ...) for ``check``."""


def adam_bytes(moments: str) -> int:
    """Adam's bytes per parameter: the fp32 master weight and two moments of ``moments``."""
    return 4 + 2 * (2 if moments == "bf16" else 4)


def sharded_state(
    model: ModelSpec, par: ParallelismCfg, layout: Layout, stage: int, *, adam: int = ADAM_BYTES
) -> ShardedState:
    """Weights, gradients and optimizer state of one rank of ``stage`` (see the module doc).

    ``adam``: the optimizer's bytes per parameter (``adam_bytes``).
    """
    pieces = stage_pieces(model, layout, stage)
    params = sum(n for _, _, n in pieces)
    expert = sum(n for _, name, n in pieces if name in EXPERT_PIECES)
    # The dense state is sharded over the group that reduces its gradients (DP x CP
    # under context parallelism, as Megatron-Core), the routed experts' over their
    # expert shard group (edp, or one replica's part of it under hybrid sharding).
    shard = layout.optimizer_shard(par.zero)
    sharded = _ceil_div(params - expert, shard) + _ceil_div(expert, layout.expert_shard)
    full_w, full_g = float(BYTES * params), float(BYTES * params)
    zero = par.zero
    if zero == 0:
        return ShardedState(full_w, full_g, float(adam * params))
    opt = float(adam * sharded)
    if zero == 1:
        return ShardedState(full_w, full_g, opt, (("optimizer shard", opt),))
    g_shard = float(BYTES * sharded)
    if zero == 2:
        buckets = float(BYTES * min(2 * par.grad_bucket_bytes // BYTES, params))
        parts = (("grad shard", g_shard), ("grad buckets", buckets), ("optimizer shard", opt))
        return ShardedState(full_w, g_shard + buckets, opt, parts)
    units = stage_units(model, layout, stage, par.fsdp.unit)
    largest = max(units.values())
    w_shard = float(BYTES * sharded)
    gathered: tuple[tuple[str, float], ...]
    if par.fsdp.reshard_after_forward:
        current = float(BYTES * largest)
        prefetched = float(BYTES * largest * min(par.fsdp.prefetch, len(units) - 1))
        gathered = (
            ("gathered unit", current),
            ("prefetch buffer", prefetched),
        )
    else:
        gathered = (("gathered units (kept to backward)", full_w),)
    unit_grads = float(2 * BYTES * largest)
    parts = (
        ("weight shard", w_shard),
        *gathered,
        ("grad shard", g_shard),
        ("unit grads (computing, reducing)", unit_grads),
        ("optimizer shard", opt),
    )
    weights = w_shard + sum(v for _, v in gathered)
    return ShardedState(weights, g_shard + unit_grads, opt, parts)


# -- programs ----------------------------------------------------------------------------


def _unit_of(ins: Instr, current: str | None, unit: str, layer_chunk: dict[int, str]) -> str | None:
    """The FSDP unit whose parameters ``ins`` uses; TP and CP collectives (the CP
    ring's transfers too) belong to the unit around them, and so do an MoE layer's
    expert-parallel ones (its dispatch and combine); anything else (pipeline
    messages, DP traffic) to none."""
    if ins.kind == Kind.COMPUTE:
        if ins.phase == Phase.OPTIMIZER:
            return None
        if ins.layer >= 0:
            return layer_chunk[ins.layer] if unit == "stage" else f"L{ins.layer}"
        if unit == "stage":
            # The embedding runs with chunk 0, the head with the stage's last chunk.
            return "C0" if ins.name == "embed" else layer_chunk[-1]
        return HEAD_UNIT if ins.name.split(".", 1)[0] in _HEAD_OPS else EMBED_UNIT
    blocking = ins.kind == Kind.COLLECTIVE and ins.group in ("tp", "cp", "ep", "etp")
    # The CP ring's transfers and the TP backward's overlapped collectives (tp_comm).
    inside = ins.kind in (Kind.ASYNC_COLLECTIVE, Kind.WAIT_ASYNC) and ins.group in ("cp", "tp")
    return current if blocking or inside else None


@dataclass
class _Use:
    unit: str
    backward: bool
    microbatch: int
    start: int  # index of the use's first instruction
    end: int  # one past its last


def _uses(prog: Program, unit: str, layer_chunk: dict[int, str]) -> list[_Use]:
    """The runs of consecutive instructions that compute with one unit in one pass."""
    uses: list[_Use] = []
    current: _Use | None = None
    for i, ins in enumerate(prog.instrs):
        name = _unit_of(ins, current.unit if current else None, unit, layer_chunk)
        if name is None:
            current = None
            continue
        backward = ins.phase != Phase.FORWARD
        if (
            current is not None
            and current.unit == name
            and current.backward == backward
            and current.microbatch == ins.microbatch
        ):
            current.end = i + 1
            continue
        current = _Use(name, backward, ins.microbatch, i, i + 1)
        uses.append(current)
    return uses


def _async(group: str, collective: str, phase: str, nbytes: float, mb: int) -> Instr:
    return Instr(
        Kind.ASYNC_COLLECTIVE,
        f"{group}.{collective}",
        phase,
        -1,
        mb,
        collective=collective,
        group=group,
        nbytes=float(nbytes),
    )


def _wait(group: str, collective: str, keep: int) -> Instr:
    return Instr(
        Kind.WAIT_ASYNC,
        f"{group}.wait",
        Phase.GRAD_SYNC if collective != "all_gather" else Phase.PARAM_SYNC,
        collective=collective,
        group=group,
        tag=keep,
    )


def shard_program(
    prog: Program, model: ModelSpec, par: ParallelismCfg, layout: Layout, microbatches: int
) -> None:
    """Add ZeRO-3's gathers and reduce-scatters, and HSDP's replica all-reduces, to ``prog``.

    ``prog`` is a stage's program up to its final wait for DP traffic (the last
    instruction), built without ZeRO-3's traffic; ZeRO-2's bucket reduce-scatters
    are already in it. See the module doc for what goes where.
    """
    instrs = prog.instrs
    if not instrs or instrs[-1].kind != Kind.WAIT_ASYNC:
        raise ValueError("shard_program expects a program ending with its DP wait")
    final_wait = instrs.pop()
    last_mb = microbatches - 1
    # Instructions to insert before (index, 0) and after (index, 1) an instruction.
    before: dict[int, list[Instr]] = {}
    after: dict[int, list[Instr]] = {}
    if par.zero == 3:
        _fsdp(prog, model=model, par=par, layout=layout, before=before, after=after)
    out: list[Instr] = []
    replicas = layout.replicas > 1
    # Each shard group's last final reduce-scatter's shard, not yet reduced: the dense
    # one's over dp_shard, the experts' over their group (both over dp_replicate).
    sizes = {"dp_shard": layout.shard_size, "edp_shard": layout.expert_shard}
    previous: dict[str, float] = {}
    for i, ins in enumerate(instrs):
        out += before.get(i, ())
        for extra in (ins, *after.get(i, ())):
            out.append(extra)
            is_final_rs = (
                extra.kind == Kind.ASYNC_COLLECTIVE
                and extra.group in sizes
                and extra.collective == "reduce_scatter"
                and extra.microbatch == last_mb
            )
            if replicas and is_final_rs:
                group = extra.group
                if group in previous:
                    out.append(_wait(group, "reduce_scatter", 1))
                    out.append(
                        _async(
                            "dp_replicate", "all_reduce", Phase.GRAD_SYNC, previous[group], last_mb
                        )
                    )
                previous[group] = _ceil_div(int(extra.nbytes), sizes[group])
    for group, shard_bytes in previous.items():
        out.append(_wait(group, "reduce_scatter", 0))
        out.append(_async("dp_replicate", "all_reduce", Phase.GRAD_SYNC, shard_bytes, last_mb))
    out.append(final_wait)
    prog.instrs[:] = out


def _fsdp(
    prog: Program,
    *,
    model: ModelSpec,
    par: ParallelismCfg,
    layout: Layout,
    before: dict[int, list[Instr]],
    after: dict[int, list[Instr]],
) -> None:
    """Plan ZeRO-3's per-unit gathers (before uses) and reduce-scatters (after backward uses)."""
    cfg = par.fsdp
    layer_chunk = {
        i: f"C{k}" for k in range(layout.vp) for i in chunk_layers(model, layout, prog.stage, k)
    }
    layer_chunk[-1] = f"C{layout.vp - 1}"  # the head's chunk
    units = unit_parts(model, layout, prog.stage, cfg.unit)
    uses = _uses(prog, cfg.unit, layer_chunk)
    gathered = [u for u in uses if cfg.reshard_after_forward or not u.backward]
    if not cfg.reshard_after_forward and layout.pp > 1:
        # A pipeline keeps the units gathered from their first forward to the end of
        # the step (as PyTorch's pipelining schedules do with FSDP): one gather each.
        first: dict[str, _Use] = {}
        for use in gathered:
            first.setdefault(use.unit, use)
        gathered = list(first.values())
    issued = 0
    # Each group's gathers in issue order: a unit's dense part over dp_shard, its
    # routed experts' over their shard group. A wait lets the later gathers of its
    # group run on.
    groups = ("dp_shard", layout.expert_shard_group)
    streams: dict[str, list[int]] = {group: [] for group in groups}
    if layout.edp == 1:  # every rank holds its experts whole: nothing to gather or reduce
        units = {k: (d, 0) for k, (d, _) in units.items()}
    # A replica holding its experts whole gathers none, but still reduce-scatters over
    # its one-member group, which starts the replicas' all-reduce.
    skip_expert_gather = layout.expert_shard == 1

    def gather(j: int, at: list[Instr]) -> None:
        use = gathered[j]
        for group, params in zip(groups, units[use.unit], strict=True):
            if not params or (skip_expert_gather and group != "dp_shard"):
                continue
            nbytes = BYTES * params
            ins = _async(group, "all_gather", Phase.PARAM_SYNC, nbytes, use.microbatch)
            ins.layer = prog.instrs[use.start].layer
            at.append(ins)
            streams[group].append(j)

    for j, use in enumerate(gathered):
        at = before.setdefault(use.start, [])
        if issued <= j:
            gather(j, at)
            issued = j + 1
        for group, order in streams.items():
            if j in order:
                at.append(_wait(group, "all_gather", len(order) - 1 - order.index(j)))
        while issued < len(gathered) and issued <= j + cfg.prefetch:
            gather(issued, at)
            issued += 1
    for use in uses:
        if use.backward:
            for group, params in zip(groups, units[use.unit], strict=True):
                if not params:
                    continue
                nbytes = BYTES * params
                rs = _async(group, "reduce_scatter", Phase.GRAD_SYNC, nbytes, use.microbatch)
                rs.layer = prog.instrs[use.end - 1].layer
                after.setdefault(use.end - 1, []).append(rs)
