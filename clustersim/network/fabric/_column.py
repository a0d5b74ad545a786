"""A growable 1-D numpy array: a column of a :class:`~.links.LinkTable`."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

__all__ = ["Column"]

_T = TypeVar("_T", bound=np.generic)


class Column(Generic[_T]):
    """A growable 1-D numpy array.

    Bulk additions are kept as parts and joined at the first read, so a builder's few
    large additions are copied once, not once per doubling of the array.
    """

    def __init__(self, dtype: type[_T]) -> None:
        self._a: NDArray[_T] = np.empty(0, dtype=dtype)
        self._parts: list[NDArray[_T]] = []
        self.n = 0

    def extend(self, values: NDArray[Any], *, fresh: bool = False) -> None:
        """Append ``values`` (in the column's type): a copy of them, or (``fresh``: an
        array of that type nobody else holds) the array itself. One value broadcast to
        many (stride 0) is filled in, not copied from a contiguous copy of it."""
        if fresh:
            part = np.asarray(values, dtype=self._a.dtype)
        elif values.ndim == 1 and values.size > 1 and values.strides[0] == 0:
            part = np.full(values.size, values[0], dtype=self._a.dtype)
        else:
            part = np.array(values, self._a.dtype)
        self._parts.append(part.reshape(-1))
        self.n += part.size

    def since(self, start: int) -> NDArray[_T]:
        """The values from index ``start`` on, without joining the parts."""
        pieces = [self._a[start:]] if start < self._a.size else []
        skip = max(0, start - self._a.size)
        for part in self._parts:
            if skip >= part.size:
                skip -= part.size
                continue
            pieces.append(part[skip:])
            skip = 0
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else self._a[:0]

    def take(self, at: NDArray[np.int64]) -> NDArray[_T]:
        """``view[at]`` (indices in ``0..n-1``), without joining the parts: a few lookups
        need not copy a column of 10^7 values."""
        if not self._parts:
            out: NDArray[_T] = self._a[at]
            return out
        pieces = [self._a, *self._parts]
        values = np.empty(at.shape, dtype=self._a.dtype)
        if not at.size:
            return values
        lo, hi = int(at.min()), int(at.max())
        if lo < 0 or hi >= self.n:
            raise IndexError(f"index {lo if lo < 0 else hi} is out of bounds for size {self.n}")
        start = 0
        for piece in pieces:
            end = start + piece.size
            if start <= lo and hi < end:  # every index in this part: one gather
                values[...] = piece[at - start]
                break
            if start <= hi and lo < end:
                sel = (at >= start) & (at < end)
                values[sel] = piece[at[sel] - start]
            start = end
        return values

    def joined(self, tail: NDArray[_T]) -> NDArray[_T]:
        """The values followed by ``tail``, as one read-only array; the column holds a view
        of its head from then on, so a caller that needs both holds the values once."""
        # The parts are copied into the joined array directly: a column of 10^7 values is
        # then copied once, not first into a head of its own.
        pieces = [self._a, *self._parts, np.asarray(tail, dtype=self._a.dtype)]
        out = np.concatenate(pieces)
        out.flags.writeable = False
        self._a = out[: out.size - pieces[-1].size]
        self._parts = []
        return out

    @property
    def view(self) -> NDArray[_T]:
        if self._parts:
            self._a = np.concatenate([self._a, *self._parts])
            self._parts = []
        return self._a
