"""Commands the documentation shows with what they print, run as a reader runs them.

Each command runs as ``python -m clustersim`` in a subprocess (:func:`clustersim_command`),
with the words the page shows; where it prints tables, it runs again with ``--json``
and its tables are drawn from that output by the function the command prints with,
as plain text (no box), the wall times left out (quoted apart, with their noise).

Each entry of :data:`FIGURES` is ``(name, pattern, compute, noise, what, pages)``, a
figure of ``python -m clustersim.docs`` (a block where ``pattern`` is empty). Each
command runs once per process, however many figures quote it.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "COLLECTIVE",
    "FIGURES",
    "RELIABILITY",
    "SETTINGS",
    "clustersim_command",
    "collective_output",
    "reliability_figure",
    "reliability_output",
    "reliability_settings",
    "reliability_wall",
]

ROOT = Path(__file__).resolve().parent.parent


def clustersim_command(argv: list[str], cwd: Path = ROOT) -> tuple[int, str, str]:
    """``clustersim ARGV`` run as a reader runs it, in ``cwd``: exit code, stdout, stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    proc = subprocess.run(
        [sys.executable, "-m", "clustersim", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


@functools.cache
def _json(argv: tuple[str, ...]) -> Any:
    """What ``clustersim ARGV --json`` prints, parsed; once per process."""
    code, out, err = clustersim_command([*argv, "--json"])
    if code != 0:
        raise RuntimeError(f"clustersim {shlex.join(argv)}: exit {code}: {err.strip()}")
    return json.loads(out)


def _fenced(argv: tuple[str, ...], text: str) -> str:
    return f"```\n$ clustersim {shlex.join(argv)}\n{text}\n```"


COLLECTIVE = (
    "collective", "--instance", "trn2u.48xlarge", "--count", "4", "--op", "all_reduce",
    "--min", "1MiB", "--max", "4GiB",
)  # fmt: skip
"""The collectives page's ``clustersim collective``: an all-reduce over one Trn2
UltraServer, 1 MiB to 4 GiB."""


def collective_output(ctx: object = None) -> str:
    """What ``clustersim collective`` prints for :data:`COLLECTIVE`, fenced with its
    command as the page quotes it."""
    del ctx
    from clustersim.network.microbench import collective_table
    from clustersim.terminal import table_text

    rows = _json(COLLECTIVE)
    opt = dict(zip(COLLECTIVE[1::2], COLLECTIVE[2::2], strict=True))
    title = f"{opt['--op']} on {opt['--count']} x {opt['--instance']}, {rows[0]['ranks']} ranks"
    return _fenced(COLLECTIVE, table_text(collective_table(rows, title)))


RELIABILITY: dict[str, tuple[str, ...]] = {
    "llama3": (
        "reliability", "scenarios/llama3-16k-54days.yaml", "--step-time", "11.44s",
        "--seeds", "64",
    ),
    "checkpoint-study": (
        "reliability", "scenarios/checkpoint-interval-study.yaml", "--checkpoint-study",
        "--step-time", "60.14s",
    ),
}  # fmt: skip
"""The failure-study tutorial's ``clustersim reliability`` commands, by name."""


def reliability_output(name: str) -> Callable[[object], str]:
    """What ``clustersim reliability`` prints for ``RELIABILITY[name]`` (its wall times
    left out), fenced with its command."""

    def compute(ctx: object = None) -> str:
        from clustersim.failures.command import tables
        from clustersim.terminal import table_text

        argv = RELIABILITY[name]
        result = _json(argv)
        return _fenced(argv, "\n".join(table_text(t) for t in tables(result, wall=False)))

    return compute


def reliability_wall(name: str, part: str = "seeds") -> Callable[[object], str]:
    """The wall time of ``RELIABILITY[name]``'s seeds (``part="seeds"``) or of its
    checkpoint study (``part="study"``), in seconds as the page quotes it."""

    def compute(ctx: object = None) -> str:
        result = _json(RELIABILITY[name])
        wall = result["checkpoint_study"]["wall_s"] if part == "study" else result["wall_s"]
        return f"{wall:.0f} s"

    return compute


def reliability_figure(
    name: str, key: str, fmt: str, seeds: int | None = None
) -> Callable[[object], str]:
    """``key`` of ``RELIABILITY[name]``'s result (with ``--seeds seeds`` in place of the
    page's seeds where given), formatted with ``fmt``."""

    def compute(ctx: object = None) -> str:
        argv = RELIABILITY[name]
        if seeds is not None:
            i = argv.index("--seeds")
            argv = (*argv[: i + 1], str(seeds), *argv[i + 2 :])
        return format(_json(argv)[key], fmt)

    return compute


SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("as above (`restart_all`, 32 spares, sync checkpoints)", ()),
    ("`recovery: migrate_affected`", ("failures.recovery=migrate_affected",)),
    (
        "`continue_degraded`, cut links cost +17.4% of step time (one lane per link)",
        ("failures.recovery=continue_degraded", "failures.degraded_slowdown=1.174"),
    ),
    (
        "`continue_degraded`, cut links cost +3%",
        ("failures.recovery=continue_degraded", "failures.degraded_slowdown=1.03"),
    ),
    ("`spares: 0` (every node failure waits 2 h for a new node)", ("failures.spares=0",)),
    (
        "`checkpoint: {mode: async, snapshot_time: 0.5s}` (every {interval})",
        ("failures.checkpoint.mode=async", "failures.checkpoint.snapshot_time=0.5s"),
    ),
)
"""The failure study's other settings of the Llama-3-like job: a row's label (its
checkpoint interval filled in) and its ``--set`` values on :data:`RELIABILITY`'s
``llama3`` command, run with 16 seeds."""


def reliability_settings(ctx: object = None) -> str:
    """:data:`SETTINGS` run with ``clustersim reliability``: goodput, ETTR and cost per
    useful token (a Markdown table)."""
    del ctx
    base = RELIABILITY["llama3"]
    i = base.index("--seeds")
    out = ["| setting | goodput | ETTR | $/M useful tokens |", "|---|---|---|---|"]
    for label, sets in SETTINGS:
        argv = (*base[: i + 1], "16", *base[i + 2 :], *(w for s in sets for w in ("--set", s)))
        r = _json(argv)
        shown = label.replace("{interval}", f"{r['checkpoint']['interval_s']:.0f} s")
        usd = r["cost"]["usd_per_million_useful_tokens"]
        out.append(f"| {shown} | {r['goodput']:.2%} | {r['ettr']:.2%} | {usd:.2f} |")
    return "\n".join(out)


_FAILURES = "docs/tutorials/failure-study.md"
_WALL_NOISE = 4.0  # a shared machine's load moves wall times several-fold
FIGURES: tuple[tuple[str, str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    ("collective-output", "", collective_output, 0.0,
     "what `clustersim collective` prints for an all-reduce over one Trn2 UltraServer",
     ("docs/explanation/collectives.md",)),
    ("reliability-llama3", "", reliability_output("llama3"), 0.0,
     "what `clustersim reliability` prints for the Llama-3-like job at a given step time "
     "(no wall time)", (_FAILURES,)),
    ("reliability-llama3-interruptions", r"the simulation gives ([0-9.]+) \(one seed",
     reliability_figure("llama3", "interruptions", ".1f"), 0.0,
     "mean interruptions of the Llama-3-like job over 64 seeds", (_FAILURES,)),
    ("reliability-llama3-one-seed", r"one seed alone: ([0-9.]+),",
     reliability_figure("llama3", "interruptions", ".0f", seeds=1), 0.0,
     "interruptions of the Llama-3-like job's first seed alone", (_FAILURES,)),
    ("reliability-llama3-ettr", r"within 10%\) and\s+([0-9.]+%)",
     reliability_figure("llama3", "ettr", ".1%"), 0.0,
     "mean ETTR of the Llama-3-like job over 64 seeds", (_FAILURES,)),
    ("reliability-settings", "", reliability_settings, 0.0,
     "the Llama-3-like job under other settings, 16 seeds each", (_FAILURES,)),
    ("reliability-llama3-wall", r"The 64 seeds took ([0-9.]+ s)", reliability_wall("llama3"),
     _WALL_NOISE, "wall time of the Llama-3-like job's 64 seeds", (_FAILURES,)),
    ("reliability-checkpoint-study", "", reliability_output("checkpoint-study"), 0.0,
     "what `clustersim reliability --checkpoint-study` prints for the checkpoint-interval "
     "example (no wall times)", (_FAILURES,)),
    ("reliability-checkpoint-study-wall", r"replications of 120 days took ([0-9.]+ s)",
     reliability_wall("checkpoint-study", "study"), _WALL_NOISE,
     "wall time of the checkpoint-interval study", (_FAILURES,)),
)  # fmt: skip
