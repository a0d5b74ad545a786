"""Figures of the calibration page's analyses that the simulator recomputes in seconds.

- The Trn1 tensor-parallel collectives of 32 MiB round by round: halving-doubling over
  8 ranks of one trn1.32xlarge (two NeuronCores on each of four chips of a torus row),
  each round's bytes, its flows' rate on the wire and the DMA rate that holds it, and
  the whole collectives with the Neuron runtime's costs, against a ring
  (``tests/network/test_trn1_halving_doubling.py`` checks the rounds against closed
  forms).
- The trn1-llama2-7b reference's exposed communication as shipped and with its
  reduce-scatters and all-gathers forced to rings (``cluster.collectives``).

Each entry of :data:`FIGURES` is ``(name, pattern, compute, noise, what, pages)``, a
figure of ``python -m clustersim.docs`` (a block where ``pattern`` is empty).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FIGURES", "trn1_rings_exposed", "trn1_tp_rounds"]

TP_BYTES = 32 * 2.0**20
"""The Trn1 TP collectives' size: trn1-llama2-7b's reduce-scatters and all-gathers."""
RINGS = ("cluster.collectives={reduce_scatter: ring, all_gather: ring}",)


def _collective_ms(op: str, algorithm: str) -> float:
    from clustersim.network.microbench import run_collective

    (row,) = run_collective(
        "trn1.32xlarge", 1, op, [TP_BYTES], algorithm=algorithm, ranks=8, lnc=1, overheads=True
    )
    return float(row["time_s"]) * 1e3


def trn1_tp_rounds(ctx: object = None) -> str:
    """Halving-doubling's reduce-scatter of 32 MiB over Trn1's TP group, round by round (a
    Markdown table), and the reduce-scatter, all-gather and ring with the runtime's costs."""
    del ctx
    from clustersim import catalog
    from clustersim.network.fabric import local_path

    chip, inst = catalog.chip("trn1"), catalog.instance("trn1.32xlarge")
    link = inst.fabric.link_bw_Bps * chip.calibration.link_efficiency
    local, _ = local_path(chip)
    engines = chip.collectives.message_engines
    copy = engines * chip.dma_engine_Bps
    reducing = copy * chip.dma_reduce_throughput
    rounds = (
        ("the two cores of a chip, over the DMA path", "n/2", TP_BYTES / 2, local / 2),
        ("neighbouring chips, both cores of a chip on one link direction", "n/4",
         TP_BYTES / 4, link / 2),
        ("chips two hops apart, two flows on a link direction", "n/8", TP_BYTES / 8, link / 2),
    )  # fmt: skip
    out = [
        "| round | pairs | bytes | each flow's rate on the wire | time at the reducing DMA rate |",
        "|---|---|---|---|---|",
    ]
    for i, (pairs, share, nbytes, rate) in enumerate(rounds, 1):
        held = nbytes / min(rate, reducing)
        out.append(f"| {i} | {pairs} | {share} | {rate / 1e9:.1f} GB/s | {held * 1e6:,.0f} µs |")
    rs, ag = (
        _collective_ms("reduce_scatter", "halving_doubling"),
        _collective_ms("all_gather", "halving_doubling"),
    )
    ring = _collective_ms("reduce_scatter", "ring")
    out += [
        "",
        f"The reducing DMA rate is {engines:.2f} engines x {chip.dma_engine_Bps / 1e9:.0f} B/ns "
        f"x {chip.dma_reduce_throughput:g} = {reducing / 1e9:.1f} GB/s, below every round's "
        f"wire rate. Launched from the host, with the launch and three rounds' handshake and "
        f"posting, the reduce-scatter costs {rs:.2f} ms, the all-gather {ag:.2f} ms (its "
        f"chip-to-chip rounds at the links' {link / 2e9:.1f} GB/s, its on-chip one at the "
        f"copy's {copy / 1e9:.1f} GB/s), and a ring reduce-scatter {ring:.2f} ms.",
    ]
    return "\n".join(out)


def trn1_rings_exposed(ctx: object = None) -> str:
    """trn1-llama2-7b's exposed communication as shipped, and with rings."""
    del ctx
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate
    from clustersim.validation.rows import references
    from clustersim.validation.training import scenario_text

    ref = next(r for r in references().training if r.name == "trn1-llama2-7b")
    exposed = [
        simulate(load_scenario(scenario_text(ref), list(sets)), record=False).summary[
            "breakdown_s"
        ]["exposed_comm"]
        for sets in ((), RINGS)
    ]
    return f"{exposed[0]:.2f} s to {exposed[1]:.2f} s"


_CAL = ("docs/explanation/calibration.md",)
FIGURES: tuple[tuple[str, str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    ("trn1-tp-rounds", "", trn1_tp_rounds, 0.0,
     "Trn1's 32 MiB TP collectives round by round, with the runtime's costs", _CAL),
    ("trn1-rings-exposed", r"exposed communication falls from\s+(\d+\.\d+ s to\s+\d+\.\d+ s)",
     trn1_rings_exposed, 0.0,
     "trn1-llama2-7b's exposed communication as shipped and with rings", _CAL),
)  # fmt: skip
