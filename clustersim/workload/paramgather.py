"""ZeRO-1's overlapped parameter all-gather as Megatron's distributed optimizer runs it.

With ``--overlap-param-gather`` (``overlap_param_gather: true`` with ``zero: 1``)
the updated bf16 parameters are gathered under the next step's forward, bucket by
bucket, in forward order (the reverse of the gradient buckets' order). Megatron-Core
dispatches only the first bucket's all-gather after the optimizer step; the
forward pre-hook of a module waits for the bucket that holds its parameters and
then dispatches the next one (``DistributedOptimizer._finish_param_sync_helper``:
"We can't pre-launch all-gathers for all buckets at once since we don't want to
interfere with other communication ops (like pipeline-parallel sends and
receives)"). So one gather is in flight at a time, one bucket ahead of the forward.
With model chunks (interleaved 1F1B) the pipeline schedule dispatches a chunk's
gathers ahead instead ("Synchronize params for first two model chunks" at the start
of ``forward_backward_pipelining_with_interleaving``, then chunk ``c + 1``'s when
chunk ``c`` starts its first microbatch): the collectives of one communicator run
in turn, so a chunk's buckets are one all-gather of their sum here.

:class:`ParamGathers` lowers that: at the start of the program the first bucket's
gather (blocking: the first layer needs it) and the second one's (asynchronous);
before the first forward of each part of the model that holds a bucket's first
parameter (the embedding, a layer, the head), a wait for that bucket's gather and
the dispatch of the next. A bucket's first parameter in the forward is the piece
that completed it in the backward. With chunks: the first chunk's gather (blocking)
and the second's at the start; before the first forward of chunk ``c >= 1``, a wait
for its gather and the dispatch of chunk ``c + 1``'s. Each gradient stream (the
dense one, an MoE model's routed experts) runs its own chain over its own group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from clustersim.workload.program import Instr, Kind, Phase

__all__ = ["HEAD", "ParamGathers"]

BucketKey = tuple[int, str]
HEAD = 1 << 30
"""The position of the LM head: after every layer of the stage."""


class ParamGathers:
    """The chained parameter gathers of one stage's gradient streams; see the module doc.

    ``streams`` holds each stream's group and its buckets as ``grad_buckets`` keys
    them (sizes by the piece that completes them, in gradient order); ``chunks`` the
    stage's layers of each model chunk in forward order; a layer's index among them
    is its position (the embedding is -1, the head :data:`HEAD`).
    """

    def __init__(
        self,
        streams: Sequence[tuple[str, Mapping[BucketKey, list[int]]]],
        chunks: Sequence[Sequence[int]],
        head_pieces: frozenset[str],
    ) -> None:
        layers = [layer for chunk in chunks for layer in chunk]
        self.index = index = {layer: i for i, layer in enumerate(layers)}
        chunk_of = {layer: c for c, chunk in enumerate(chunks) for layer in chunk}
        self.chunks = len(chunks)
        self.chains: list[tuple[str, list[tuple[int, float]]]] = []
        self.per_chunk: list[tuple[str, list[float]]] = []
        for group, ready in streams:
            buckets: list[tuple[int, float]] = []
            totals = [0.0] * len(chunks)
            for (layer, piece), sizes in ready.items():
                # a layer's position; the embedding's pieces come first, the head's last
                off = HEAD if piece in head_pieces else -1
                at = index.get(layer, HEAD) if layer >= 0 else off
                buckets.extend((at, float(n)) for n in sizes)
                c = chunk_of.get(layer, len(chunks) - 1) if layer >= 0 else (0 if off < 0 else -1)
                totals[c] += float(sum(sizes))
            self.chains.append((group, buckets[::-1]))  # forward order
            self.per_chunk.append((group, totals))
        self.waited = [1] * len(self.chains)  # the next bucket to wait for, per chain

    def start(self, out: list[Instr]) -> None:
        """The first bucket's gather, blocking, and the dispatch of the second; with
        model chunks, the first chunk's gathers and the dispatch of the second's."""
        if self.chunks > 1:
            for group, totals in self.per_chunk:
                if totals[0] > 0:
                    out.append(_gather(Kind.COLLECTIVE, group, totals[0]))
                if totals[1] > 0:  # a chunk may hold none of a stream's pieces
                    out.append(_gather(Kind.ASYNC_COLLECTIVE, group, totals[1]))
            return
        for group, buckets in self.chains:
            if buckets:
                out.append(_gather(Kind.COLLECTIVE, group, buckets[0][1]))
            if len(buckets) > 1:
                out.append(_gather(Kind.ASYNC_COLLECTIVE, group, buckets[1][1]))

    def use_chunk(self, out: list[Instr], chunk: int) -> None:
        """Before the first forward of model ``chunk`` (several per stage): wait for its
        gathers and dispatch those of the chunk after the next."""
        if self.chunks == 1 or chunk == 0:
            return
        for group, totals in self.per_chunk:
            out.append(_wait(group, 0))  # nothing to wait for is no wait
            if chunk + 1 < self.chunks and totals[chunk + 1] > 0:
                out.append(_gather(Kind.ASYNC_COLLECTIVE, group, totals[chunk + 1]))

    def use(self, out: list[Instr], at: int) -> None:
        """Before the first forward of the part at position ``at``: wait for every
        bucket it is the first user of, dispatching the next after each."""
        if self.chunks > 1:
            return
        for c, (group, buckets) in enumerate(self.chains):
            k = self.waited[c]
            while k < len(buckets) and buckets[k][0] <= at:
                out.append(_wait(group, 0))
                if k + 1 < len(buckets):
                    out.append(_gather(Kind.ASYNC_COLLECTIVE, group, buckets[k + 1][1]))
                k += 1
            self.waited[c] = k


def _gather(kind: Kind, group: str, nbytes: float) -> Instr:
    return Instr(
        kind,
        f"{group}.all_gather",
        Phase.PARAM_SYNC,
        collective="all_gather",
        group=group,
        nbytes=nbytes,
    )


def _wait(group: str, keep: int) -> Instr:
    """Wait for the gathers of ``group`` in flight but the ``keep`` youngest."""
    return Instr(
        Kind.WAIT_ASYNC,
        f"{group}.wait",
        Phase.PARAM_SYNC,
        collective="all_gather",
        group=group,
        tag=keep,
    )
