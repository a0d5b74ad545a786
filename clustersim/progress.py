"""A transient progress bar on the terminal, shown only once work takes a while.

The ``run``, ``search`` and ``reliability`` commands each report progress through
one :class:`Bar`: it opens on the first update after ``delay_s`` (short work
prints nothing), draws on the given console (stderr, so ``--json`` output stays
clean) and disappears when closed. ``rich`` is imported only when a bar opens.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

__all__ = ["Bar"]


class Bar:
    """A progress bar of ``label``: a count (``done/total``) or, with ``percent``, a
    percentage; with ``eta``, the time remaining. ``template`` formats the label."""

    def __init__(
        self,
        console: Console,
        label: str = "",
        *,
        delay_s: float = 0.0,
        percent: bool = False,
        eta: bool = False,
        template: str = "{task.description}",
    ) -> None:
        self.console, self.label = console, label
        self.delay_s, self.percent, self.eta, self.template = delay_s, percent, eta, template
        self.t0 = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None

    def update(self, completed: float, total: float, label: str | None = None) -> None:
        """``completed`` of ``total`` done (and a new label, if given)."""
        if label is not None:
            self.label = label
        if self._bar is None:
            if time.perf_counter() - self.t0 < self.delay_s:
                return
            self._open(total)
        self._bar.update(self._task, completed=completed, total=total, description=self.label)

    def _open(self, total: float) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        count: ProgressColumn = (
            TextColumn("{task.percentage:>3.0f}%") if self.percent else MofNCompleteColumn()
        )
        columns = [TextColumn(self.template), BarColumn(), count, TimeElapsedColumn()]
        if self.eta:
            columns.append(TimeRemainingColumn())
        self._bar = Progress(*columns, console=self.console, transient=True)
        self._bar.start()
        self._task = self._bar.add_task(self.label, total=total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
