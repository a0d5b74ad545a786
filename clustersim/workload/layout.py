"""The parallel layout: how ranks map to (tp, cp, dp, pp) coordinates.

Whether a model can be cut as a layout says is checked in :mod:`.checks`.

Ranks are numbered in Megatron order: the TP index varies fastest, then CP,
then DP, then the pipeline stage. A TP group is therefore a run of consecutive
ranks, which lands on one chip or on neighbouring chips (ranks are placed on
chips in order, ``ranks_per_chip`` at a time), so the most frequent and
latency-critical collectives stay on the fastest links.

Expert parallelism is carved out of DP x CP, as in Megatron-Core: the MoE layers
renumber a stage's ``tp*cp*dp`` ranks as (etp fastest, then ep, then edp), so an
EP group is ``ep`` ranks ``etp`` apart, an expert-TP group ``etp`` consecutive
ranks, and the expert-data-parallel group (which reduces the experts' gradients)
the ``tp*cp*dp / (etp*ep)`` ranks ``etp*ep`` apart. With ``etp = tp`` (the
default) an EP group is ``ep`` consecutive (cp, dp) indices. An EP group is
``ep*etp`` consecutive ranks; when it spans several nodes (instances of
``ranks_per_node`` ranks), the hierarchical dispatcher splits it into the members
of one node (``ep_node``) and the members at the same place in every node
(``ep_cross``).

Sharded data parallelism (ZeRO-2 and 3) shards over ``dp_shard`` consecutive DP
indices and, under context parallelism, every CP index with them: the ``dp_shard``
group is the ``cp * dp_shard`` ranks ``tp`` apart that share a TP index, a stage and
a replica (torchtitan's ``dp_shard_cp`` mesh; the CP ranks hold the same weights, so
their gradients are reduced together), nearest in rank order, so on the scale-up
fabric first. The ``dp / dp_shard`` groups of equal place in them (``dp_replicate``)
hold the same shards and all-reduce them (hybrid sharding, HSDP).

Hybrid sharding of an MoE model, as torchtitan runs FSDP2 with expert parallelism:
a replica is the ``tp*cp*dp_shard`` consecutive ranks of one shard index block,
and its EP groups must lie inside it (``ep*etp`` divides ``tp*cp*dp_shard``). The
routed experts are then sharded over the ``edp_shard`` group: the ranks of one
replica that hold the same experts, ``tp*cp*dp_shard / (etp*ep)`` of them
``etp*ep`` apart (torchtitan's ``dp_shard*cp/ep`` with ``etp = tp``). The ranks
that hold the same expert shard in the other replicas are the ``dp_replicate``
group of the dense parameters (same place in each replica), so both kinds of
gradient shard are all-reduced over it. Without replicas ``edp_shard`` is ``edp``.

Context parallelism splits each sequence over ``cp`` ranks that hold the same
weights, so their gradients are reduced together with DP's: with ``cp > 1`` the
dense gradients are reduced, and ZeRO-1's optimizer state sharded, over the
``dp_cp`` group (the ``dp * cp`` ranks ``tp`` apart that share a TP index and a
stage), as Megatron-Core does (its data-parallel group "with CP"); ZeRO-2 and 3's
``dp_shard`` group takes the CP ranks in too (above).
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.errors import ScenarioError
from clustersim.scenario.models import ParallelismCfg

__all__ = ["EXPERT_GROUPS", "GROUP_NAMES", "Layout", "divisors", "make_layout"]

GROUP_NAMES: tuple[str, ...] = (
    "tp",
    "cp",
    "dp",
    "pp",
    "ep",
    "dp_shard",
    "dp_replicate",
    "etp",
    "edp",
    "edp_shard",
    "ep_node",
    "ep_cross",
    "dp_cp",
)

EXPERT_GROUPS = ("ep", "etp", "edp", "edp_shard", "ep_node", "ep_cross")
"""The groups in the MoE numbering of a stage's ranks (etp fastest, then ep, then edp)."""


@dataclass(frozen=True)
class Layout:
    """Sizes of each parallel dimension and the rank numbering."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    ranks: int
    ranks_per_chip: int
    vp: int = 1
    """Model chunks per pipeline stage (``parallelism.virtual_stages``)."""
    dp_shard: int = 0
    """DP ranks that share one copy of the sharded state; 0 means all of ``dp``."""

    @property
    def shard(self) -> int:
        """DP ranks of one shard group (``parallelism.dp_shard``, default ``dp``)."""
        return self.dp_shard or self.dp

    @property
    def shard_size(self) -> int:
        """Ranks of the ``dp_shard`` group: ``dp_shard x cp`` (see the module doc)."""
        return self.shard * self.cp

    def span(self, name: str) -> tuple[int, int]:
        """(rank stride between neighbours, size) of the groups along ``name``."""
        return self._stride_size(name)

    def grad_group(self, zero: int) -> str:
        """The group that reduces the dense gradients (and shards ZeRO-1's state)."""
        if zero >= 2:
            return "dp_shard"
        return "dp_cp" if self.cp > 1 and self.shard == self.dp else "dp"

    def grad_size(self, zero: int) -> int:
        """The size of :meth:`grad_group`."""
        return self._stride_size(self.grad_group(zero))[1]

    def optimizer_shard(self, zero: int) -> int:
        """Ranks that share one copy of the dense optimizer state (1 without ZeRO)."""
        return self.grad_size(zero) if zero >= 1 else 1

    @property
    def replicas(self) -> int:
        """Size of the ``dp_replicate`` group: ``dp / dp_shard``."""
        return self.dp // self.shard

    etp: int = 0
    """Expert tensor parallelism (``parallelism.etp``); 0 means the same as ``tp``."""
    ranks_per_node: int = 0
    """Ranks of one instance (a node of the scale-out network); 0 means unknown."""
    vshape: bool = False
    """Chunks placed in a V (DualPipeV): stage s holds chunks s and 2 pp - 1 - s."""

    @property
    def ep_local(self) -> int:
        """Members of an EP group in one node: ``ep`` unless the group spans nodes whole.

        The group's ``ep*etp`` consecutive ranks span ``ep*etp / ranks_per_node`` nodes
        when that divides evenly (and an expert-TP group stays in one node).
        """
        span, node = self.ep * self.etp, self.ranks_per_node
        if node <= 0 or span <= node or node % self.etp or span % node:
            return self.ep
        return node // self.etp

    @property
    def ep_nodes(self) -> int:
        """Nodes an EP group spans (1 when it is inside one, or nodes are unknown)."""
        return self.ep // self.ep_local

    @property
    def chunks(self) -> int:
        """Model chunks in all: ``pp x vp``; chunk ``c`` runs on stage ``c % pp`` (in a V:
        ``c`` for ``c < pp``, else ``2 pp - 1 - c``)."""
        return self.pp * self.vp

    def global_chunk(self, stage: int, chunk: int) -> int:
        """The model chunk that ``stage`` runs as its local chunk ``chunk``."""
        if self.vshape:
            return stage if chunk == 0 else 2 * self.pp - 1 - stage
        return chunk * self.pp + stage

    def __post_init__(self) -> None:
        # Internal consistency only: user input is checked by ``make_layout``.
        if self.etp == 0:
            object.__setattr__(self, "etp", self.tp)  # frozen: filled once, here
        if self.tp * self.pp * self.dp * self.cp != self.ranks:
            raise ValueError(f"tp*pp*dp*cp != ranks in {self}")
        if min(self.tp, self.pp, self.dp, self.cp, self.ep, self.etp, self.ranks_per_chip) < 1:
            raise ValueError(f"every size must be >= 1 in {self}")
        if self.dp_shard < 0 or self.dp % self.shard:
            raise ValueError(f"dp_shard must divide dp in {self}")
        if self.ranks_per_stage % (self.ep * self.etp):
            raise ValueError(f"etp*ep must divide tp*cp*dp in {self}")
        if (self.tp * self.cp * self.shard) % (self.ep * self.etp):
            raise ValueError(f"etp*ep must divide tp*cp*dp_shard in {self}")

    @property
    def edp(self) -> int:
        """Expert data parallelism: the stage's ranks over etp*ep."""
        return self.ranks_per_stage // (self.ep * self.etp)

    @property
    def expert_shard(self) -> int:
        """Size of the ``edp_shard`` group: the ranks of one replica holding the same
        experts, ``edp / replicas`` (``edp`` without hybrid sharding)."""
        return self.edp // self.replicas

    @property
    def expert_shard_group(self) -> str:
        """The group the routed experts' state is sharded over: ``edp``, or
        ``edp_shard`` under hybrid sharding (see the module doc)."""
        return "edp_shard" if self.replicas > 1 else "edp"

    @property
    def chips(self) -> int:
        return -(-self.ranks // self.ranks_per_chip)

    @property
    def ranks_per_stage(self) -> int:
        return self.tp * self.cp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(tp_i, cp_i, dp_i, pp_i) of ``rank``."""
        self._check_rank(rank)
        rest, tp_i = divmod(rank, self.tp)
        rest, cp_i = divmod(rest, self.cp)
        pp_i, dp_i = divmod(rest, self.dp)
        return tp_i, cp_i, dp_i, pp_i

    def rank_of(self, tp_i: int, cp_i: int, dp_i: int, pp_i: int) -> int:
        """The rank at the given coordinates (the inverse of ``coords``)."""
        for value, size, name in (
            (tp_i, self.tp, "tp"),
            (cp_i, self.cp, "cp"),
            (dp_i, self.dp, "dp"),
            (pp_i, self.pp, "pp"),
        ):
            if not 0 <= value < size:
                raise ValueError(f"{name} index {value} out of range 0..{size - 1}")
        return ((pp_i * self.dp + dp_i) * self.cp + cp_i) * self.tp + tp_i

    def stage(self, rank: int) -> int:
        """The pipeline stage of ``rank``."""
        self._check_rank(rank)
        return rank // self.ranks_per_stage

    def chip_of(self, rank: int) -> int:
        self._check_rank(rank)
        return rank // self.ranks_per_chip

    def _stride_size(self, name: str) -> tuple[int, int]:
        """Rank stride between neighbours along ``name``, and the group size."""
        tp, tpcp = self.tp, self.tp * self.cp
        table = {
            "tp": (1, tp),
            "cp": (tp, self.cp),
            "dp": (tpcp, self.dp),
            "pp": (tpcp * self.dp, self.pp),
            "ep": (self.etp, self.ep),
            "dp_shard": (tp, self.shard_size),
            "dp_replicate": (tpcp * self.shard, self.replicas),
            "etp": (1, self.etp),
            "edp": (self.etp * self.ep, self.edp),
            "edp_shard": (self.etp * self.ep, self.expert_shard),
            "ep_node": (self.etp, self.ep_local),
            "ep_cross": (self.etp * self.ep_local, self.ep_nodes),
            "dp_cp": (tp, self.cp * self.dp),
        }
        try:
            return table[name]
        except KeyError:
            raise ValueError(f"unknown group {name!r}; valid: {', '.join(GROUP_NAMES)}") from None

    def group(self, name: str, rank: int) -> tuple[int, ...]:
        """The ranks that share every coordinate of ``rank`` but ``name``, in order of it.

        The expert groups (``ep``, ``etp``, ``edp``) follow the MoE numbering of the
        module doc.
        """
        self._check_rank(rank)
        stride, size = self._stride_size(name)
        base = rank - self._index(name, rank) * stride
        return tuple(range(base, base + size * stride, stride))

    def groups(self, name: str) -> list[tuple[int, ...]]:
        """Every group along ``name``, ordered by their lowest rank."""
        return [self.group(name, r) for r in range(self.ranks) if self._index(name, r) == 0]

    def _index(self, name: str, rank: int) -> int:
        """Position of ``rank`` inside its group along ``name``."""
        stride, size = self._stride_size(name)
        if name in EXPERT_GROUPS:
            return rank % self.ranks_per_stage // stride % size
        if name == "dp_shard":  # cp_i + cp * (dp_i % dp_shard)
            return rank // stride % (self.cp * self.dp) % self.shard_size
        if name == "dp_replicate":
            return rank // stride % self.replicas
        return rank // stride % size

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} out of range 0..{self.ranks - 1}")


def _ranks_text(ranks: int, ranks_per_chip: int) -> str:
    chips = ranks // ranks_per_chip
    if chips * ranks_per_chip == ranks:
        per = "rank" if ranks_per_chip == 1 else "ranks"
        return f"{ranks} ranks ({chips} chips x {ranks_per_chip} {per} per chip)"
    return f"{ranks} ranks"


def make_layout(
    par: ParallelismCfg, ranks: int, ranks_per_chip: int, ranks_per_node: int = 0
) -> Layout:
    """The layout of ``ranks`` ranks; fills ``dp`` when the scenario omits it.

    ``ranks_per_node`` (an instance's ranks) places EP groups on nodes.
    """
    tp, pp, cp, ep = par.tp, par.pp, par.cp, par.ep
    model_par = tp * pp * cp
    have = _ranks_text(ranks, ranks_per_chip)
    if par.dp is None:
        if ranks % model_par:
            # Blame the first size (in rank order: tp, cp, pp) that breaks divisibility.
            path, value = "parallelism", {"tp": tp, "pp": pp, "cp": cp}
            for key, partial in (("tp", tp), ("cp", tp * cp), ("pp", model_par)):
                if ranks % partial:
                    path, value = f"parallelism.{key}", getattr(par, key)
                    break
            raise ScenarioError(
                path,
                value,
                f"tp*pp*cp = {tp}*{pp}*{cp} = {model_par} does not divide the cluster's {have}; "
                "choose tp, pp and cp whose product divides the rank count",
            )
        dp = ranks // model_par
    else:
        dp = par.dp
        total = model_par * dp
        if total != ranks:
            if ranks % model_par == 0:
                hint = f"set parallelism.dp: {ranks // model_par} or omit dp to fill"
            else:
                hint = (
                    f"tp*pp*cp = {model_par} does not divide {ranks} either; "
                    "change tp, pp or cp, or the cluster size"
                )
            raise ScenarioError(
                "parallelism.dp",
                dp,
                f"tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} = {total} but the cluster has {have}; {hint}",
            )
    vp, vshape = par.virtual_stages, par.schedule == "dualpipe"
    if vshape:  # DualPipeV: two chunks per stage, in a V
        if vp > 2:
            raise ScenarioError(
                "parallelism.virtual_stages",
                vp,
                "schedule dualpipe runs two model chunks per stage (DualPipeV); set "
                "virtual_stages: 2 (or 1, which dualpipe makes 2)",
            )
        vp = 2
    etp = par.etp if par.etp is not None else tp
    per_stage = tp * cp * dp
    if per_stage % etp:
        raise ScenarioError(
            "parallelism.etp",
            etp,
            f"expert tensor parallelism must divide tp*cp*dp = {tp}*{cp}*{dp} = {per_stage}",
        )
    if per_stage % (etp * ep):
        carved = (
            f"dp*cp = {dp}*{cp} = {dp * cp}"
            if etp == tp
            else (f"tp*cp*dp / etp = {per_stage // etp}")
        )
        fold = (
            f", or set etp: 1 (Megatron-Core's MoE parallel folding: the experts' ranks "
            f"taken from tp*cp*dp = {per_stage})"
            if etp == tp > 1 and per_stage % ep == 0
            else ""
        )
        raise ScenarioError(
            "parallelism.ep",
            ep,
            f"expert parallelism is carved out of data (and context) parallelism, so ep must "
            f"divide {carved}{fold}",
        )
    if par.dp_shard is not None and dp % par.dp_shard:
        raise ScenarioError(
            "parallelism.dp_shard",
            par.dp_shard,
            f"the shard group is a part of data parallelism, so dp_shard must divide dp = {dp}; "
            f"valid: {divisors(dp)}",
        )
    shard = par.dp_shard or dp
    if (tp * cp * shard) % (etp * ep):
        fits = [
            d
            for d in range(1, min(dp, 4096) + 1)
            if dp % d == 0 and (tp * cp * d) % (etp * ep) == 0
        ]
        raise ScenarioError(
            "parallelism.dp_shard",
            par.dp_shard,
            f"with hybrid sharding each replica's EP groups lie inside it, so etp*ep = "
            f"{etp}*{ep} must divide tp*cp*dp_shard = {tp}*{cp}*{shard}; valid dp_shard: "
            + ", ".join(map(str, fits[:12])),
        )
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        ranks=ranks,
        ranks_per_chip=ranks_per_chip,
        vp=vp,
        dp_shard=par.dp_shard or 0,
        etp=etp,
        ranks_per_node=ranks_per_node,
        vshape=vshape,
    )


def divisors(n: int, limit: int = 12) -> str:
    """The divisors of ``n`` (up to 4096), the first ``limit`` of them, for error messages."""
    found = [d for d in range(1, min(n, 4096) + 1) if n % d == 0]
    text = ", ".join(map(str, found[:limit]))
    return text + (", ..." if len(found) > limit else "")
