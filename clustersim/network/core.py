"""The :class:`Network`: collectives and sends between ranks, run as steps of flows.

It maps ranks to chips, turns a collective into the steps of its algorithm
(:mod:`.collectives`) and runs them one after another over a
:class:`~.flows.FlowNetwork`, which shares the links of a :class:`~.fabric.Topology`
among all transfers in flight. It is the top of the network's layers (see
:mod:`clustersim.network`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np
import simpy
from numpy.typing import ArrayLike, NDArray

from clustersim.errors import SimulationError
from clustersim.network.collectives import (
    OPS,
    GroupInfo,
    Step,
    algorithm,
    collective_step_arrays,
    group_info,
    resolve_algorithm,
)
from clustersim.network.fabric import Topology
from clustersim.network.flows import (
    NO_CHIPS,
    FlowGroup,
    FlowNetwork,
    StageImages,
    UniformCounts,
    compact_links,
)
from clustersim.network.folded import FoldedRoutes
from clustersim.network.runtimes import NO_COSTS, Protocol, Runtime

__all__ = ["NO_PROTOCOL", "Network"]

_Plan = tuple[tuple[FlowGroup, float, float], ...]
_Steps = list[tuple[Step, NDArray[np.int64], NDArray[np.bool_]]]
"""A collective's steps, each with its pairs (positions) and whether each crosses domains."""
_IntArray = NDArray[np.int64]
_SEND_PAIR: _IntArray = np.asarray([[0, 1]], dtype=np.int64)
_PAIR_INFO = GroupInfo.flat(2)
_SEND_STEP = Step(((0, 1),), 0.0)
NO_PROTOCOL = Protocol()


def _digest(array: NDArray[np.int64]) -> bytes:
    """A 16-byte digest of ``array``'s bytes, read in place (no copy)."""
    return hashlib.blake2b(np.ascontiguousarray(array).data, digest_size=16).digest()


class Network(FoldedRoutes):
    """Collectives and point-to-point sends between ranks, simulated as flows.

    ``rank_chip[r]`` is the chip of rank ``r``. ``algorithms`` maps a collective
    (``all_reduce``, ...) to an algorithm name; unset ops use ``auto``. Algorithms
    see each group's placement (shared chips, scale-up domains, torus coordinates)
    as a :class:`~.collectives.groups.GroupInfo` derived from the topology. ``runtime``
    (:mod:`.runtimes.costs`; default: no overheads) chooses what ``auto`` runs and with which
    protocol, and prices its fixed costs: a launch per collective, a handshake per
    round, a posting cost per message, each message's DMA bound and the protocol's
    wire overhead. ``hbm_Bps`` (each chip's sustained HBM bandwidth) makes HBM
    shared: flows read it at their source chip and write it at their destination,
    in the same max-min solve as the links (:meth:`FlowNetwork.share_hbm`), so
    collectives are capped by the HBM they get.
    """

    max_cached_plans: int = 16_384

    def __init__(
        self,
        env: simpy.Environment,
        topology: Topology,
        rank_chip: Sequence[int] | ArrayLike,
        algorithms: Mapping[str, str] | None = None,
        *,
        runtime: Runtime = NO_COSTS,
        path: str = "cluster.collectives",
        hbm_Bps: float | None = None,
    ) -> None:
        self.env = env
        self.runtime = runtime
        self.topology = topology
        # Each chip's HBM (hbm_Bps), shared by its flows and its compute.
        self.flows = FlowNetwork(env, topology, hbm_Bps=hbm_Bps)
        chips = np.asarray(rank_chip, dtype=np.int64).reshape(-1)
        bad = chips[(chips < 0) | (chips >= topology.n_chips)]
        if bad.size:
            raise SimulationError(
                f"rank_chip names chips outside 0..{topology.n_chips - 1}: {bad[:8].tolist()}"
            )
        chips.flags.writeable = False
        self._chips: _IntArray = chips
        self.algorithms: dict[str, str] = dict.fromkeys(OPS, "auto")
        for op, name in (algorithms or {}).items():
            algorithm(name, op, path=path)  # validates both names
            self.algorithms[op] = name
        self._steps: dict[tuple[str, str, float, GroupInfo], tuple[str, Protocol, _Steps]] = {}
        self._infos: dict[bytes, GroupInfo] = {}
        self._rank_infos: dict[tuple[int, ...], GroupInfo] = {}
        self._send_protocols: dict[float, Protocol] = {}
        # Keys hold id(replicas); values keep the array alive, so the id cannot be reused.
        self._plans: dict[tuple[str, tuple[int, ...], float, int], tuple[object, _Plan]] = {}
        self._plan_ids: dict[tuple[str, int, float, int], tuple[object, object, _Plan]] = {}
        """The plans by the ids of their rows of ranks and replicas (a row of 10^4 ranks
        costs a hash of its own at every lookup by value)."""
        self._folded: dict[tuple[int, bytes], tuple[object, FlowGroup]] = {}
        self._caps: dict[tuple[int, float], tuple[FlowGroup, FlowGroup]] = {}
        self._digests: dict[int, tuple[_IntArray, bytes]] = {}
        """The digest of each step's pairs (the steps are cached: the same arrays recur)."""
        self._distinct: dict[int, tuple[object, tuple[_IntArray, _IntArray] | None, bool | None]]
        self._distinct = {}
        """The distinct rows of chips of each replicas array (the steps of a collective
        share their replicas), and whether those rows (or all, if none repeats) hold no
        chip twice (None until asked)."""
        self._rows: dict[int, tuple[object, dict[int, object]]] = {}
        """The rows of ranks checked to lead each replicas array."""
        self._pairs_apart: dict[bytes, bool] = {}
        """Whether a step's pairs (by digest) are distinct."""
        self._pair_arrays: dict[bytes, _IntArray] = {}
        """Each distinct step's pairs, by their digest."""
        self._images = StageImages(topology)
        """Folded steps of stages placed alike, given as images of the first one routed."""
        self._plans_version = topology.version
        self._mark: NDArray[np.bool_] = np.zeros(0, dtype=bool)
        """False per link, but during :meth:`_on_links`."""
        self._far_masks: dict[tuple[int, bytes], NDArray[np.bool_]] = {}
        self._tier_latency: tuple[int, bool] | None = None
        """Whether a tree fabric's links of each kind have one latency (per topology version)."""
        self._uniform = UniformCounts()
        """The folded groups' counts, shared where they are one value on every link."""
        self.collectives_started = 0
        self.sends_started = 0

    @property
    def rank_chip(self) -> _IntArray:
        """The chip of each rank (a read-only array: a tuple of 4M ints costs 150 MB)."""
        return self._chips

    # -- counters ----------------------------------------------------------------------------

    @property
    def entities_done(self) -> int:
        return self.flows.entities_done

    @property
    def transfers_done(self) -> int:
        """Fluid transfers finished (one per collective step or send); same as ``entities_done``."""
        return self.flows.entities_done

    @property
    def solves(self) -> int:
        return self.flows.solves

    @property
    def transfers(self) -> int:
        return self.flows.transfers

    # -- operations --------------------------------------------------------------------------

    def collective(
        self,
        op: str,
        ranks: Iterable[int],
        nbytes: float,
        *,
        replicas: ArrayLike | None = None,
    ) -> simpy.Event:
        """Run ``op`` over ``ranks`` (in ring order) on an ``nbytes`` buffer; an event for its end.

        ``replicas`` (one group per row, ``ranks`` among them, all placed alike)
        are groups that run the same collective at the same moment: each step of
        ``ranks``' algorithm moves their flows too, as one coflow. A folded
        simulation passes them so the network carries every group's traffic.
        Routes are resolved now, so an unreachable member raises
        :class:`~clustersim.errors.PartitionError` at the call.
        """
        group = ranks if isinstance(ranks, tuple) else tuple(int(r) for r in ranks)
        plan = self._plan(op, group, float(nbytes), replicas)
        self.collectives_started += 1
        if not plan:
            done = self.env.event()
            done.succeed()
            return done
        if len(plan) == 1:
            return self.flows.transfer_group(*plan[0])
        return self.flows.transfer_chain(plan)

    def send(
        self, src_rank: int, dst_rank: int, nbytes: float, *, replicas: ArrayLike | None = None
    ) -> simpy.Event:
        """One flow of ``nbytes`` from ``src_rank`` to ``dst_rank``, after the route's latency.

        ``replicas`` (rows of ``(src, dst)`` ranks, this pair among them) are sends
        made at the same moment: they move together, as one coflow.
        """
        src, dst = self._chip(src_rank), self._chip(dst_rank)
        if replicas is None:
            group = self.flows.group(((src, dst),))
        else:
            group = self._replica_send_group(src_rank, dst_rank, replicas)
        self.sends_started += 1
        proto = self._send_protocols.get(nbytes)
        if proto is None:
            _, proto = self.runtime.choose("all_to_all", 2, float(nbytes), _PAIR_INFO, "pairwise")
            if len(self._send_protocols) < self.max_cached_plans:
                self._send_protocols[nbytes] = proto
        crosses = np.asarray([self.topology.chip_domain[src] != self.topology.chip_domain[dst]])
        latency_s = proto.step_latency_s(_SEND_STEP, _SEND_PAIR, crosses, group.latency_s)
        return self.flows.transfer_group(group, float(nbytes) * proto.wire_factor, latency_s)

    def algorithm_for(self, op: str, ranks: Iterable[int], nbytes: float) -> str:
        """The algorithm that runs ``op`` over ``ranks``: ``auto``'s choice, or a fallback."""
        return self.choice_for(op, ranks, nbytes)[0]

    def choice_for(self, op: str, ranks: Iterable[int], nbytes: float) -> tuple[str, Protocol]:
        """The algorithm and the runtime's protocol that run ``op`` over ``ranks``."""
        if op not in self.algorithms:
            raise SimulationError(f"unknown collective {op!r}; valid: {', '.join(OPS)}")
        group = tuple(ranks)
        return self._choice(op, len(group), float(nbytes), self.group_info(group))

    def _choice(self, op: str, p: int, nbytes: float, info: GroupInfo) -> tuple[str, Protocol]:
        name, proto = self.runtime.choose(op, p, nbytes, info, self.algorithms[op])
        return resolve_algorithm(name, op, p, nbytes, info), proto

    def group_info(self, ranks: Sequence[int]) -> GroupInfo:
        """The placement of ``ranks`` as algorithms see it."""
        if len(self._infos) >= self.max_cached_plans:
            self._infos.clear()
        return group_info(self.topology, self._chips_of(ranks), self._infos)

    # -- internals ---------------------------------------------------------------------------

    def _chip(self, rank: int) -> int:
        if not 0 <= rank < self._chips.size:
            raise SimulationError(f"rank {rank} is outside 0..{self._chips.size - 1}")
        return int(self._chips[rank])

    def _chips_of(self, ranks: Sequence[int]) -> _IntArray:
        """The chip of each of ``ranks``, as an array."""
        arr = np.asarray(ranks, dtype=np.int64).reshape(-1)
        n = self._chips.size
        bad = (arr < 0) | (arr >= n)
        if bad.any():
            raise SimulationError(f"rank {arr[np.argmax(bad)]} is outside 0..{n - 1}")
        chips: _IntArray = self._chips[arr]
        return chips

    def _replica_send_group(self, src: int, dst: int, replicas: ArrayLike) -> FlowGroup:
        self._check_version()
        return self._folded_group(replicas, (src, dst), _SEND_PAIR, "send replicas")

    def _check_version(self) -> None:
        if self._plans_version != self.topology.version:
            self._plans.clear()
            self._plan_ids.clear()
            self._folded.clear()
            self._caps.clear()
            self._images.clear()
            self._distinct.clear()
            self._rows.clear()
            self._plans_version = self.topology.version

    def _plan(
        self, op: str, ranks: tuple[int, ...], nbytes: float, replicas: ArrayLike | None
    ) -> _Plan:
        self._check_version()
        by_id = (op, id(ranks), nbytes, id(replicas))
        seen = self._plan_ids.get(by_id)
        if seen is not None and seen[0] is ranks and seen[1] is replicas:
            return seen[2]
        if len(self._plans) >= self.max_cached_plans:
            self._plans.clear()
        if len(self._plan_ids) >= self.max_cached_plans:
            self._plan_ids.clear()
        key = (op, ranks, nbytes, id(replicas))
        found = self._plans.get(key)
        if found is not None and found[0] is replicas:
            self._plan_ids[by_id] = (ranks, replicas, found[1])  # holds both: no id reuse
            return found[1]
        name = self.algorithms.get(op)
        if name is None:
            raise SimulationError(f"unknown collective {op!r}; valid: {', '.join(OPS)}")
        if not ranks:
            raise SimulationError(f"{op} over an empty group")
        if not (nbytes >= 0 and math.isfinite(nbytes)):
            raise SimulationError(f"{op}: nbytes must be finite and >= 0 (got {nbytes})")
        proto, steps = self._steps_of(op, ranks, nbytes)
        chips = self._chips_of(ranks) if replicas is None else NO_CHIPS
        out = []
        for step, pairs, crosses in steps:
            if replicas is not None:
                group = self._folded_group(replicas, ranks, pairs, f"{op} replicas")
            else:
                group = self.flows.group(np.stack([chips[pairs[:, 0]], chips[pairs[:, 1]]], 1))
            k = step.repeats
            bound = proto.message_cap_Bps(pipelined=step.pipelined, reduces=step.reduces)
            if proto.switch_Bps < math.inf and not crosses.all():
                inside = int(np.bincount(pairs[~crosses, 0]).max())
                bound = min(bound, proto.switch_cap_Bps(inside))
            if bound < group.rate_cap_Bps:
                group = self._capped(group, bound)
            latency_s = proto.step_latency_s(step, pairs, crosses, group.latency_s)
            out.append((group, k * step.bytes_per_flow * proto.wire_factor, latency_s))
        if out and proto.launch_s:
            group, nbytes_first, latency_s = out[0]
            out[0] = (group, nbytes_first, latency_s + proto.launch_s)
        plan = tuple(out)
        self._plans[key] = (replicas, plan)
        self._plan_ids[by_id] = (ranks, replicas, plan)  # holds both: their ids are not reused
        return plan

    def _capped(self, group: FlowGroup, bound: float) -> FlowGroup:
        """``group`` with the rate cap ``bound``, one object per group and cap (cached).

        Collectives over one group that differ only in size (a stage's gradient
        buckets) then run each step on one group: the solve memo, the groups in
        flight, the HBM variants and the link statistics know it once, not once per
        bucket (a folded step on a switched fabric crosses 10^5 links).
        """
        key = (id(group), bound)
        found = self._caps.get(key)
        if found is not None and found[0] is group:
            return found[1]
        if len(self._caps) >= self.max_cached_plans:
            self._caps.clear()
        capped = replace(group, rate_cap_Bps=bound)
        self._caps[key] = (group, capped)
        return capped

    def _folded_group(
        self, replicas: ArrayLike, ranks: Sequence[int], pairs: _IntArray, what: str
    ) -> FlowGroup:
        """One step (``pairs`` of positions in a row) of every row of ``replicas``, rows of
        ranks that start with ``ranks``, as one entity with every replica's load (cached).

        Every flow of every replica moves at one rate, and the loads of all of them
        are counted on every link they cross, so each max-min constraint is exact:
        the entity's rate is that of the slowest replica in a detailed run, the one
        whose links are the most loaded (max-min fair rates maximise the smallest
        rate, and giving every flow that rate is feasible exactly when it fits the
        tightest link).

        Only flows that can reach links other replicas share are routed. A route
        between two chips of one scale-up domain stays inside it while every link
        is up, and the domains are placed alike, so such flows count only in the
        domains of the first replica's chips; their links elsewhere carry the same
        loads. Flows between domains are routed in bulk by the scale-out fabric.
        On a :attr:`private <clustersim.network.fabric.scaleout.ScaleOut.private>` fabric
        (the ``nonblocking`` one) they meet on no shared link, every chip's links
        carry the same load, and the entity keeps only the first replica's links;
        on switched fabrics (``fat_tree``, ``rail``) it keeps every switch-to-switch
        link any flow crosses, since ECMP does not load images alike, and the
        first replica's domains' links to their leaves (a chip's own link carries
        what its images' do).
        """
        known = self._digests.get(id(pairs))
        if known is None or known[0] is not pairs:
            if len(self._digests) >= self.max_cached_plans:
                self._digests.clear()
            known = (pairs, _digest(pairs))
            self._digests[id(pairs)] = known  # holds the array: its id is not reused
        key = (id(replicas), known[1])
        found = self._folded.get(key)
        if found is not None and found[0] is replicas:
            return found[1]
        topo = self.topology
        rows = self._replica_rows(replicas, ranks, what)
        rank_chip = self._chips

        def every_pair() -> _IntArray:
            rows = rank_chip[np.asarray(replicas, dtype=np.int64)]
            return np.stack([rows[:, pairs[:, 0]].ravel(), rows[:, pairs[:, 1]].ravel()], axis=1)

        hbm, images = self.flows.hbm, self._images
        images.hbm = None if hbm is None else (hbm.base, hbm.capacity)
        image = images.image(
            replicas, rows, known[1], lambda r: self._rows_chips(r, len(ranks), what), every_pair
        )
        if image is not None:
            return self._keep_folded(key, replicas, image)
        rep_src, rep_dst = rows[0, pairs[:, 0]], rows[0, pairs[:, 1]]
        src, dst = rows.take(pairs[:, 0], axis=1).ravel(), rows.take(pairs[:, 1], axis=1).ravel()
        flat, weights, latency_s, union = self._reaching(
            src, dst, rep_src, rep_dst, lambda: self._repeats(replicas, rows, pairs, known[1])
        )
        if union:
            # Every entry's link, counted through a position per link: only the distinct
            # links are sorted, not every entry (the same sums, in the same order).
            links, counts = self._on_links(flat, flat, weights)
        else:
            # Every flow's load on each of the first replica's links; other links are dropped.
            links, counts = self._on_links(topo.weighted_routes(rep_src, rep_dst)[0], flat, weights)
        used = counts > 0
        # HBM: every replica's flows that start or end on the first replica's chips.
        links, loads = links[used], counts[used]
        on_links = loads.size
        chips = NO_CHIPS
        if hbm is not None:
            # The HBM of the group's first rank's chip (both ends' of a send), with every
            # replica's flows that start or end there: by symmetry every chip's HBM is
            # loaded alike, and that chip is the one whose compute is simulated.
            head = np.unique(rows[0, : 2 if len(ranks) <= 2 else 1])
            links, loads = hbm.add(links, loads, src, dst, head)
            chips = hbm.chips_of(links)
        loads = self._uniform.share(loads, loads.size - on_links)
        group = FlowGroup(
            compact_links(links), loads, int(src.size), latency_s, every_pair, hbm_chips=chips
        )
        if not union:
            images.remember(replicas, rows, known[1], group)
        return self._keep_folded(key, replicas, group)

    def _keep_folded(
        self, key: tuple[int, bytes], replicas: ArrayLike, group: FlowGroup
    ) -> FlowGroup:
        if len(self._folded) >= self.max_cached_plans:
            self._folded.clear()
        self._folded[key] = (replicas, group)
        return group

    def _interned(self, pairs: _IntArray) -> _IntArray:
        """``pairs``, or the equal array of a step seen before: the steps of a collective for
        every buffer size (a stage's gradient buckets) hold one copy of their pairs, and
        each is digested once (:meth:`_folded_group`)."""
        digest = _digest(pairs)
        found = self._pair_arrays.get(digest)
        if found is None or not np.array_equal(found, pairs):
            if len(self._pair_arrays) >= self.max_cached_plans:
                self._pair_arrays.clear()
            found = self._pair_arrays[digest] = pairs
        if len(self._digests) >= self.max_cached_plans:
            self._digests.clear()
        self._digests[id(found)] = (found, digest)  # holds the array: its id is not reused
        return found

    def _steps_of(self, op: str, ranks: tuple[int, ...], nbytes: float) -> tuple[Protocol, _Steps]:
        """The runtime's protocol and the algorithm's steps for this group, each step with
        its pairs as an array and whether each pair crosses domains (cached)."""
        p = len(ranks)
        if p == 1:
            return NO_PROTOCOL, []
        info = self._rank_infos.get(ranks)
        if info is None:
            info = self.group_info(ranks)
            if len(self._rank_infos) >= self.max_cached_plans:
                self._rank_infos.clear()
            self._rank_infos[ranks] = info
        # Groups placed alike have equal infos (relabelled ids): they share steps.
        key = (self.algorithms[op], op, nbytes, info)
        found = self._steps.get(key)
        if found is None:
            resolved, proto = self._choice(op, p, nbytes, info)
            # The pairs are kept as an array only: as tuples of Python ints, the
            # steps of a group of 10^4 ranks would hold hundreds of MB.
            domain = np.asarray(info.domain, dtype=np.int64)
            steps: _Steps = []
            for step, made in collective_step_arrays(op, p, nbytes, resolved, info):
                pairs = self._interned(made)
                steps.append((step, pairs, domain[pairs[:, 0]] != domain[pairs[:, 1]]))
            found = (resolved, proto, steps)
            if len(self._steps) < self.max_cached_plans:
                self._steps[key] = found
        return found[1], found[2]
