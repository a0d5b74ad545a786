"""The layouts a search enumerates, and which of them are valid and fit in memory.

For R ranks, every (tp, cp, pp) whose product divides R gives dp = R/(tp·cp·pp);
with it go every microbatch size that divides the global batch per replica (up
to ``MAX_MICROBATCH``), ZeRO 0 to 3 (only 0 when dp = 1, where they are the
same; ZeRO-2 and 3 shard over all of dp, and also over the DP ranks of one
scale-up domain, ``dp_shard``, when dp spans several), recompute none,
selective and full, and the schedules 1F1B and GPipe
(only 1F1B when pp = 1, where they are the same). For MoE models, expert
parallelism too: etp = tp or 1, and every ep that divides the experts and what is
left of the stage's tp·cp·dp ranks after etp, with ZeRO 0 to 3 (their experts over
edp) and the same hybrid sharding where one replica's tp·cp·dp_shard ranks hold
whole EP groups (etp·ep divides them; the experts then shard over the replica's
edp_shard ranks). Interleaving is not searched:
candidates have one model chunk per stage (``virtual_stages: 1``).

A layout is *valid* when ``workload.validate`` accepts it (heads and MLP width
divisible by tp, layers by pp, the sequence by tp·cp, ...), and *fits* when the
fullest chip's HBM holds it: the stage needing the most memory per rank, times
the ranks per chip, plus the runtime's reserve (``workload.memcheck``). That bound
is never below what ``check_fits`` computes (a chip straddling two stages holds a mix
of them), so every layout that fits here passes ``check_fits``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from clustersim.catalog.reserve import RuntimeReserve, runtime_reserve
from clustersim.catalog.schema import ModelSpec
from clustersim.errors import ScenarioError
from clustersim.scenario import Resolved
from clustersim.scenario.models import ParallelismCfg, TrainingCfg
from clustersim.workload import Layout, memory_per_rank, validate
from clustersim.workload.memcheck import reserve_per_chip

__all__ = [
    "MAX_MICROBATCH",
    "RECOMPUTE",
    "SCHEDULES",
    "ZEROS",
    "Candidate",
    "chip_memory_bytes",
    "divisors",
    "enumerate_layouts",
    "layouts_of",
]

MAX_MICROBATCH = 8
"""Largest microbatch size tried: beyond it activations outgrow HBM for any model worth
searching, and per-op efficiency no longer improves."""
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")
ZEROS: tuple[int, ...] = (0, 1, 2, 3)
SCHEDULES: tuple[str, ...] = ("1f1b", "gpipe")
GIB = 2.0**30


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


@dataclass(frozen=True)
class Candidate:
    """One enumerated layout, with whether it is valid and fits, and why not."""

    par: ParallelismCfg
    layout: Layout
    valid: bool
    fits: bool
    memory_gib_per_chip: float  # NaN when invalid
    reason: str  # empty when valid and fitting

    def key(self) -> dict[str, object]:
        p = self.par
        return {
            "tp": self.layout.tp,
            "pp": self.layout.pp,
            "dp": self.layout.dp,
            "cp": self.layout.cp,
            "ep": self.layout.ep,
            "etp": self.layout.etp,
            "zero": p.zero,
            "dp_shard": self.layout.shard,
            "microbatch_size": p.microbatch_size,
            "recompute": p.recompute,
            "schedule": p.schedule,
        }


def _experts(tp: int, cp: int, dp: int, experts: int) -> list[tuple[int, int]]:
    """(ep, etp) of an MoE model: etp = tp or 1, and ep dividing both the experts and what
    is left of the stage's tp·cp·dp ranks (Megatron-Core carves ep out of dp·cp)."""
    if not experts:
        return [(1, tp)]
    out = []
    for etp in sorted({tp, 1}, reverse=True):
        pool = tp * cp * dp // etp
        out += [(ep, etp) for ep in divisors(math.gcd(pool, experts))]
    return out


def _shapes(
    ranks: int, train: TrainingCfg, experts: int
) -> Iterator[tuple[int, int, int, int, int, int, int]]:
    """(tp, cp, pp, dp, ep, etp, microbatch) with tp·cp·pp·dp = ranks and dp·mb | batch."""
    for tp in divisors(ranks):
        for cp in divisors(ranks // tp):
            for pp in divisors(ranks // (tp * cp)):
                dp = ranks // (tp * cp * pp)
                if train.global_batch_size % dp:
                    continue
                per_replica = train.global_batch_size // dp
                for mb in divisors(per_replica):
                    if mb > MAX_MICROBATCH:
                        break
                    for ep, etp in _experts(tp, cp, dp, experts):
                        yield tp, cp, pp, dp, ep, etp, mb


def layouts_of(res: Resolved, *, domain_ranks: int | None = None) -> list[Candidate]:
    """``enumerate_layouts`` for a resolved scenario: its model, settings, ranks and HBM."""
    sc = res.scenario
    policy = sc.parallelism.recompute_policy or res.software.recompute_policy
    return enumerate_layouts(
        res.model,
        sc.parallelism.model_copy(update={"recompute_policy": policy}),
        sc.training,
        ranks=res.ranks,
        ranks_per_chip=res.ranks_per_chip,
        hbm_bytes_per_chip=res.chip.hbm_bytes,
        domain_ranks=domain_ranks,
        reserve=runtime_reserve(res.chip),
    )


def enumerate_layouts(
    model: ModelSpec,
    base: ParallelismCfg,
    train: TrainingCfg,
    *,
    ranks: int,
    ranks_per_chip: int,
    hbm_bytes_per_chip: float,
    domain_ranks: int | None = None,
    reserve: RuntimeReserve | None = None,
) -> list[Candidate]:
    """Every layout of ``ranks`` ranks (see the module doc), valid or not.

    ``base`` supplies what the search does not vary (sequence parallelism,
    gradient bucket size, uneven stages, the FSDP unit and prefetch).
    ``domain_ranks``: the ranks of one scale-up domain, for hybrid sharding.
    ``reserve``: the runtime's reserve, added to the counted state (none: nothing).
    """
    out: list[Candidate] = []
    policy = base.recompute_policy
    experts = model.moe.experts if model.moe is not None else 0
    for tp, cp, pp, dp, ep, etp, mb in _shapes(ranks, train, experts):
        layout = Layout(
            tp=tp,
            pp=pp,
            dp=dp,
            cp=cp,
            ep=ep,
            ranks=ranks,
            ranks_per_chip=ranks_per_chip,
            etp=etp,
        )
        zeros = ZEROS if dp > 1 else (0,)
        # An MoE model's replicas hold whole EP groups (``make_layout``'s check).
        shards = [d for d in _shards(dp, tp * cp, domain_ranks) if (tp * cp * d) % (ep * etp) == 0]
        schedules = SCHEDULES if pp > 1 else SCHEDULES[:1]
        first = base.model_copy(
            update={
                "tp": tp,
                "pp": pp,
                "dp": dp,
                "cp": cp,
                "ep": ep,
                "etp": etp if experts else None,
                "microbatch_size": mb,
                "virtual_stages": 1,
            }
        )
        reason = ""
        try:
            validate(model, first, train, layout)
        except ScenarioError as exc:
            reason = str(exc)
        for zero, shard in [(z, None) for z in zeros] + [(z, d) for z in zeros[2:] for d in shards]:
            lay = layout if shard is None else replace(layout, dp_shard=shard)
            for recompute in RECOMPUTE:
                for schedule in schedules:
                    par = first.model_copy(
                        update={
                            "zero": zero,
                            "dp_shard": shard,
                            "recompute": recompute,
                            # what selective keeps is the stack's (layouts_of)
                            "recompute_policy": policy if recompute == "selective" else None,
                            "schedule": schedule,
                        }
                    )
                    out.append(
                        _judge(
                            model,
                            par,
                            train,
                            lay,
                            hbm_bytes_per_chip=hbm_bytes_per_chip,
                            reserve=reserve,
                            invalid=reason,
                        )
                    )
    return out


def _shards(dp: int, model_ranks: int, domain_ranks: int | None) -> list[int]:
    """Shard groups smaller than dp to try: the DP ranks of one scale-up domain."""
    if domain_ranks is None or domain_ranks % model_ranks:
        return []
    shard = domain_ranks // model_ranks
    return [shard] if 1 < shard < dp and dp % shard == 0 else []


def _judge(
    model: ModelSpec,
    par: ParallelismCfg,
    train: TrainingCfg,
    layout: Layout,
    *,
    hbm_bytes_per_chip: float,
    invalid: str,
    reserve: RuntimeReserve | None = None,
) -> Candidate:
    if invalid:
        return Candidate(par, layout, False, False, float("nan"), invalid)
    need = chip_memory_bytes(model, par, train, layout)
    held = 0.0 if reserve is None else reserve_per_chip(reserve, layout)
    fits = need + held <= hbm_bytes_per_chip
    cap = hbm_bytes_per_chip / GIB
    total = (need + held) / GIB
    reason = "" if fits else f"needs {total:.1f} GiB per chip, more than its {cap:.1f} GiB"
    return Candidate(par, layout, True, fits, need / GIB, reason)


def chip_memory_bytes(
    model: ModelSpec, par: ParallelismCfg, train: TrainingCfg, layout: Layout
) -> float:
    """HBM bytes per chip: the stage needing the most per rank, times the ranks per chip
    (what ``summary.json`` reports as ``memory_gib_per_chip.total``)."""
    per_rank = max(
        memory_per_rank(model, par, train, layout, stage).total for stage in range(layout.pp)
    )
    return per_rank * layout.ranks_per_chip
