"""Commands the documentation shows with what they print, run as a reader runs them.

Each command runs as ``python -m clustersim`` in a subprocess (:func:`clustersim_command`),
with the words the page shows; where it prints tables, it runs again with ``--json``
and its tables are drawn from that output by the function the command prints with,
as plain text (no box), the wall times left out (quoted apart, with their noise).
The ``clustersim run`` of a shipped scenario whose figures a page quotes (a step time
a command is then given, the lane-loss example's steps) is simulated in this process,
as ``run`` simulates it.

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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "COLLECTIVE",
    "FIGURES",
    "LANE_LOSS",
    "RELIABILITY",
    "SETTINGS",
    "checkpoint_figure",
    "clustersim_command",
    "collective_output",
    "lane_loss",
    "lane_loss_figure",
    "lane_loss_slowdown",
    "lane_loss_table",
    "reliability_argv",
    "reliability_figure",
    "reliability_output",
    "reliability_settings",
    "reliability_wall",
    "simulated_step",
    "step_figure",
]

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


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


RELIABILITY: dict[str, tuple[str, tuple[str, ...]]] = {
    "llama3": ("llama3-16k-54days", ("--step-time", "{step}", "--seeds", "64")),
    "checkpoint-study": (
        "checkpoint-interval-study",
        ("--checkpoint-study", "--step-time", "{step}"),
    ),
}
"""The failure-study tutorial's ``clustersim reliability`` commands, by name: the
scenario and the words after it, ``{step}`` standing for its simulated step time (as
``clustersim run`` simulates it, to 10 ms)."""


@functools.cache
def simulated_step(scenario: str) -> dict[str, Any]:
    """A shipped scenario with a failures section as ``clustersim run`` simulates it: its
    summary (the step and the long-horizon seeds), with the wall time of the whole run
    as ``_wall_s``; once per process."""
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    t0 = time.perf_counter()
    res = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml")
    summary = dict(simulate(res, record=False).summary)
    summary["_wall_s"] = time.perf_counter() - t0
    return summary


def reliability_argv(name: str, seeds: int | None = None) -> tuple[str, ...]:
    """The words of ``RELIABILITY[name]``'s command (``--seeds seeds`` in place of the
    page's where given)."""
    scenario, words = RELIABILITY[name]
    step = f"{simulated_step(scenario)['step_time_s']:.2f}s"
    argv = [
        "reliability",
        f"scenarios/{scenario}.yaml",
        *(w.replace("{step}", step) for w in words),
    ]
    if seeds is not None:
        i = argv.index("--seeds")
        argv[i + 1] = str(seeds)
    return tuple(argv)


def reliability_output(name: str) -> Callable[[object], str]:
    """What ``clustersim reliability`` prints for ``RELIABILITY[name]`` (its wall times
    left out), fenced with its command."""

    def compute(ctx: object = None) -> str:
        from clustersim.failures.command import tables
        from clustersim.terminal import table_text

        argv = reliability_argv(name)
        result = _json(argv)
        return _fenced(argv, "\n".join(table_text(t) for t in tables(result, wall=False)))

    return compute


def reliability_wall(name: str, part: str = "seeds") -> Callable[[object], str]:
    """The wall time of ``RELIABILITY[name]``'s seeds (``part="seeds"``) or of its
    checkpoint study (``part="study"``), in seconds as the page quotes it."""

    def compute(ctx: object = None) -> str:
        result = _json(reliability_argv(name))
        wall = result["checkpoint_study"]["wall_s"] if part == "study" else result["wall_s"]
        return f"{wall:.0f} s"

    return compute


def reliability_figure(
    name: str, key: str, fmt: str, seeds: int | None = None
) -> Callable[[object], str]:
    """``key`` of ``RELIABILITY[name]``'s result (with ``--seeds seeds`` in place of the
    page's seeds where given), formatted with ``fmt``."""

    def compute(ctx: object = None) -> str:
        return format(_json(reliability_argv(name, seeds))[key], fmt)

    return compute


SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("as above (`restart_all`, 32 spares, sync checkpoints)", ()),
    ("`recovery: migrate_affected`", ("failures.recovery=migrate_affected",)),
    (
        "`continue_degraded`, cut links cost +{lane_loss} of step time (one lane per link)",
        ("failures.recovery=continue_degraded", "failures.degraded_slowdown={lane_loss}"),
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
``llama3`` command, run with 16 seeds. ``{lane_loss}`` is the lane-loss example's
slowdown after a lost lane with one lane per link (:func:`lane_loss_slowdown`)."""


def reliability_settings(ctx: object = None) -> str:
    """:data:`SETTINGS` run with ``clustersim reliability``: goodput, ETTR and cost per
    useful token (a Markdown table)."""
    del ctx
    base = reliability_argv("llama3", seeds=16)
    out = ["| setting | goodput | ETTR | $/M useful tokens |", "|---|---|---|---|"]
    slowdown = lane_loss_slowdown()
    for label, sets in SETTINGS:
        shown_sets = (s.replace("{lane_loss}", f"{slowdown:.3f}") for s in sets)
        r = _json((*base, *(w for s in shown_sets for w in ("--set", s))))
        shown = label.replace("{interval}", f"{r['checkpoint']['interval_s']:.0f} s")
        shown = shown.replace("{lane_loss}", f"{slowdown - 1:.1%}")
        usd = r["cost"]["usd_per_million_useful_tokens"]
        out.append(f"| {shown} | {r['goodput']:.2%} | {r['ettr']:.2%} | {usd:.2f} |")
    return "\n".join(out)


def step_figure(scenario: str, what: str) -> Callable[[object], str]:
    """A figure of ``scenario``'s run (:func:`simulated_step`): ``"step"``, its step time;
    ``"wall"``, the wall time of the run (the step and the long-horizon seeds)."""

    def compute(ctx: object = None) -> str:
        s = simulated_step(scenario)
        if what == "step":
            return f"{s['step_time_s']:.2f} s"
        wall = s["_wall_s"]
        return f"{wall:.1f} s" if wall < 10 else f"{wall:.0f} s"

    return compute


def checkpoint_figure(what: str) -> Callable[[object], str]:
    """A figure of the checkpoint study's job: ``"size"``, the checkpoint; ``"write"``, its
    write time; ``"mtbf"``, the job's mean time between failures."""

    def compute(ctx: object = None) -> str:
        from clustersim.units import format_seconds

        r = _json(reliability_argv("checkpoint-study"))
        if what == "size":
            return f"{r['checkpoint']['size_bytes'] / 1e12:.1f} TB"
        if what == "write":
            return f"{r['checkpoint']['write_s']:.0f} s"
        return format_seconds(r["mtbf_s"])

    return compute


LANE_LOSS = "trn2-ultraserver-lane-loss"
"""The failure study's example: a lane of the chip0-chip1 cable lost as the first step
starts, on a Trn2 UltraServer with 1, 2 or 4 lanes per link."""


@functools.cache
def lane_loss(sets: tuple[str, ...] = ()) -> dict[str, Any]:
    """:data:`LANE_LOSS` run with ``sets``, as ``clustersim run`` simulates it: its summary,
    with the wall time of the simulation as ``_wall_s``; once per process."""
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    t0 = time.perf_counter()
    summary = simulate(load_scenario(SCENARIOS / f"{LANE_LOSS}.yaml", list(sets)), record=False)
    out = dict(summary.summary)
    out["_wall_s"] = time.perf_counter() - t0
    return out


def _lanes(n: int, healthy: bool = False) -> tuple[str, ...]:
    return (*((f"cluster.neuronlink.lanes={n}",) if n > 1 else ()),) + (
        ("failures.inject=[]",) if healthy else ()
    )


def lane_loss_slowdown() -> float:
    """The lane-loss example's steps after the failure over its healthy step, one lane
    per link (the lost lane is the link, routed around), to three decimals."""
    after = float(lane_loss(_lanes(1))["step_times_s"][-1])
    return round(after / float(lane_loss(_lanes(1, healthy=True))["step_time_s"]), 3)


def lane_loss_table(ctx: object = None) -> str:
    """The lane-loss example's step times, healthy and with the lane lost, by lanes per
    link, and the penalty of the steps after the failure (a Markdown table)."""
    del ctx
    healthy = {n: lane_loss(_lanes(n, healthy=True))["step_time_s"] for n in (1, 2, 4)}
    if len({f"{s * 1e3:.1f}" for s in healthy.values()}) != 1:
        raise RuntimeError(f"{LANE_LOSS}: healthy steps differ by lanes: {healthy}")
    base = healthy[1]
    out = [
        "| lanes per link | step with the failure | steps after it | penalty after it |",
        "|---|---|---|---|",
        f"| healthy (1, 2 or 4) | {base * 1e3:.1f} ms | {base * 1e3:.1f} ms | |",
    ]
    for n in (1, 2, 4):
        first, *after = lane_loss(_lanes(n))["step_times_s"]
        label = "1 (the lane is the link)" if n == 1 else str(n)
        out.append(
            f"| {label} | {first * 1e3:.1f} ms | {after[-1] * 1e3:.1f} ms "
            f"| {after[-1] / healthy[n] - 1:+.1%} |"
        )
    return "\n".join(out)


def lane_loss_figure(what: str) -> Callable[[object], str]:
    """A figure of the lane-loss example's prose: ``"delay0"`` and ``"delay50"``, the failing
    step with routing noticing at once or after 50 ms (one lane per link); ``"shown"``, the
    part of the 10 ms detection the failing step shows; ``"exposed"``, the healthy step's
    exposed communication; ``"wall"``, the wall time of one run."""

    def compute(ctx: object = None) -> str:
        if what in ("delay0", "delay50"):
            delay = what.removeprefix("delay")
            first = lane_loss((f"failures.link_detect_delay={delay}ms",))["step_times_s"][0]
            return f"{first * 1e3:.1f} ms"
        if what == "shown":
            first, *after = lane_loss()["step_times_s"]
            return f"{(first - after[-1]) * 1e3:.0f} ms"
        if what == "exposed":
            s = lane_loss(_lanes(1, healthy=True))
            return f"{s['breakdown_s']['exposed_comm'] / s['step_time_s']:.0%}"
        return f"{lane_loss()['_wall_s']:.0f} s"

    return compute


_FAILURES = "docs/tutorials/failure-study.md"
_LLAMA3, _STUDY = RELIABILITY["llama3"][0], RELIABILITY["checkpoint-study"][0]
_WALL_NOISE = 4.0  # a shared machine's load moves wall times several-fold
FIGURES: tuple[tuple[str, str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    ("collective-output", "", collective_output, 0.0,
     "what `clustersim collective` prints for an all-reduce over one Trn2 UltraServer",
     ("docs/explanation/collectives.md",)),
    ("llama3-step", r"simulates its step \(([0-9.]+ s), folded", step_figure(_LLAMA3, "step"),
     0.0, "the Llama-3-like job's simulated step, which its commands give", (_FAILURES,)),
    ("llama3-run-wall", r"54 days in ([0-9.]+ s) on", step_figure(_LLAMA3, "wall"),
     _WALL_NOISE, "wall time of `clustersim run` on the Llama-3-like job", (_FAILURES,)),
    ("reliability-llama3", "", reliability_output("llama3"), 0.0,
     "what `clustersim reliability` prints for the Llama-3-like job at a given step time "
     "(no wall time)", (_FAILURES,)),
    ("lane-loss", "", lane_loss_table, 0.0,
     "the lane-loss example's step times by lanes per link", (_FAILURES,)),
    ("lane-loss-shown", r"\(of which (\d+ ms) shows in the step", lane_loss_figure("shown"),
     0.0, "the part of the 10 ms detection the failing step shows", (_FAILURES,)),
    ("lane-loss-delay0", r"`link_detect_delay: 0` the failing step takes ([0-9.]+ ms)",
     lane_loss_figure("delay0"), 0.0, "the failing step when routing notices at once",
     (_FAILURES,)),
    ("lane-loss-delay50", r"with 50 ms it takes ([0-9.]+ ms)", lane_loss_figure("delay50"),
     0.0, "the failing step when routing notices after 50 ms", (_FAILURES,)),
    ("lane-loss-exposed", r"whose step is (\d+%) exposed communication",
     lane_loss_figure("exposed"), 0.0, "the healthy step's exposed communication",
     (_FAILURES,)),
    ("lane-loss-wall", r"Each run takes about (\d+ s) of\s+simulation",
     lane_loss_figure("wall"), _WALL_NOISE, "wall time of one lane-loss run", (_FAILURES,)),
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
    ("checkpoint-study-step", r"its step, simulated, takes ([0-9.]+ s)",
     step_figure(_STUDY, "step"), 0.0, "the checkpoint-interval example's simulated step",
     (_FAILURES,)),
    ("checkpoint-study-size", r"checkpointing ([0-9.]+ TB) at", checkpoint_figure("size"), 0.0,
     "the checkpoint-interval example's checkpoint", (_FAILURES,)),
    ("checkpoint-study-write", r"\(([0-9.]+ s) per write\)", checkpoint_figure("write"), 0.0,
     "its write time", (_FAILURES,)),
    ("checkpoint-study-mtbf", r"\(job MTBF ([0-9.]+ h)\)", checkpoint_figure("mtbf"), 0.0,
     "the checkpoint-interval example's job MTBF", (_FAILURES,)),
    ("reliability-checkpoint-study", "", reliability_output("checkpoint-study"), 0.0,
     "what `clustersim reliability --checkpoint-study` prints for the checkpoint-interval "
     "example (no wall times)", (_FAILURES,)),
    ("reliability-checkpoint-study-wall", r"replications of 120 days took ([0-9.]+ s)",
     reliability_wall("checkpoint-study", "study"), _WALL_NOISE,
     "wall time of the checkpoint-interval study", (_FAILURES,)),
)  # fmt: skip
