"""What the scheduler moves: requests, their KV blocks, the compiled buckets, and the
cost an iteration asks of the chip and network model.

:class:`Request` holds one request and what happened to it (:func:`request_frame`: a
run's requests as a table); :func:`bucket` is the
compiled sequence bucket a Neuron engine runs a length in; :class:`IterationCost` is
what :class:`~clustersim.serve.sched.Replica` asks an iteration's time of
(:class:`~clustersim.serve.iteration.IterationModel`, or a fixed time in tests).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import pandas as pd
import simpy

__all__ = [
    "BLOCK_TOKENS",
    "LOG_FIELDS",
    "MIN_BUCKET",
    "IterationCost",
    "Request",
    "bucket",
    "request_frame",
]

BLOCK_TOKENS = 16
"""vLLM's default KV block size (``--block-size 16``)."""


LOG_FIELDS = (
    "start_s", "duration_s", "prefill_tokens", "sequences", "steps", "kv_blocks", "aborted",
)  # fmt: skip
"""One row of :attr:`Replica.log`: when an iteration (or a run of ``steps`` decode
iterations in one timeout) started and how long it ran, the prompt tokens it
prefilled, the sequences in its batch, the KV blocks in use, and whether a failure
cut it short (1) or not (0)."""

MIN_BUCKET = 128
"""The smallest compiled sequence bucket of NxD Inference's automatic bucketing."""


def bucket(tokens: int, largest: int) -> int:
    """The compiled bucket ``tokens`` run in: NxD Inference's automatic buckets are the
    powers of two from :data:`MIN_BUCKET` up to the largest length the model was
    compiled for, which is a bucket too (``aws-neuron-sdk:libraries/nxd-inference``,
    bucketing guide)."""
    if tokens >= largest:
        return max(tokens, largest)
    return min(max(MIN_BUCKET, 1 << (max(tokens, 1) - 1).bit_length()), largest)


class IterationCost(Protocol):
    def iteration_s(
        self,
        chunks: Sequence[tuple[int, int]] = (),
        decodes: int = 0,
        decode_context: int = 0,
        *,
        padded_decodes: int | None = None,
    ) -> float: ...


@dataclass(slots=True, eq=False)
class Request:
    """One request and what happened to it (times in seconds from the start). Requests
    compare by identity (the scheduler's list lookups)."""

    id: int
    arrival: float
    input_tokens: int
    output_tokens: int
    replica: int = -1
    scheduled: float = math.nan
    first_token: float = math.nan
    finish: float = math.nan
    generated: int = 0
    kv_tokens: int = 0  # tokens whose K and V are in the cache
    blocks: int = 0
    preemptions: int = 0
    done: simpy.Event | None = None
    prompt_target: int = 0
    """Tokens to prefill: the prompt, and after a preemption the tokens generated too."""
    prefill_replica: int = -1
    """Disaggregated: the replica that prefilled it (-1: its own replica did)."""
    kv_transfer_s: float = math.nan
    """Disaggregated: how long its KV took to reach the decode replica."""
    retries: int = 0
    """Times a failed replica's router sent it elsewhere (its KV lost)."""
    cached_tokens: int = 0
    """Prompt tokens the prefix cache holds: its first admission starts with their KV."""

    def __post_init__(self) -> None:
        self.prompt_target = self.input_tokens

    def prefix_hit(self) -> int:
        """Prompt tokens the prefix cache gives it on its first admission (none after a
        preemption, whose blocks went back to the pool, or with its KV in place)."""
        first = self.kv_tokens == 0 and self.generated == 0 and self.blocks == 0
        return self.cached_tokens if first else 0


FRAME_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "id"), ("replica", "replica"), ("arrival_s", "arrival"),
    ("scheduled_s", "scheduled"), ("first_token_s", "first_token"), ("finish_s", "finish"),
    ("input_tokens", "input_tokens"), ("output_tokens", "generated"),
    ("preemptions", "preemptions"), ("prefill_replica", "prefill_replica"),
    ("kv_transfer_s", "kv_transfer_s"), ("retries", "retries"),
)  # fmt: skip
"""``requests.parquet``'s recorded columns and the :class:`Request` fields they hold."""


def request_frame(requests: list[Request]) -> pd.DataFrame:
    """One row per request: its times (s from the start), tokens and replica."""
    frame = pd.DataFrame(
        {column: [getattr(r, field) for r in requests] for column, field in FRAME_COLUMNS}
    )
    frame["queue_s"] = frame["scheduled_s"] - frame["arrival_s"]
    frame["ttft_s"] = frame["first_token_s"] - frame["arrival_s"]
    frame["e2e_s"] = frame["finish_s"] - frame["arrival_s"]
    decode_tokens = (frame["output_tokens"] - 1).where(frame["output_tokens"] > 1)
    frame["tpot_s"] = (frame["finish_s"] - frame["first_token_s"]) / decode_tokens
    return frame
