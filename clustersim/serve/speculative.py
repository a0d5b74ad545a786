"""Speculative decoding: a draft model proposes tokens, the target verifies them at once.

``serving.speculative: {draft_model, tokens: k, acceptance: a}``. Every decode step
of a sequence runs the draft model k times (one token each, sequentially) and the
target once over the k + 1 positions (the draft's k and its own next one); the target
keeps the draft's tokens up to the first it rejects, and adds its own. With each
draft token accepted independently with probability a, a step emits
:func:`expected_tokens_per_step` tokens on average; the scheduler draws each step's
count (:meth:`~clustersim.serve.sched.Replica._accepted`). The draft runs on the same
ranks at the same TP as the target (NxD Inference's fused speculation; vLLM's draft
model runner), and its weights and KV share the ranks' HBM.
"""

from __future__ import annotations

from collections.abc import Sequence

from clustersim.serve.sched import IterationCost

__all__ = ["SpeculativeCost", "expected_tokens_per_step"]


def expected_tokens_per_step(k: int, a: float) -> float:
    """Tokens a speculative step emits on average with k draft tokens each accepted with
    probability a: ``(1 - a^(k+1)) / (1 - a)`` (Leviathan, Kalman & Matias 2023,
    "Fast Inference from Transformers via Speculative Decoding", eq. 1); k + 1 at a = 1."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


class SpeculativeCost:
    """An iteration with speculative decoding: for the decodes, the draft model's k
    sequential decode steps, then the target verifying k + 1 tokens of every sequence in
    one pass (k + 1 GEMM rows and KV writes each, the same cached context read); a
    prompt is prefilled by both models."""

    def __init__(self, target: IterationCost, draft: IterationCost, k: int) -> None:
        self.target, self.draft, self.k = target, draft, k

    def iteration_s(
        self,
        chunks: Sequence[tuple[int, int]] = (),
        decodes: int = 0,
        decode_context: int = 0,
        *,
        padded_decodes: int | None = None,
    ) -> float:
        k1 = self.k + 1
        verify = self.target.iteration_s(
            chunks, decodes * k1, decode_context,
            padded_decodes=None if padded_decodes is None else padded_decodes * k1,
        )  # fmt: skip
        draft = self.draft.iteration_s(chunks)
        if decodes:
            step = self.draft.iteration_s(
                (), decodes, decode_context, padded_decodes=padded_decodes
            )
            draft += self.k * step
        return verify + draft
