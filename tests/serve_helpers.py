"""A fixed iteration cost for the serving scheduler's closed-form tests."""

from __future__ import annotations

from collections.abc import Sequence


class Fixed:
    """An iteration of ``seconds``, or of ``decode`` seconds where it prefills no prompt."""

    def __init__(self, seconds: float, decode: float | None = None) -> None:
        self.seconds = seconds
        self.decode = seconds if decode is None else decode

    def iteration_s(
        self,
        chunks: Sequence[tuple[int, int]] = (),
        decodes: int = 0,
        decode_context: int = 0,
        *,
        padded_decodes: int | None = None,
    ) -> float:
        return self.seconds if chunks else self.decode
