"""What the simulator's programs and summaries hold, for tests of several modules."""

from __future__ import annotations

from scenario_texts import TINY

from clustersim.hardware.work import Work
from clustersim.scenario import load_scenario
from clustersim.sim import plan

BREAKDOWN_PARTS = {
    "compute",
    "exposed_comm",
    "bubble",
    "optimizer",
    "interference",
    "host",
    "other",
}
"""``summary.json``'s ``breakdown_s`` keys."""


def attention_core(sets: list[str], phase: str = "fwd") -> dict[str, Work]:
    """The attention core's ops of one ``phase`` of TINY's first stage, by name."""
    prog = plan(load_scenario(TINY, sets)).programs[0]
    return {
        i.name: i.work
        for i in prog.instrs
        if i.name.startswith("attn.core") and i.work is not None and i.phase == phase
    }
