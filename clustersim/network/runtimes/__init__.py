"""The runtimes layer: what a communication runtime adds to a collective's wire time.

The runtime contract and the Neuron runtime's fitted costs (:mod:`.costs`), NCCL's
choice of algorithm and protocol from its tuning model (:mod:`.nccl`), and the runtime
of a cluster's chip (:mod:`.cluster`). Over :mod:`~clustersim.network.collectives`.
"""

from __future__ import annotations

from clustersim.network.runtimes.cluster import runtime_of
from clustersim.network.runtimes.costs import (
    NO_COSTS,
    NeuronRuntime,
    Protocol,
    Runtime,
    neuron_protocol,
)
from clustersim.network.runtimes.nccl import PROTOCOLS, NcclRuntime, NcclTables, nccl_tables

__all__ = [
    "NO_COSTS",
    "PROTOCOLS",
    "NcclRuntime",
    "NcclTables",
    "NeuronRuntime",
    "Protocol",
    "Runtime",
    "nccl_tables",
    "neuron_protocol",
    "runtime_of",
]
