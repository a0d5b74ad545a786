"""The network: topologies, routing, max-min flow sharing and collective algorithms.

:class:`Network` is what the simulator uses: it maps ranks to chips, turns a
collective into the steps of its algorithm (:mod:`.collectives`) and runs them
one after another over a :class:`~.flows.FlowNetwork`, which shares the links
of a :class:`~.fabric.Topology` among all transfers in flight.

    env = simpy.Environment()
    net = Network(env, build_topology(instance, chip, count=2), rank_chip)
    done = net.collective("all_reduce", ranks=range(32), nbytes=64e6)

The package is in layers, each a subpackage that imports only those below it
(docs/architecture.md draws them):

- :mod:`.fabric`: the physical network: links, topologies and their routes, the
  scale-up builders and scale-out fabrics, registered by name;
- :mod:`.graphs`: the fabric as a networkx graph: export, bounded reading, checks,
  and a user's graph compiled into a topology (over ``fabric``);
- :mod:`.flows`: the fluid flow model: routed groups, max-min rates, shared HBM and
  link statistics (over ``fabric``);
- :mod:`.collectives`: the collective algorithms (:mod:`.collectives.algorithms`),
  their registry and the group placement they see (over ``fabric``);
- :mod:`.runtimes`: what the Neuron runtime or NCCL adds to a collective (over
  ``collectives``);
- on top, :mod:`.core` (:class:`Network`; the links a folded step's flows load:
  :mod:`.folded`) and :mod:`.microbench`, which times one collective like nccl-tests.
"""

from __future__ import annotations

from clustersim.network.collectives import (
    OPS,
    Algorithm,
    GroupInfo,
    Step,
    algorithm,
    algorithm_names,
    choose,
    collective_steps,
    group_info,
    register_algorithm,
    resolve_algorithm,
)
from clustersim.network.collectives import (
    collective_step_arrays as collective_step_arrays,
)
from clustersim.network.core import NO_PROTOCOL as NO_PROTOCOL
from clustersim.network.core import Network
from clustersim.network.fabric import (
    Topology,
    build_topology,
    register_topology,
    topology_names,
)
from clustersim.network.fabric import (
    distinct_pairs as distinct_pairs,
)
from clustersim.network.flows import (
    NO_CHIPS as NO_CHIPS,
)
from clustersim.network.flows import (
    FlowGroup,
    FlowNetwork,
    maxmin_rates,
    maxmin_rates_reference,
)
from clustersim.network.flows import (
    StageImages as StageImages,
)
from clustersim.network.flows import (
    link_counts as link_counts,
)
from clustersim.network.runtimes import NO_COSTS, Protocol, Runtime

__all__ = [
    "NO_COSTS",
    "OPS",
    "Algorithm",
    "FlowGroup",
    "FlowNetwork",
    "GroupInfo",
    "Network",
    "Protocol",
    "Runtime",
    "Step",
    "Topology",
    "algorithm",
    "algorithm_names",
    "build_topology",
    "choose",
    "collective_steps",
    "group_info",
    "maxmin_rates",
    "maxmin_rates_reference",
    "register_algorithm",
    "register_topology",
    "resolve_algorithm",
    "topology_names",
]
