"""Pipeline schedules: the order in which one stage runs its forwards and backwards.

A schedule is a plain function ``(stage, stages, microbatches, chunks) -> order``
where ``order`` lists ``("F", microbatch, chunk)`` and ``("B", microbatch, chunk)``
items. ``chunks`` is the number of model chunks each stage holds
(``parallelism.virtual_stages``): with ``chunks = v`` the layers are cut into
``stages x v`` chunks and chunk ``c`` runs on stage ``c % stages`` as its local
chunk ``c // stages``; items name the local chunk. A schedule is registered under
the name a scenario uses (``parallelism.schedule``) with
``@register_schedule("name")``. Sends never block, so an order is deadlock-free
when a stage only waits for a message its neighbour sends earlier in that
neighbour's own order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from clustersim.errors import ScenarioError

__all__ = [
    "Order",
    "Schedule",
    "dualpipe",
    "get_schedule",
    "gpipe",
    "one_f_one_b",
    "peak_in_flight",
    "register_schedule",
    "schedule_names",
    "shift_for_overlap",
    "stage_order",
]

Step = tuple[Literal["F", "B"], int, int]
"""(kind, microbatch, local chunk)."""
Order = list[Step]
Schedule = Callable[[int, int, int, int], Order]

_SCHEDULES: dict[str, Schedule] = {}


def register_schedule(name: str) -> Callable[[Schedule], Schedule]:
    """Register a schedule function under its YAML name."""

    def deco(fn: Schedule) -> Schedule:
        if name in _SCHEDULES:
            raise ValueError(f"pipeline schedule {name!r} is already registered")
        _SCHEDULES[name] = fn
        return fn

    return deco


def schedule_names() -> list[str]:
    return sorted(_SCHEDULES)


def get_schedule(name: str) -> Schedule:
    """The schedule registered as ``name``; an unknown name lists the valid ones."""
    try:
        return _SCHEDULES[name]
    except KeyError:
        raise ScenarioError(
            "parallelism.schedule",
            name,
            f"unknown pipeline schedule; valid: {', '.join(schedule_names())}",
        ) from None


def peak_in_flight(order: Sequence[Step], weight: Sequence[float] | None = None) -> float:
    """Most (microbatch, chunk) forwards that have run while their backward has not.

    This is how many microbatches' activations a stage holds at its peak; with
    ``weight`` (per local chunk, say its layers), the peak of their summed weight.
    """
    live = peak = 0.0
    for kind, _mb, chunk in order:
        w = 1.0 if weight is None else weight[chunk]
        live += w if kind == "F" else -w
        peak = max(peak, live)
    return peak


def shift_for_overlap(order: Sequence[Step], extra: int) -> Order:
    """The order with every backward ``extra`` forwards later (a deeper warm-up).

    The forwards keep their order, and so do the backwards. Overlapping a backward
    with the adjacent forward (``workload.overlap``) sends that forward's output on
    only when the pair ends, so the next stage needs slack: see :func:`stage_order`.
    """
    forwards = [s for s in order if s[0] == "F"]
    out: Order = []
    seen = done = 0  # forwards before this backward in ``order``; forwards placed
    for step in order:
        if step[0] == "F":
            seen += 1
            continue
        target = min(seen + extra, len(forwards))
        out.extend(forwards[done:target])
        done = max(done, target)
        out.append(step)
    out.extend(forwards[done:])
    return out


def stage_order(
    schedule: str, stage: int, stages: int, microbatches: int, chunks: int, *, overlap: bool
) -> Order:
    """The order of ``schedule`` on ``stage``, with a deeper warm-up when backwards overlap
    forwards.

    A pair (a backward and the next forward) sends the forward's output when the pair
    ends, about F + B after it starts, so a stage's forward input must have left its
    upstream stage a pair earlier than under plain 1F1B, or the steady state stalls
    (and with the usual warm-up the last stage's pair waits for its upstream stage's
    pair, which waits for its backward: a deadlock). Warm-ups two forwards deeper per
    stage upstream give that slack: 2 (pp - stage - 1) + 1 forwards with one chunk per
    stage (twice the microbatches in flight of plain 1F1B, the activation memory
    Megatron-Core's overlapped 1F1B and DualPipe pay), one more than interleaved 1F1B's
    2 (pp - stage - 1) + (v - 1) pp with several.
    """
    order = get_schedule(schedule)(stage, stages, microbatches, chunks)
    if not overlap or schedule == "dualpipe":  # DualPipe's order is made for its pairs
        return order
    return shift_for_overlap(order, stages - stage if chunks == 1 else 1)


@register_schedule("gpipe")
def gpipe(stage: int, stages: int, microbatches: int, chunks: int = 1) -> Order:
    """GPipe (Huang et al. 2019): every forward, then every backward.

    With several chunks per stage, every chunk's forwards in chunk order, then the
    backwards in reverse.
    """
    del stage, stages  # the same order on every stage
    order: Order = [("F", mb, c) for c in range(chunks) for mb in range(microbatches)]
    order += [("B", mb, c) for c in reversed(range(chunks)) for mb in range(microbatches)]
    return order


@register_schedule("1f1b")
def one_f_one_b(stage: int, stages: int, microbatches: int, chunks: int = 1) -> Order:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021), interleaved when ``chunks > 1``.

    Warm up with ``stages - stage - 1`` forwards (the microbatches needed to fill
    the pipeline below this stage), then alternate one forward and one backward,
    then drain the remaining backwards. A stage holds at most
    ``min(stages - stage, microbatches)`` microbatches' activations.
    """
    if chunks > 1:
        return _interleaved(stage, stages, microbatches, chunks)
    warmup = min(stages - stage - 1, microbatches)
    order: Order = [("F", mb, 0) for mb in range(warmup)]
    for i in range(microbatches - warmup):
        order.append(("F", warmup + i, 0))
        order.append(("B", i, 0))
    order += [("B", mb, 0) for mb in range(microbatches - warmup, microbatches)]
    return order


def _interleaved(stage: int, stages: int, microbatches: int, chunks: int) -> Order:
    """Interleaved 1F1B (Narayanan et al. 2021, section 2.2; Megatron-LM's schedule).

    Work units go in groups of ``stages`` microbatches: a group runs through chunk
    0, then chunk 1, and so on (backwards through the chunks in reverse). The
    warm-up is ``2 (stages - stage - 1) + (chunks - 1) stages`` units, every
    forward when there are only ``stages`` microbatches. The pipeline bubble
    shrinks by the factor ``chunks``, for ``chunks`` times the point-to-point
    messages. ``microbatches`` must be a multiple of ``stages``.
    """
    if microbatches % stages:
        raise ValueError(
            f"interleaved 1F1B needs microbatches ({microbatches}) divisible by stages ({stages})"
        )
    total = microbatches * chunks

    def unit(k: int, kind: Literal["F", "B"]) -> Step:
        group, r = divmod(k, stages * chunks)
        chunk = r // stages
        return kind, group * stages + r % stages, chunk if kind == "F" else chunks - 1 - chunk

    if microbatches == stages:
        warmup = total
    else:
        warmup = min(2 * (stages - stage - 1) + (chunks - 1) * stages, total)
    order: Order = [unit(k, "F") for k in range(warmup)]
    for i in range(total - warmup):
        order.append(unit(warmup + i, "F"))
        order.append(unit(i, "B"))
    order += [unit(k, "B") for k in range(total - warmup, total)]
    return order


@register_schedule("dualpipe")
def dualpipe(stage: int, stages: int, microbatches: int, chunks: int = 2) -> Order:
    """DualPipeV (deepseek-ai/DualPipe ``dualpipev.py``; DualPipe in arXiv 2412.19437 3.2.1).

    Each stage holds two chunks in a V (``Layout.vshape``): stage ``s`` runs chunk
    ``s`` on the way down and chunk ``2 pp - 1 - s`` on the way back, so the last
    stage hands its first chunk's output to its second without a send and the first
    stage holds the embedding and the head. The order is the reference's eight
    steps: forwards of chunk 0, forwards of both, then pairs of a forward of one
    chunk and a backward of the other (``F0 B1 F1 B0``), which the lowering runs
    overlapped (:func:`dualpipe_units`, ``workload.overlap``), then the backwards.
    The reference splits each backward into its input and weight gradients and
    moves weight passes into the bubbles (zero bubble); here a backward computes
    both, so the cool-down keeps the bubble that splitting removes. Needs
    ``microbatches >= 2 stages``.
    """
    if chunks != 2:
        raise ValueError(f"dualpipe runs two chunks per stage (got {chunks})")
    return _dualpipe(stage, stages, microbatches)[0]


def dualpipe_units(stage: int, stages: int, microbatches: int) -> list[tuple[int, ...]]:
    """The overlapped pairs of :func:`dualpipe`'s order (index pairs) and its single items.

    As the reference: every ``F0 B1`` and ``F1 B0`` of the steady state, and the
    ``F1 B0`` after each lone ``B1`` of the cool-down, but the last stage's first
    ``F0 B1``, which it runs one after the other.
    """
    return _dualpipe(stage, stages, microbatches)[1]


def _dualpipe(stage: int, stages: int, microbatches: int) -> tuple[Order, list[tuple[int, ...]]]:
    pp, r = stages, stage
    done_f, done_b = [0, 0], [0, 0]
    order: Order = []
    units: list[tuple[int, ...]] = []

    def f(c: int) -> int:
        order.append(("F", done_f[c], c))
        done_f[c] += 1
        return len(order) - 1

    def b(c: int) -> int:
        order.append(("B", done_b[c], c))
        done_b[c] += 1
        return len(order) - 1

    def single(i: int) -> None:
        units.append((i,))

    for _ in range(2 * (pp - r - 1)):  # 1: chunk 0's forwards fill the V
        single(f(0))
    for _ in range(r + 1):  # 2: forwards of both chunks
        single(f(0))
        single(f(1))
    for _ in range(pp - r - 1):  # 3: chunk 1's backward (with its weights), forward
        single(b(1))
        single(f(1))
    for i in range(microbatches - 2 * pp + r + 1):  # 4: the steady state, F0&B1, F1&B0
        if i == 0 and r == pp - 1:
            single(f(0))
            single(b(1))
        else:
            units.append((f(0), b(1)))
        units.append((f(1), b(0)))
    for _ in range(pp - r - 1):  # 5
        single(b(1))
        units.append((f(1), b(0)))
    for _ in range(r + 1):  # 6: backwards of both chunks
        single(b(1))
        single(b(0))
    for _ in range(pp - r - 1):  # 7: chunk 0's last backwards
        single(b(0))
    return order, units
