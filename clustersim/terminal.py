"""Where the commands print: a console that fits a terminal, and plain text for pipes.

On a terminal, rich tables fit its width. Anywhere else (a pipe, a file) the
console is as wide as the content, so a table takes the width of its columns and
no row is wrapped: ``clustersim run ... | grep MFU`` sees whole rows. Data (YAML,
JSON) never goes through rich, whose wrapping at the console's width would break
it: JSON is printed as ``json.dumps`` writes it, and :func:`print_yaml` writes YAML
with every value on one line, whatever the terminal.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["PIPE_WIDTH", "console", "print_yaml"]

PIPE_WIDTH = 100_000
"""Columns of the console when not on a terminal: wider than any table's content."""


def console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr): the terminal's width on a terminal,
    the content's width anywhere else."""
    from rich.console import Console

    con = Console(stderr=stderr)
    if con.is_terminal:
        return con
    return Console(stderr=stderr, width=PIPE_WIDTH)


def print_yaml(data: Any) -> None:
    """``data`` as YAML on stdout, each value on one line (no folding at 80 columns)."""
    import yaml

    sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1 << 30))
