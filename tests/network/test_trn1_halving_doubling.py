"""Halving-doubling over 8 ranks of one trn1.32xlarge (4 chips of a torus row x 2 cores),
reduce-scatter and all-gather of 32 MiB, step by step against closed forms.

Rank ``r`` sits on chip ``r // 2``; chips 0-3 are one row of the 4x4 torus. The
rounds of the reduce-scatter pair ranks 1, 2 and 4 apart and move n/2, n/4, n/8:
the two cores of a chip (the DMA path through HBM), neighbouring chips (one link,
both cores of a chip sharing it) and chips half way round the row (two hops). The
all-gather runs the same rounds in reverse, moving n/8, n/4, n/2, with no reduction.
"""

from __future__ import annotations

import pytest

from clustersim import catalog
from clustersim.network.fabric import local_path
from clustersim.network.microbench import run_collective
from clustersim.network.runtimes import neuron_protocol

N = 32 * 2.0**20
CHIP = catalog.chip("trn1")
INST = catalog.instance("trn1.32xlarge")
LINK_BPS = INST.fabric.link_bw_Bps * CHIP.calibration.link_efficiency
HOP_S = INST.fabric.link_latency_s
LOCAL_BPS, LOCAL_S = local_path(CHIP)
# (bytes, rate of each flow on the wire alone, route latency) per reduce-scatter round:
# both cores of a chip share the local path; both ranks of a chip share the link to a
# neighbour; chips half way round split over the row's two directions, so each link
# direction carries one chip's two ranks, as a neighbour link does.
ROUNDS = [
    (N / 2, LOCAL_BPS / 2, LOCAL_S),
    (N / 4, LINK_BPS / 2, HOP_S),
    (N / 8, LINK_BPS / 2, 2 * HOP_S),
]


def _time(op: str, *, overheads: bool) -> float:
    (row,) = run_collective(
        "trn1.32xlarge",
        1,
        op,
        [N],
        algorithm="halving_doubling",
        ranks=8,
        lnc=1,
        overheads=overheads,
    )
    return float(row["time_s"])


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
def test_wire_time_is_each_rounds_bytes_over_its_share(op: str) -> None:
    expected = sum(nbytes / rate + latency for nbytes, rate, latency in ROUNDS)
    assert _time(op, overheads=False) == pytest.approx(expected, rel=1e-9)


def test_neuron_costs_cap_each_message_and_reduce_only_in_the_reduce_scatter() -> None:
    proto = neuron_protocol(CHIP)
    copy = CHIP.collectives.message_engines * CHIP.dma_engine_Bps  # 1.86 x 17 B/ns
    fixed = proto.launch_s + sum(lat + proto.step_s + proto.message_s for _, _, lat in ROUNDS)
    reducing = copy * CHIP.dma_reduce_throughput
    reduce = sum(nbytes / min(rate, reducing) for nbytes, rate, _ in ROUNDS)
    gather = sum(nbytes / min(rate, copy) for nbytes, rate, _ in ROUNDS)
    assert _time("reduce_scatter", overheads=True) == pytest.approx(fixed + reduce, rel=1e-9)
    assert _time("all_gather", overheads=True) == pytest.approx(fixed + gather, rel=1e-9)
    # every reduce-scatter round is held to the reducing DMA rate, 15.8 GB/s on Trn1;
    # the all-gather's chip-to-chip rounds to the link's share, its on-chip one to the copy
    assert all(rate > reducing for _, rate, _ in ROUNDS)
    assert ROUNDS[1][1] < copy < ROUNDS[0][1]
