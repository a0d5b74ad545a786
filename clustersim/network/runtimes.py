"""The communication runtime of a cluster: the Neuron runtime or NCCL (:mod:`.costs`)."""

from __future__ import annotations

from clustersim.catalog.schema import ChipSpec, InstanceSpec
from clustersim.network.costs import NeuronRuntime, Runtime, neuron_protocol
from clustersim.network.nccl import NcclRuntime

__all__ = ["runtime_of"]


def runtime_of(chip: ChipSpec, instance: InstanceSpec) -> Runtime:
    """The runtime of ``chip``'s family on ``instance``: NCCL's tuning model on GPUs
    (it reads one rank's bandwidth inside the instance and across), else the Neuron
    runtime with the chip's fitted costs."""
    if chip.runtime == "nccl":
        intra = instance.fabric.link_bw_Bps * chip.calibration.link_efficiency
        inter = instance.efa.bandwidth_Bps / instance.chips * chip.efa_link_efficiency
        return NcclRuntime.of(
            chip, intra_Bps=intra, inter_Bps=inter, net_latency_s=instance.efa.latency_s
        )
    return NeuronRuntime(neuron_protocol(chip))
