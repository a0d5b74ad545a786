"""The communication runtime of a cluster: the Neuron runtime or NCCL (:mod:`.costs`)."""

from __future__ import annotations

from dataclasses import replace

from clustersim.catalog.schema import ChipSpec, InstanceSpec
from clustersim.errors import ScenarioError
from clustersim.names import closest
from clustersim.network.runtimes.costs import NeuronRuntime, Runtime, neuron_protocol
from clustersim.network.runtimes.nccl import PROTOCOLS, NcclRuntime

__all__ = ["runtime_of"]


def runtime_of(
    chip: ChipSpec,
    instance: InstanceSpec,
    *,
    protocol: str | None = None,
    in_program: bool = False,
) -> Runtime:
    """The runtime of ``chip``'s family on ``instance``: NCCL's tuning model on GPUs
    (it reads one rank's bandwidth inside the instance and across), else the Neuron
    runtime with the chip's fitted costs. ``protocol`` forces NCCL's protocol (LL,
    LL128 or Simple, as ``NCCL_PROTO`` does); the Neuron runtime has only its own.

    ``in_program``: the collectives run inside a compiled program (a training step or
    a serving iteration), not each launched from the host as nccom-test launches them.
    On the Neuron runtime such a collective is an instruction of the program: a compute
    engine triggers it on the collective cores (PseudoTriggerCollective2) and waits on
    its semaphore (aws-neuron-sdk neuron-runtime/explore/compute-comm-overlap.rst), so
    it pays no launch (``collectives.launch_s``), only its rounds' handshakes and
    messages. NCCL launches every collective's kernel, so nothing changes on GPUs."""
    if protocol is not None:
        if chip.runtime != "nccl":
            raise ScenarioError(
                "protocol", protocol, f"only NCCL (GPUs) has protocols; {chip.name} runs Neuron"
            )
        by_case = {name.lower(): name for name in PROTOCOLS}
        if protocol.strip().lower() not in by_case:
            near = closest(protocol, PROTOCOLS)
            hint = f"did you mean {near!r}? " if near else ""
            raise ScenarioError(
                "protocol", protocol, f"unknown NCCL protocol; {hint}valid: {', '.join(PROTOCOLS)}"
            )
        protocol = by_case[protocol.strip().lower()]
    if chip.runtime == "nccl":
        intra = instance.fabric.link_bw_Bps * chip.calibration.link_efficiency
        inter = instance.efa.bandwidth_Bps / instance.chips * chip.efa_link_efficiency
        runtime = NcclRuntime.of(
            chip,
            intra_Bps=intra,
            inter_Bps=inter,
            net_latency_s=instance.efa.latency_s,
            sharp=instance.efa.sharp,
        )
        return replace(runtime, only_protocol=protocol)
    proto = neuron_protocol(chip)
    return NeuronRuntime(replace(proto, launch_s=0.0) if in_program else proto)
