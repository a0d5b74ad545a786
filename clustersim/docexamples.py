"""Example runs the documentation quotes that need the simulator and the network.

Each entry of :data:`BLOCKS` is ``(name, compute, noise, what, pages)``: a generated
block of ``python -m clustersim.docs`` (which wraps it in its ``Figure``), computed
from the shipped scenarios.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

__all__ = ["BLOCKS", "sharp_example"]

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def sharp_example(ctx: object = None, scenario: str = "dgx-h100-llama3-70b-sharp") -> str:
    """The in-network reduction example run with the fabric's SHARP on and off, and a
    1 GiB all-reduce over four of its nodes each way (a Markdown table)."""
    del ctx
    from clustersim.network.microbench import run_collective
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    out = [
        "| SHARP | step time | exposed comm | MFU | all-reduce, 1 GiB over 4 nodes |",
        "|---|---|---|---|---|",
    ]
    base = 0.0
    for on in (True, False):
        res = load_scenario(SCENARIOS / f"{scenario}.yaml", [f"cluster.efa.sharp={on}"])
        s = simulate(res, record=False).summary
        step = float(s["step_time_s"])
        base = base or step
        (row,) = run_collective(res.instance.name, 4, "all_reduce", [2.0**30], efa={"sharp": on})
        delta = "" if on else f" ({step / base - 1:+.1%})"
        out.append(
            f"| {'on' if on else 'off'} | {step:.3f} s{delta} | "
            f"{s['breakdown_s']['exposed_comm']:.3f} s | {s['mfu']:.1%} | "
            f"{row['time_s'] * 1e3:.2f} ms, {row['busbw_GBps']:.0f} GB/s busbw "
            f"({row['algorithm']}) |"
        )
    return "\n".join(out)


BLOCKS: tuple[tuple[str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    (
        "sharp-example",
        sharp_example,
        0.01,
        "the in-network reduction example with SHARP on and off",
        ("docs/explanation/collectives.md",),
    ),
)
