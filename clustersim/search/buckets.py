"""When a stage's gradient buckets are ready, and what of their reduction the step waits for.

The simulator starts a bucket's collective when the backward op that completes the
last gradient in it has run (``workload.transformer.grad_buckets``; ``Block.grad_ready``
names the pieces each op completes), in the last microbatch's backward. So the
step waits for what is still queued when the backward ends: the embedding's
buckets, say, are all ready at the very end, and none of them hides.

:func:`ready_offsets` times each piece of a block from the start of its backward
(its recompute first), with the estimate's own op and collective times;
:func:`grad_tail_s` lays the blocks of a stage's last backward end to end (the LM
head, the layers in reverse, the embedding), and runs its buckets one after the
other from their ready times, every stream in one queue (collectives in flight at
once share the links, so their total time is about their sum). The tail is how far
the last one ends past the backward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from clustersim.catalog.schema import ModelSpec
from clustersim.scenario.models import ParallelismCfg, TrainingCfg
from clustersim.workload import Layout
from clustersim.workload.dims import is_moe_layer, stage_layers
from clustersim.workload.gradbuckets import par_grad_buckets, param_bytes
from clustersim.workload.ops import Block, Tpl

__all__ = [
    "Ready",
    "backward_ready",
    "block_readies",
    "grad_tail_s",
    "is_bf16_layer",
    "ready_offsets",
]

Ready = tuple[float, tuple[tuple[str, float], ...]]
"""A block's backward seconds (recompute included), and each piece's ready offset."""

TplsS = Callable[[tuple[Tpl, ...]], tuple[float, float]]
Group = tuple[int, int]  # (stride, size)


def ready_offsets(block: Block, tpls_s: TplsS) -> Ready:
    """When each of ``block``'s pieces is ready, from the start of its recompute."""
    t = sum(tpls_s(block.recompute))
    out: list[tuple[str, float]] = []
    for j, tpl in enumerate(block.bwd):
        t += sum(tpls_s((tpl,)))
        out.extend((piece, t) for piece in block.grad_ready.get(j, ()))
    return t, tuple(out)


def block_readies(blocks: Mapping[str, Block], tpls_s: TplsS) -> dict[str, Ready]:
    """:func:`ready_offsets` of each named block."""
    return {name: ready_offsets(block, tpls_s) for name, block in blocks.items()}


def is_bf16_layer(model: ModelSpec, train: TrainingCfg, layer: int) -> bool:
    """Whether an FP8 recipe keeps ``layer`` in BF16 (its first and last ``bf16_layers``)."""
    n = train.fp8.bf16_layers if train.precision == "fp8" else 0
    return n > 0 and (layer < n or layer >= model.layers - n)


def backward_ready(
    model: ModelSpec,
    train: TrainingCfg,
    layout: Layout,
    stage: int,
    blocks: Mapping[str, Ready],
) -> tuple[dict[tuple[int, str], float], float]:
    """When each gradient piece of the stage's last backward is complete, from its
    start (the LM head, the layers in reverse, the embedding, each block's pieces at
    their ops' ends, :func:`ready_offsets`), and the backward's length.

    ``blocks`` holds the :func:`ready_offsets` of ``dense``, ``moe``, ``bf16``,
    ``embed`` and ``head``."""
    ready: dict[tuple[int, str], float] = {}
    t = 0.0

    def lay(key: int, name: str) -> None:
        nonlocal t
        total, pieces = blocks[name]
        for piece, offset in pieces:
            ready[(key, piece)] = t + offset
        t += total

    if stage == layout.pp - 1:
        lay(-1, "head")
    for k in reversed(stage_layers(model, layout, stage)):
        bf16 = is_bf16_layer(model, train, k)
        lay(k, "moe" if is_moe_layer(model, k) else "bf16" if bf16 else "dense")
    if stage == 0:
        lay(-1, "embed")
    return ready, t


def grad_tail_s(
    run: tuple[ModelSpec, TrainingCfg, ParallelismCfg, Layout],
    stage: int,
    blocks: Mapping[str, Ready],
    groups: list[Group],
    *,
    coll_s: Callable[[int, int, str, float], float],
) -> float:
    """Seconds the stage's gradient reduction (ZeRO 0 and 1) runs past its last backward.

    ``blocks`` holds the :func:`ready_offsets` of ``dense``, ``moe``, ``bf16``,
    ``embed`` and ``head``; ``groups`` each gradient stream's group, the dense one
    first (an MoE model's routed experts second)."""
    model, train, par, layout = run
    ready, t = backward_ready(model, train, layout, stage, blocks)
    queue: list[tuple[float, Group, int]] = []
    moe = model.moe is not None
    op = "reduce_scatter" if par.zero == 1 else "all_reduce"
    for k, group in enumerate(groups):
        experts = (k > 0) if moe else None
        keyed, _ = par_grad_buckets(
            model, layout, stage, par, experts=experts, elem_bytes=param_bytes(train)
        )
        for key, sizes in keyed.items():
            at = ready.get(key, t) if par.overlap_grad_reduce else t  # or after it
            queue.extend((at, group, size) for size in sizes)
    free = 0.0
    for at, group, size in sorted(queue, key=lambda q: q[0]):
        free = max(free, at) + coll_s(*group, op, float(size))
    return max(free - t, 0.0)
