"""The estimate's 1F1B pipeline, stepped op by op: when each stage's last backward ends.

The closed form ``sum_s (F_s + B_s) + (m - 1) max_s (F_s + B_s)`` holds for equal
stages without hops. The simulator runs each stage's own order
(``workload.schedules.one_f_one_b``: ``pp - s - 1`` forwards, then one forward and
one backward in turn, then the rest of the backwards), each op waiting for its
input from the neighbouring stage one hop later. So its steady state takes
``max_s (F_s + B_s) + 2 hop`` per microbatch (a stage's backward waits for the
next stage's forward and backward of the microbatch it sent on a cycle before),
and with uneven stages (Llama-3-405B's 126 layers on 16 stages, the outer ones
lighter) the fill and drain differ from the closed form's.

:func:`last_backward_ends` steps every op of every stage in a topological order,
about a microsecond each: at step ``k`` each stage's k-th op, the forwards
through the stages in order, then the backwards in reverse. A forward depends on
the previous stage's forward of the same microbatch, which is at most the same
step on its stage (the same step only while both warm up), and a backward on the
next stage's, likewise (the same step only while both drain).

``last_extra_s`` lengthens each stage's last backward: the gradient reduction that
runs under it (the buckets start as their gradients are ready) slows it, and
every stage before it waits for its gradients, so the drain carries the delays of
all the stages after it (``search.drain``).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["last_backward_ends"]


def last_backward_ends(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    hop_s: float,
    microbatches: int,
    last_extra_s: Sequence[float] | None = None,
) -> list[float]:
    """When each stage's last backward ends under 1F1B (one model chunk per stage),
    from the step's start; see the module doc."""
    pp, m = len(fwd_s), microbatches
    if pp == 0 or m <= 0:
        return [0.0] * pp
    last = pp - 1
    end_f = [[0.0] * m for _ in range(pp)]
    end_b = [[0.0] * m for _ in range(pp)]
    clock = [0.0] * pp
    warm = [min(pp - s - 1, m) for s in range(pp)]
    extra = last_extra_s if last_extra_s is not None else [0.0] * pp
    final = [bwd_s[s] + extra[s] for s in range(pp)]
    for k in range(2 * m):
        backs: list[int] = []
        for s in range(pp):
            w = warm[s]
            if k < w:
                j = k
            else:
                q = k - w
                if q >= 2 * (m - w) or q & 1:
                    backs.append(s)
                    continue
                j = w + (q >> 1)
            c = clock[s]
            if s:
                c = max(c, end_f[s - 1][j] + hop_s)
            c += fwd_s[s]
            end_f[s][j] = clock[s] = c
        for s in reversed(backs):
            w = warm[s]
            q = k - w
            i = q >> 1 if q < 2 * (m - w) else q - (m - w)
            c = clock[s]
            if s < last:
                c = max(c, end_b[s + 1][i] + hop_s)
            c += final[s] if i == m - 1 else bwd_s[s]
            end_b[s][i] = clock[s] = c
    return [end_b[s][m - 1] for s in range(pp)]
