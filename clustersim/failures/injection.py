"""Failure injection inside a step simulation: ``failures.inject`` applied at its times.

:func:`resolve` checks every injection against the topology and turns it into an
:class:`Action` on concrete links or chips; an :class:`Injector` (a SimPy process)
applies the actions at their simulated times:

- **lane down / up**: one lane of the cable between two nodes (both directions)
  fails or comes back; the link's capacity becomes ``lanes_up / lanes`` of its
  nominal at once, for the flows in flight too. Losing the last lane is a link
  failure (below).
- **link down** (also a switch's or a NIC's links): the link carries nothing from
  the failure on, but routing notices only ``failures.link_detect_delay`` later.
  Until then routes still cross it and the flows on it stall (capacity factor 0,
  see :meth:`~clustersim.network.fabric.links.LinkTable.set_capacity_factor`); at
  detection the link goes down, routes are recomputed and the stalled flows move
  to the links still up with the bytes they have left. A flow with no route left
  ends the run with a :class:`~clustersim.errors.PartitionError` naming the cut pair.
- **up** restores a link (all lanes, no degradation) at once: there is no delay
  for a link coming back.
- **degrade: f** sets a link's bandwidth to ``f`` times its healthy value (not
  cumulative: a second degrade replaces the first; ``up`` restores 1).
- **straggle: f** makes a chip's compute (every op of its ranks) ``f`` times slower
  from that time on; ``up`` ends it. Straggle times are known up front, so a
  compute run that straddles one is stretched exactly (:class:`Slowdown`).
- **chip or instance down** fails the step: the injector raises
  :class:`StepFailure`, which ends the simulation at that instant.

**Folding.** A folded run simulates one replica for all, so an injection that
touches one replica only (a lane, a link, a switch, a NIC, a straggler) cannot be
represented in it. Such injections make ``fidelity: auto`` simulate every rank,
and a forced ``folded`` is refused (:func:`fold_with`). A chip or instance going
down is allowed in both: it ends the step at its time whichever replica it hits.
"""

from __future__ import annotations

import bisect
import difflib
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import simpy
from numpy.typing import NDArray

from clustersim.errors import ScenarioError, SimulationError
from clustersim.network.fabric import Topology, node_name
from clustersim.network.graphs import GraphTopology
from clustersim.scenario.failures import Degrade, Injection, Straggle

__all__ = [
    "Action",
    "Injector",
    "Slowdown",
    "StepFailure",
    "Target",
    "breaks_symmetry",
    "fold_with",
    "resolve",
]

Ints = NDArray[np.int64]
What = Literal["down", "up", "degrade", "straggle"]

_VALID: dict[str, tuple[What, ...]] = {
    "link": ("down", "up", "degrade"),
    "lane": ("down", "up"),
    "chip": ("down", "up", "straggle"),
    "instance": ("down", "up", "straggle"),
    "switch": ("down", "up", "degrade"),
    "nic": ("down", "up", "degrade"),
}


class StepFailure(Exception):  # noqa: N818  (an outcome of the run, not an error)
    """A chip or an instance went down: the step cannot finish.

    Not an error of the simulator: :func:`~clustersim.sim.simulate` catches it and
    records the failed step in the summary.
    """

    def __init__(self, at_s: float, cause: str, index: int) -> None:
        # SimPy re-raises a failed process's exception as type(exc)(*exc.args).
        super().__init__(at_s, cause, index)
        self.at_s = at_s
        self.cause = cause
        self.index = index

    def __str__(self) -> str:
        return f"step failed at {self.at_s:.6g} s: {self.cause} (failures.inject.{self.index})"


@dataclass(frozen=True)
class Target:
    """A resolved target: its kind, a readable name, and the links or chips it covers.

    ``links`` holds both directions of every cable the target covers.
    """

    kind: str
    name: str
    links: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    chips: tuple[int, ...] = ()


@dataclass(frozen=True)
class Action:
    """One injection, checked: ``what`` happens to ``target`` at ``at_s``."""

    index: int
    at_s: float
    what: What
    factor: float
    target: Target


def _what(inj: Injection) -> tuple[What, float]:
    kind = inj.kind
    if isinstance(kind, Degrade):
        return "degrade", kind.degrade
    if isinstance(kind, Straggle):
        return "straggle", kind.straggle
    return kind, 1.0


def breaks_symmetry(inj: Injection) -> bool:
    """Whether ``inj`` affects one replica only (everything but a chip or instance down)."""
    return not (inj.kind == "down" and inj.target.kind in ("chip", "instance"))


def fold_with(
    inject: Sequence[Injection], folded: bool, fidelity: str, *, path: str = "failures.inject"
) -> bool:
    """Whether to fold, given the injections: ``folded`` is the choice without them.

    ``auto`` simulates every rank when an injection breaks the symmetry folding
    relies on; a forced ``folded`` with one is a :class:`ScenarioError`.
    """
    breaking = [i for i, inj in enumerate(inject) if breaks_symmetry(inj)]
    if not folded or not breaking:
        return folded
    if fidelity == "folded":
        i = breaking[0]
        raise ScenarioError(
            "--fidelity",
            fidelity,
            f"a folded run simulates one replica for all, and {path}.{i} "
            f"({inject[i].target.kind} {_what(inject[i])[0]}) affects one replica only; "
            "use --fidelity detailed (auto chooses it)",
        )
    return False


# -- resolution ---------------------------------------------------------------------------------


class _Names:
    """Topology nodes by name (``chip3``, ``switch0``, ``leaf2``, ``spine2_5``, ``efa``)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._ids: dict[str, int] | None = None

    @property
    def ids(self) -> dict[str, int]:
        if self._ids is None:
            self._ids = {node_name(self.topo.node(i)): i for i in range(self.topo.n_nodes)}
            if isinstance(self.topo, GraphTopology):  # the graph's own names, too
                self._ids.update(self.topo.aliases)
        return self._ids

    def switches(self) -> list[str]:
        return [name for name, i in self.ids.items() if i >= self.topo.n_chips]

    def node(self, ref: int | str, where: str) -> int:
        topo = self.topo
        filled = topo.filled_chips  # a partly filled last domain's empty slots are no chips
        if isinstance(ref, int):
            if not 0 <= ref < filled:
                raise ScenarioError(where, ref, f"no chip {ref}; chips are 0..{filled - 1}")
            return ref
        found = self.ids.get(ref)
        if found is None:
            raise ScenarioError(where, ref, f"no node named {ref!r}; {self._hint(ref)}")
        if filled <= found < topo.n_chips:
            raise ScenarioError(where, ref, f"an empty slot; chips are 0..{filled - 1}")
        return found

    def _hint(self, ref: str) -> str:
        switches = self.switches()
        close = difflib.get_close_matches(ref, switches, n=1)  # not over every chip's name
        shown = ", ".join(switches[:8]) + (", ..." if len(switches) > 8 else "")
        valid = f"switches: {shown}" if switches else "this topology has no switches"
        return (f"did you mean {close[0]!r}? " if close else "") + (
            f"chips are 0..{self.topo.filled_chips - 1} or chipN, {valid}"
        )


def _cable(topo: Topology, names: _Names, pair: tuple[int | str, int | str], where: str) -> Target:
    """Both directions of the cable between two nodes."""
    u = names.node(pair[0], f"{where}.0")
    v = names.node(pair[1], f"{where}.1")
    nu, nv = node_name(topo.node(u)), node_name(topo.node(v))
    try:
        if u == v:
            raise SimulationError("a node is not linked to itself")
        links = [topo.link(topo.node(u), topo.node(v)), topo.link(topo.node(v), topo.node(u))]
    except SimulationError:
        ids = sorted(set(topo.link_v[topo.link_u == u].tolist()) - {u})
        nbrs = [node_name(topo.node(w)) for w in ids]
        shown = ", ".join(nbrs[:8]) + (", ..." if len(nbrs) > 8 else "")
        raise ScenarioError(
            where, list(pair), f"{nu} and {nv} are not linked; {nu}'s neighbours: {shown or 'none'}"
        ) from None
    return Target("", f"{nu}<->{nv}", np.asarray(links, dtype=np.int64))


def _node_links(topo: Topology, node: int) -> Ints:
    u, v = topo.link_u, topo.link_v
    out: Ints = np.flatnonzero(((u == node) | (v == node)) & (u != v)).astype(np.int64)
    return out


def _target(topo: Topology, names: _Names, inj: Injection, where: str) -> Target:
    t = inj.target
    kind = t.kind
    at = f"{where}.{kind}"
    if t.link is not None or t.lane is not None:
        pair = t.link if t.link is not None else t.lane
        assert pair is not None
        cable = _cable(topo, names, pair, at)
        return Target(kind, cable.name, cable.links)
    if t.chip is not None:
        chip = names.node(t.chip, at)
        return Target(kind, f"chip{chip}", chips=(chip,))
    instances = topo.filled_chips // topo.chips_per_instance
    if t.instance is not None:
        if t.instance >= instances:
            raise ScenarioError(
                at, t.instance, f"no instance {t.instance}; instances are 0..{instances - 1}"
            )
        cpi = topo.chips_per_instance
        chips = tuple(range(t.instance * cpi, (t.instance + 1) * cpi))
        return Target(kind, f"instance{t.instance}", chips=chips)
    if t.switch is not None:
        node = names.node(t.switch, at)
        if node < topo.n_chips:
            raise ScenarioError(at, t.switch, "names a chip, not a switch; use target.chip")
        return Target(kind, t.switch, _node_links(topo, node))
    assert t.nic is not None
    if t.nic >= instances:
        last = instances - 1
        raise ScenarioError(at, t.nic, f"no instance {t.nic}; instances are 0..{last}")
    cpi = topo.chips_per_instance
    lo, hi = t.nic * cpi, (t.nic + 1) * cpi
    u, v = topo.link_u, topo.link_v
    mine = ((u >= lo) & (u < hi)) | ((v >= lo) & (v < hi))
    links = np.flatnonzero(mine & (topo.kinds == "efa")).astype(np.int64)
    if not links.size:
        raise ScenarioError(
            at, t.nic, "this cluster has no EFA links (one scale-up domain): no NIC to fail"
        )
    return Target(kind, f"nic{t.nic}", links)


def resolve(
    inject: Sequence[Injection], topology: Topology, *, path: str = "failures.inject"
) -> list[Action]:
    """Check each injection against ``topology``; return the actions in the order given.

    A target that does not exist (a chip index out of range, two nodes that are
    not linked, an unknown switch) or a kind that does not apply to it is a
    :class:`ScenarioError` naming ``failures.inject.N.target...`` or ``...kind``.
    """
    names = _Names(topology)
    out = []
    for i, inj in enumerate(inject):
        where = f"{path}.{i}"
        target = _target(topology, names, inj, f"{where}.target")
        what, factor = _what(inj)
        if what not in _VALID[target.kind]:
            raise ScenarioError(
                f"{where}.kind",
                what,
                f"does not apply to a {target.kind}; valid: {', '.join(_VALID[target.kind])}",
            )
        out.append(Action(i, float(inj.at), what, factor, target))
    return out


# -- straggling ---------------------------------------------------------------------------------


class Slowdown:
    """A chip's compute slowdown over time: factor ``factors[k]`` from ``times[k]`` on.

    Called as ``slowdown(t0, work_s)``, it returns how long ``work_s`` seconds of
    healthy compute take when started at ``t0``: work advances at ``1 / factor``
    per second, integrated over the pieces.
    """

    def __init__(self, times: Sequence[float], factors: Sequence[float]) -> None:
        self.times = [0.0, *times]
        self.factors = [1.0, *factors]

    def __call__(self, t0: float, work_s: float) -> float:
        times, factors = self.times, self.factors
        k = bisect.bisect_right(times, t0) - 1
        t, left = t0, work_s
        while True:
            f = factors[k]
            nxt = times[k + 1] if k + 1 < len(times) else math.inf
            room = (nxt - t) / f
            if left <= room:
                return t + left * f - t0
            left -= room
            t = nxt
            k += 1


def slowdowns(actions: Sequence[Action]) -> dict[int, Slowdown]:
    """Each straggling chip's :class:`Slowdown`, from the straggle and ``up`` actions."""
    changes: dict[int, list[tuple[float, int, float]]] = {}
    for act in actions:
        if act.target.kind not in ("chip", "instance") or act.what == "down":
            continue
        factor = act.factor if act.what == "straggle" else 1.0
        for chip in act.target.chips:
            changes.setdefault(chip, []).append((act.at_s, act.index, factor))
    out = {}
    for chip, seq in changes.items():
        seq.sort()
        if all(f == 1.0 for _, _, f in seq):
            continue
        out[chip] = Slowdown([t for t, _, _ in seq], [f for _, _, f in seq])
    return out


# -- the injector -------------------------------------------------------------------------------


class Injector:
    """Applies resolved actions to a topology at their times, as a SimPy process.

    ``records`` has one dict per action (for ``summary.json`` and the trace):
    what was asked, and when it took effect (``applied_s``; ``None`` if the run
    ended first) and, for a link failure, when routing noticed (``detected_s``).
    """

    def __init__(
        self,
        env: simpy.Environment,
        topology: Topology,
        actions: Sequence[Action],
        *,
        detect_delay_s: float,
    ) -> None:
        self.env = env
        self.topology = topology
        self.actions = sorted(actions, key=lambda a: (a.at_s, a.index))
        self.detect_delay_s = float(detect_delay_s)
        self.slowdown = slowdowns(self.actions)
        self.records: list[dict[str, Any]] = [
            {
                "index": a.index,
                "at_s": a.at_s,
                "target": a.target.kind,
                "name": a.target.name,
                "kind": a.what,
                "factor": a.factor if a.what in ("degrade", "straggle") else None,
                "applied_s": None,
                "detected_s": None,
                "effect": "",
            }
            for a in sorted(actions, key=lambda a: a.index)
        ]
        self._by_index = {r["index"]: r for r in self.records}
        self._lanes: dict[int, int] = {}  # lanes physically up, where it differs from the table
        self._degrade: dict[int, float] = {}
        self._pending: dict[int, int] = {}  # link -> generation of its pending detection
        self._generation = 0
        self.process: simpy.Process | None = None

    def start(self) -> simpy.Process:
        self.process = self.env.process(self._run())
        return self.process

    def _run(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        for act in self.actions:
            if act.at_s > env.now:
                yield env.timeout(act.at_s - env.now)
            self.apply(act)

    # -- effects --------------------------------------------------------------------------------

    def apply(self, act: Action) -> None:
        """Apply ``act`` now (raises :class:`StepFailure` for a chip or instance down)."""
        rec = self._by_index[act.index]
        rec["applied_s"] = float(self.env.now)
        kind = act.target.kind
        if kind in ("chip", "instance"):
            if act.what == "down":
                rec["effect"] = "step failed"
                raise StepFailure(float(self.env.now), f"{act.target.name} down", act.index)
            straggle = act.what == "straggle"
            rec["effect"] = f"compute x{act.factor:g} from now" if straggle else "compute restored"
            return
        links = act.target.links.tolist()
        if act.what == "degrade":
            for link in links:
                self._degrade[link] = act.factor
            live = [link for link in links if self.physical_lanes(link) > 0]
            if live:
                self.topology.set_capacity_factor(live, act.factor)
            rec["effect"] = f"bandwidth x{act.factor:g}"
            return
        if act.what == "up":
            for link in links:
                self._degrade.pop(link, None)
                self._set_lanes(link, self.topology.lanes(link))
            rec["effect"] = "restored"
            return
        # down: one lane of a lane target; every lane of the rest
        failed = []
        for link in links:
            before = self.physical_lanes(link)
            after = max(before - 1, 0) if kind == "lane" else 0
            if before > 0 and after == 0:
                failed.append(link)
            self._set_lanes(link, after)
        if failed:
            self._schedule_detection(failed, rec)
            what = "last lane lost, link down" if kind == "lane" else f"{len(failed)} links down"
            rec["effect"] = f"{what}; routes change when detected"
        elif kind == "lane":
            link = links[0]
            lanes = self.topology.lanes(link)
            rec["effect"] = f"{self.physical_lanes(link)} of {lanes} lanes up"
        else:
            rec["effect"] = "already down"

    def physical_lanes(self, link: int) -> int:
        """Lanes of ``link`` that work now (the table lags behind while a failure is undetected)."""
        return self._lanes.get(link, self.topology.lanes_up(link))

    def _set_lanes(self, link: int, lanes: int) -> None:
        topo = self.topology
        if lanes == 0:
            if self.physical_lanes(link) > 0:
                # Failed: carries nothing from now on, but routes cross it until detection.
                self._lanes[link] = 0
                topo.set_capacity_factor(link, 0.0)
            return
        self._pending.pop(link, None)  # a pending detection of an earlier failure is moot
        self._lanes.pop(link, None)
        factor = self._degrade.get(link, 1.0)
        if topo.capacity_factor(link) != factor:
            topo.set_capacity_factor(link, factor)
        if topo.lanes_up(link) != lanes:
            topo.set_lanes_up(link, lanes)

    def _schedule_detection(self, links: list[int], rec: dict[str, Any]) -> None:
        self._generation += 1
        gen = self._generation
        for link in links:
            self._pending[link] = gen
        self.env.timeout(self.detect_delay_s).callbacks.append(
            lambda _ev: self._detect(links, gen, rec)
        )

    def _detect(self, links: list[int], gen: int, rec: dict[str, Any]) -> None:
        topo = self.topology
        noticed = [link for link in links if self._pending.get(link) == gen]
        for link in noticed:
            del self._pending[link]
            topo.set_lanes_up(link, 0)  # routes recomputed; flows on it move (or partition)
            topo.set_capacity_factor(link, self._degrade.get(link, 1.0))
            del self._lanes[link]
        if noticed and rec["detected_s"] is None:
            now = float(self.env.now)
            rec["detected_s"] = now
            what = str(rec["effect"]).split(";", 1)[0]
            rec["effect"] = f"{what}; detected, rerouted at {now * 1e3:.6g} ms"
