"""The flows layer: a fluid flow model of the network on a SimPy environment.

Routed groups and the entities in flight (:mod:`.entity`); chip pairs routed into
groups, cached (:mod:`.routecache`), and folded steps of stages placed alike as
images of one another (:mod:`.images`); the groups on the links now (:mod:`.live`);
max-min rates (:mod:`.maxmin`, :mod:`.solve`, :mod:`.classes`); each chip's HBM as a
capacity (:mod:`.hbm`, :mod:`.flows_hbm`); counts shared where they are one value
(:mod:`.uniform`); link statistics (:mod:`.linkstats`,
:mod:`.linkload`); and the :class:`FlowNetwork` that runs them (:mod:`.flownetwork`,
:mod:`.solving`). Over :mod:`~clustersim.network.fabric`.
"""

from __future__ import annotations

from clustersim.network.flows.classes import (
    MAX_CLASSES,
    ClassCache,
    Classes,
    intersect,
    private_row,
)
from clustersim.network.flows.entity import (
    NO_CHIPS,
    Component,
    Entity,
    FlowGroup,
    HbmUse,
    LinkIds,
    Pairs,
    compact_links,
    link_counts,
)
from clustersim.network.flows.flownetwork import FlowNetwork
from clustersim.network.flows.flows_hbm import HbmFlows
from clustersim.network.flows.hbm import SLACK_RTOL, SharedHbm
from clustersim.network.flows.images import StageImages
from clustersim.network.flows.linkload import Column, LinkUtilisation, LoadPattern
from clustersim.network.flows.linkstats import LinkStats
from clustersim.network.flows.live import BLOCK, LiveGroups, Shared
from clustersim.network.flows.maxmin import (
    DEFAULT_RTOL,
    maxmin_rates,
    maxmin_rates_csc,
    maxmin_rates_reference,
    with_ceilings,
)
from clustersim.network.flows.routecache import RouteCache
from clustersim.network.flows.solve import Scratch, Solved, solve_groups, union
from clustersim.network.flows.solving import Solving
from clustersim.network.flows.uniform import UniformCounts

__all__ = [
    "BLOCK",
    "DEFAULT_RTOL",
    "MAX_CLASSES",
    "NO_CHIPS",
    "SLACK_RTOL",
    "ClassCache",
    "Classes",
    "Column",
    "Component",
    "Entity",
    "FlowGroup",
    "FlowNetwork",
    "HbmFlows",
    "HbmUse",
    "LinkIds",
    "LinkStats",
    "LinkUtilisation",
    "LiveGroups",
    "LoadPattern",
    "Pairs",
    "RouteCache",
    "Scratch",
    "Shared",
    "SharedHbm",
    "Solved",
    "Solving",
    "StageImages",
    "UniformCounts",
    "compact_links",
    "intersect",
    "link_counts",
    "maxmin_rates",
    "maxmin_rates_csc",
    "maxmin_rates_reference",
    "private_row",
    "solve_groups",
    "union",
    "with_ceilings",
]
