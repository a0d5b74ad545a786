"""Per-rank programs: the instruction list one rank executes in one training step.

Ranks in the same pipeline stage run the same program (TP, CP and DP peers do
identical work), so the workload builds one ``Program`` per stage and the
simulator maps group names to concrete rank groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from clustersim.hardware.work import Work

__all__ = ["Instr", "Kind", "Phase", "Program"]


class Kind(IntEnum):
    COMPUTE = 0  # run ``work`` on this rank's cores
    COLLECTIVE = 1  # blocking collective over ``group``
    SEND = 2  # start sending ``nbytes`` to the rank ``peer`` stages away (non-blocking)
    RECV = 3  # wait for the matching SEND from the rank ``peer`` stages away
    ASYNC_COLLECTIVE = 4  # start a collective over ``group`` without waiting (DP buckets)
    # wait for every ASYNC_COLLECTIVE started so far; with ``group`` (and
    # ``collective``) set, only for those of that group and collective, all but the
    # ``tag`` started last (an FSDP prefetch window)
    WAIT_ASYNC = 5


class Phase:
    """Values of ``Instr.phase`` (plain strings, so traces stay readable)."""

    FORWARD = "fwd"
    BACKWARD = "bwd"
    RECOMPUTE = "recompute"
    GRAD_SYNC = "grad_sync"
    OPTIMIZER = "optimizer"
    PARAM_SYNC = "param_sync"


@dataclass(slots=True)
class Instr:
    """One instruction.

    - COMPUTE: ``work`` is set. ``name`` is the op (``attn.qkv``, ``mlp.down``...).
    - COLLECTIVE / ASYNC_COLLECTIVE: ``collective`` is one of ``all_reduce``,
      ``reduce_scatter``, ``all_gather``, ``all_to_all``, ``broadcast``; ``group`` is
      ``tp``, ``cp``, ``dp``, ``ep`` or ``pp``; ``nbytes`` is the collective's size in
      the nccl-tests convention (the full buffer: for all-gather the output, for
      reduce-scatter the input, for all-reduce the buffer).
    - SEND / RECV: ``peer`` is +1 (next stage) or -1 (previous stage); ``nbytes``
      the message size; ``tag`` pairs a SEND with its RECV (same tag on both sides).
    """

    kind: Kind
    name: str
    phase: str
    layer: int = -1
    microbatch: int = -1
    work: Work | None = None
    collective: str = ""
    group: str = ""
    nbytes: float = 0.0
    peer: int = 0
    tag: int = 0


@dataclass(slots=True)
class Program:
    """The instruction list of one pipeline stage, with its accounting."""

    stage: int
    instrs: list[Instr] = field(default_factory=list)
    layers: tuple[int, ...] = ()  # global layer indices owned by this stage
