"""Disaggregated serving: prefill and decode on separate replicas, KV moved over the fabric.

``serving.disaggregation: {prefill_replicas, decode_replicas}`` splits the cluster's
replicas (each ``parallelism.tp`` ranks, placed in rank order: the prefill replicas
first, then the decode replicas). A request is prefilled on a prefill replica; its KV
cache then moves to a decode replica, each of the ``tp`` ranks sending its shard to
the rank in the same position of the decode replica, all at once as one coflow
(NxD Inference's disaggregated inference moves KV device to device over EFA,
``libraries/nxd-inference/developer_guides/disaggregated-inference.rst``; inside a
Trn2 UltraServer the fabric is NeuronLink). The transfers are flows of the project's
network model on the serving run's own SimPy environment, so concurrent transfers
share links and an UltraServer's NeuronLink carries what stays inside it. The send's
latency is the chip runtime's, as for any point-to-point send. A request's first
token counts when its KV has arrived: TTFT includes the transfer.

Two replicas on one chip (tp below the ranks a chip holds) copy within its HBM, at
the chip's sustained HBM rate, read and written.
"""

from __future__ import annotations

import simpy

from clustersim.errors import ScenarioError
from clustersim.network import Network
from clustersim.network.fabric import build_topology
from clustersim.network.runtimes import runtime_of
from clustersim.scenario import Resolved
from clustersim.scenario.serving import DisaggregationCfg

__all__ = ["FabricKvTransfer", "check_disaggregation"]


def check_disaggregation(cfg: DisaggregationCfg, fit: int, tp: int) -> int:
    """The replicas a disaggregated run needs, checked against the ``fit`` replicas of
    ``tp`` ranks the cluster holds (exit 2 naming the key)."""
    total = cfg.prefill_replicas + cfg.decode_replicas
    if total > fit:
        raise ScenarioError(
            "serving.disaggregation",
            f"{cfg.prefill_replicas} + {cfg.decode_replicas}",
            f"{total} replicas of tp {tp} exceed the {fit} the cluster holds",
        )
    return total


class FabricKvTransfer:
    """``kv(source, target, tokens)``: an event for the end of moving ``tokens`` tokens of
    KV from replica ``source`` to replica ``target`` over the cluster's fabric."""

    def __init__(
        self, env: simpy.Environment, res: Resolved, tp: int, kv_bytes_per_token_per_rank: float
    ) -> None:
        self.env = env
        self.tp = tp
        self.per_token = kv_bytes_per_token_per_rank
        self.ranks_per_chip = res.ranks_per_chip
        topology = build_topology(res.instance, res.chip, res.scenario.cluster.count)
        rank_chip = [r // res.ranks_per_chip for r in range(res.ranks)]
        self.net = Network(
            env, topology, rank_chip, dict(res.scenario.cluster.collectives),
            runtime=runtime_of(res.chip, res.instance),
        )  # fmt: skip
        hbm = res.chip.hbm_bw_Bps * res.chip.calibration.hbm_efficiency
        self.local_s_per_byte = 2.0 / hbm  # read and write, the whole chip's HBM
        self.bytes_moved = 0.0
        self.transfers = 0

    def kv(self, source: int, target: int, tokens: int) -> simpy.Event:
        nbytes = tokens * self.per_token
        self.bytes_moved += nbytes * self.tp
        self.transfers += 1
        src = [source * self.tp + j for j in range(self.tp)]
        dst = [target * self.tp + j for j in range(self.tp)]
        if src[0] // self.ranks_per_chip == dst[0] // self.ranks_per_chip:
            return self.env.timeout(nbytes * self.tp * self.local_s_per_byte)
        rows = [[s, d] for s, d in zip(src, dst, strict=True)]
        return self.net.send(src[0], dst[0], nbytes, replicas=rows)
