"""The links a shard group's collectives share, as a processor-sharing server.

The estimate's ZeRO-3 stream (:func:`~.sharded.fsdp_overhead`) puts each FSDP unit's
gather and reduce-scatter on one :class:`SharedLinks` when it starts. The
collectives in flight share their bytes' seconds equally, as the flow model's
max-min sharing shares the same bottleneck links, and each ends its fixed costs
(its time alone less its seconds on the links) after its bytes.
"""

from __future__ import annotations

import heapq
import math

__all__ = ["SharedLinks", "wire_part"]


def wire_part(secs: float, wire: float | None) -> float:
    """The seconds of a collective of ``secs`` that its bytes spend on the links
    (``wire``, clamped to 0..secs; None: all of it)."""
    return secs if wire is None else min(max(wire, 0.0), secs)


class SharedLinks:
    """The shard group's links as a processor-sharing server: the collectives in flight
    share their bytes' seconds equally (max-min sharing of the same links), and each
    ends its fixed costs (its time alone less its seconds on the links) after its
    bytes. One added with an earlier start than the server's clock starts at the
    clock (:func:`~.sharded.fsdp_overhead` adds every collective that starts before a
    gather it waits for ends before it asks)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.left: dict[int, float] = {}  # bytes' seconds left of those in flight
        self.fixed: dict[int, float] = {}
        self.done: dict[int, float] = {}
        self.queued: list[tuple[float, int, float]] = []  # (at, id, wire), a heap

    def add(self, at: float, secs: float, wire: float | None) -> int:
        ident = len(self.fixed)
        w = wire_part(secs, wire)
        self.fixed[ident] = secs - w
        heapq.heappush(self.queued, (max(at, self.now), ident, w))
        return ident

    def finish(self, ident: int) -> float:
        """When collective ``ident`` ends, given those added so far."""
        if not self.left and len(self.queued) == 1 and self.queued[0][1] == ident:
            at, _, w = self.queued.pop()  # alone on the links: no sharing to step through
            self.now = at + w
            self.done[ident] = self.now + self.fixed[ident]
        while ident not in self.done:
            if not self._step():
                break
        return self.done[ident]

    def busy_until(self, t: float, also: tuple[float, float] | None = None) -> float:
        """When the links' bytes run out after ``t`` (``t`` if none are on them then),
        given those added so far and ``also`` (start, seconds on the links); the
        server's state is left as it is."""
        now, left = self.now, list(self.left.values())
        queued = sorted([(at, w) for at, _, w in self.queued] + ([also] if also else []))
        i = 0
        while True:
            arrival = queued[i][0] if i < len(queued) else math.inf
            if left:
                n, first = len(left), min(left)
                if now + first * n <= arrival:
                    now += first * n
                    left = [v - first for v in left if v - first > 1e-15]
                    continue
            elif arrival > t:
                return max(now, t)
            if left:
                served = (max(arrival, now) - now) / len(left)
                left = [v - served for v in left]
            now = max(arrival, now)
            if queued[i][1] > 0:
                left.append(queued[i][1])
            i += 1

    def drain(self) -> float:
        """When the last collective ends."""
        while self._step():
            pass
        return max(self.done.values(), default=0.0)

    def _step(self) -> bool:
        arrival = self.queued[0][0] if self.queued else math.inf
        n = len(self.left)
        first = min(self.left.values()) if n else math.inf
        if n and self.now + first * n <= arrival:
            self.now += first * n
            for ident in list(self.left):
                rest = self.left[ident] - first
                if rest <= 1e-15:
                    del self.left[ident]
                    self.done[ident] = self.now + self.fixed[ident]
                else:
                    self.left[ident] = rest
            return True
        if not self.queued:
            return False
        at, ident, w = heapq.heappop(self.queued)
        if n:
            served = (max(at, self.now) - self.now) / n
            self.left = {k: v - served for k, v in self.left.items()}
        self.now = max(at, self.now)
        if w > 0:
            self.left[ident] = w
        else:
            self.done[ident] = self.now + self.fixed[ident]
        return True
