"""``clustersim check`` of a training scenario: planned, its layout, rank placement,
memory per chip and sharding printed, without simulating."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clustersim.scenario import Resolved
    from clustersim.sim import Plan
    from clustersim.workload import MemoryCheck

__all__ = ["check_command", "memory_check_line", "sharding_line", "span"]


def check_command(res: Resolved) -> int:
    """``clustersim check`` of a training scenario: its layout, rank placement, memory
    and sharding, printed without simulating; exit 2 (a ``ScenarioError``) when it
    does not fit."""
    from rich.table import Table

    from clustersim.sim import Limits, plan
    from clustersim.terminal import console

    # Programs are built per stage, as a folded run would: bound that work too.
    pl = plan(res, check_memory=False, limits=Limits(), folded=True)
    if res.scenario.failures.inject:
        from clustersim.sim.injected import check_injections

        check_injections(res)
    lay = pl.layout
    con = console()
    cluster = (
        f"{res.scenario.cluster.count} x {res.instance.name} = {res.chips} {res.chip.name} chips"
    )
    ranks = f"lnc {res.lnc}: {res.ranks_per_chip} ranks per chip, {res.ranks} ranks"
    con.print(f"[bold]{res.scenario.name}[/]: {cluster}, {ranks}")
    con.print(
        f"layout: tp {lay.tp} x cp {lay.cp} x dp {lay.dp} x pp {lay.pp}; model {res.model.name}"
    )
    place = Table(title="rank placement (first groups)", title_justify="left")
    for col in ("group", "ranks", "chips"):
        place.add_column(col)
    hsdp = ("dp_shard", "dp_replicate") if lay.replicas > 1 else ()
    moe = ("ep", lay.expert_shard_group) if res.model.moe is not None else ()
    for name in ("tp", "cp", "dp", *hsdp, *moe, "pp"):
        size = len(lay.group(name, 0))
        if size == 1:
            continue
        count = lay.ranks // size
        # The first two groups: rank 0's, and the next one along the rank order.
        first = lay.group(name, 0)
        second = next((r for r in range(lay.ranks) if r not in first), None)
        shown = [first] if second is None else [first, lay.group(name, second)]
        for g in shown:
            chips = sorted({lay.chip_of(r) for r in g})
            place.add_row(f"{name} ({count} groups)", span(g), span(chips))
    con.print(place)
    mem = Table(title="memory per chip (GiB), worst stage", title_justify="left")
    gib = pl.memory_gib_per_chip()
    for key in gib:
        mem.add_column(key, justify="right")
    mem.add_row(*(f"{v:.2f}" for v in gib.values()))
    con.print(mem)
    con.print(sharding_line(res, pl))
    from clustersim.catalog.reserve import runtime_reserve
    from clustersim.workload import check_fits

    sc = res.scenario
    mc = check_fits(
        res.model,
        sc.parallelism,
        sc.training,
        lay,
        pl.chip.hbm_bytes_per_rank,
        reserve=runtime_reserve(res.chip),
        moe=sc.moe,
        seed=sc.seed,
    )
    con.print(memory_check_line(mc))
    if mc.warning:
        console(stderr=True).print(f"[yellow]warning[/]: {mc.warning}")
        con.print("[yellow]ok[/]: the scenario is valid; it fits in HBM only without fragmentation")
        return 0
    con.print("[green]ok[/]: the scenario is valid and fits in HBM")
    return 0


def memory_check_line(mc: MemoryCheck) -> str:
    """The check's rule in GiB per chip: counted state, runtime reserve, fragmentation."""
    g = mc.gib()
    return (
        f"memory check (GiB per chip): counted {g['counted']:.2f} + runtime reserve "
        f"{g['reserve']:.2f} = {g['counted'] + g['reserve']:.2f} must fit in {g['capacity']:.2f}; "
        f"+ allocator fragmentation {g['fragmentation']:.2f} = {g['with_fragmentation']:.2f} "
        "(over HBM only with it: a warning)"
    )


def sharding_line(res: Resolved, pl: Plan) -> str:
    """How ZeRO shards the worst stage's state, part by part, in GiB per rank."""
    from clustersim.workload.sharding import adam_bytes, sharded_state

    par, lay = res.scenario.parallelism, pl.layout
    stage = max(range(lay.pp), key=lambda k: pl.memory[k].total)
    adam = adam_bytes(res.scenario.training.optimizer_moments)
    state = sharded_state(res.model, par, lay, stage, adam=adam)
    head = f"zero {par.zero}"
    if par.zero and lay.grad_group(par.zero) == "dp_cp":
        head += f" over dp_cp {lay.grad_size(par.zero)} (dp {lay.dp} x cp {lay.cp})"
    elif par.zero and lay.shard_size > 1:
        size = f"{lay.shard_size} (dp {lay.shard} x cp {lay.cp})" if lay.cp > 1 else lay.shard
        head += f" over dp_shard {size} ({lay.replicas} replica{'s' * (lay.replicas > 1)})"
    if par.zero and res.model.moe is not None:
        head += f", experts over {lay.expert_shard_group} {lay.expert_shard} (ep {lay.ep})"
    if par.zero == 3:
        cfg = par.fsdp
        head += f", unit {cfg.unit}, prefetch {cfg.prefetch}"
        head += "" if cfg.reshard_after_forward else ", kept gathered to backward"
    parts = ", ".join(f"{name} {v / 2**30:.2f}" for name, v in state.parts)
    return f"sharding: {head}" + (f"; per rank (GiB): {parts}" if parts else "")


def span(values: Sequence[int]) -> str:
    vals = list(values)
    if len(vals) > 2 and vals == list(range(vals[0], vals[0] + len(vals))):
        return f"{vals[0]}..{vals[-1]}"
    shown = ", ".join(map(str, vals[:8]))
    return shown + (", ..." if len(vals) > 8 else "")
