"""The memory check: does a layout fit in HBM, and which changes would make it fit.

The rule, with its tolerance:

- the counted state (``workload.memory``: weights, gradients, optimizer state,
  activations) plus the runtime's reserve (``catalog.reserve``: on a GPU the CUDA
  context, cuBLAS's workspaces and NCCL's buffers per communicator; on Trainium the
  Neuron runtime's) is what no allocator can do without. Over the chip's HBM, the
  scenario is refused (``ScenarioError`` at ``parallelism``) with the breakdown and
  the single or combined changes that fit;
- the caching allocator reserves more than it allocates: ``fragmentation``, a
  fraction of the dynamic memory (activations and what the backward regenerates; the
  ZeRO paper's residual-memory section). A run that fits only without it runs, with a
  warning that it may not fit (``MemoryCheck.warning``).

So a run that fits on real hardware is never refused as long as the counted state and
the reserve do not overestimate what it held; the fragmentation term, the most
uncertain one, only warns.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.catalog.reserve import RuntimeReserve
from clustersim.catalog.schema import ModelSpec
from clustersim.errors import ScenarioError
from clustersim.scenario.models import MoECfg, ParallelismCfg, TrainingCfg
from clustersim.workload.checks import validate
from clustersim.workload.layout import Layout
from clustersim.workload.memory import GIB, MemoryBreakdown, memory_per_rank

__all__ = [
    "MemoryCheck",
    "check_fits",
    "communicators",
    "memory_check",
    "reserve_per_chip",
]

_NO_RESERVE = RuntimeReserve()


def communicators(layout: Layout) -> int:
    """The communication groups of more than one rank each rank is in (tp, cp, dp, pp, ep)."""
    return sum(1 for n in (layout.tp, layout.cp, layout.dp, layout.pp, layout.ep) if n > 1)


def reserve_per_chip(reserve: RuntimeReserve, layout: Layout) -> float:
    """The runtime reserve of one chip's ranks under ``layout``."""
    return reserve.reserve_bytes(communicators(layout)) * layout.ranks_per_chip


@dataclass(frozen=True)
class MemoryCheck:
    """What the fullest chip needs: the counted state, the runtime's reserve and the
    allocator's fragmentation (bytes per chip), against its HBM."""

    counted_bytes: float
    reserve_bytes: float
    fragmentation_bytes: float
    capacity_bytes: float
    stage: int
    per_rank: MemoryBreakdown

    @property
    def need_bytes(self) -> float:
        """What no allocator can do without: the counted state and the reserve."""
        return self.counted_bytes + self.reserve_bytes

    @property
    def with_fragmentation_bytes(self) -> float:
        return self.need_bytes + self.fragmentation_bytes

    @property
    def warning(self) -> str | None:
        """Set when the chip fits only without the allocator's fragmentation."""
        over = self.with_fragmentation_bytes - self.capacity_bytes
        if over <= 0 or self.need_bytes > self.capacity_bytes:
            return None
        return (
            f"may not fit: {self.with_fragmentation_bytes / GIB:.1f} GiB per chip with the "
            f"allocator's fragmentation ({self.fragmentation_bytes / GIB:.1f} GiB) is over the "
            f"chip's {self.capacity_bytes / GIB:.1f} GiB of HBM by {over / GIB:.1f} GiB; "
            f"{self.need_bytes / GIB:.1f} GiB without it fits"
        )

    def gib(self) -> dict[str, float]:
        """The check's lines in GiB per chip."""
        return {
            "counted": self.counted_bytes / GIB,
            "reserve": self.reserve_bytes / GIB,
            "fragmentation": self.fragmentation_bytes / GIB,
            "with_fragmentation": self.with_fragmentation_bytes / GIB,
            "capacity": self.capacity_bytes / GIB,
        }


def _chip_peak(
    model: ModelSpec,
    par: ParallelismCfg,
    train: TrainingCfg,
    layout: Layout,
    route: _Route = (None, 0),
) -> tuple[float, int, MemoryBreakdown]:
    """Bytes on the fullest chip, the worst stage on it, and that stage's per-rank breakdown.

    Ranks fill chips in order, so a chip may straddle two stages; only chips at
    stage boundaries can differ from a chip inside a stage.
    """
    moe, seed = route
    per_stage = [
        memory_per_rank(model, par, train, layout, k, moe=moe, seed=seed) for k in range(layout.pp)
    ]
    rpc, size = layout.ranks_per_chip, layout.ranks_per_stage
    candidates = {c for k in range(layout.pp) for c in (k * size // rpc, k * size // rpc + 1)}
    best = (-1.0, 0, per_stage[0])
    for chip in sorted(c for c in candidates if c * rpc < layout.ranks):
        lo, hi = chip * rpc, min((chip + 1) * rpc, layout.ranks)
        total = 0.0
        worst = lo // size
        for k in range(lo // size, (hi - 1) // size + 1):
            n = min(hi, (k + 1) * size) - max(lo, k * size)
            total += n * per_stage[k].total
            if per_stage[k].total > per_stage[worst].total:
                worst = k
        if total > best[0]:
            best = (total, worst, per_stage[worst])
    return best


Change = tuple[str, ParallelismCfg, Layout]
_Route = tuple[MoECfg | None, int]  # MoE routing and the seed that draws its skew


def _alternatives(model: ModelSpec, par: ParallelismCfg, layout: Layout) -> list[Change]:
    """Single changes that lower memory, cheapest in step time first."""
    out: list[Change] = []
    if par.zero == 0 and layout.dp > 1:
        out.append(("zero: 1", par.model_copy(update={"zero": 1}), layout))
    if par.recompute == "none":
        out.append(
            ("recompute: selective", par.model_copy(update={"recompute": "selective"}), layout)
        )
    if par.recompute != "full":
        full = par.model_copy(
            update={"recompute": "full", "recompute_modules": None, "recompute_policy": None}
        )
        out.append(("recompute: full", full, layout))
    if par.microbatch_size > 1:
        out.append(("microbatch_size: 1", par.model_copy(update={"microbatch_size": 1}), layout))
    for dim in ("tp", "pp"):
        if layout.dp % 2:
            continue
        size = 2 * getattr(layout, dim)
        new_par = par.model_copy(update={dim: size, "dp": layout.dp // 2})
        try:
            new_layout = Layout(
                tp=new_par.tp,
                pp=new_par.pp,
                dp=layout.dp // 2,
                cp=layout.cp,
                ep=layout.ep,
                ranks=layout.ranks,
                ranks_per_chip=layout.ranks_per_chip,
                vp=layout.vp,
                etp=new_par.etp if new_par.etp is not None else new_par.tp,
            )
        except ValueError:  # ep no longer divides what is left of dp x cp
            continue
        out.append((f"{dim}: {size} (dp: {layout.dp // 2})", new_par, new_layout))
    return out


def _valid(model: ModelSpec, par: ParallelismCfg, train: TrainingCfg, layout: Layout) -> bool:
    try:
        validate(model, par, train, layout)
    except ScenarioError:
        return False
    return True


def memory_check(
    model: ModelSpec,
    par: ParallelismCfg,
    train: TrainingCfg,
    layout: Layout,
    hbm_bytes_per_rank: float,
    *,
    reserve: RuntimeReserve = _NO_RESERVE,
    moe: MoECfg | None = None,
    seed: int = 0,
) -> MemoryCheck:
    """What the fullest chip needs (``MemoryCheck``), refusing nothing."""
    counted, stage, mem = _chip_peak(model, par, train, layout, (moe, seed))
    rpc = layout.ranks_per_chip
    return MemoryCheck(
        counted_bytes=counted,
        reserve_bytes=reserve_per_chip(reserve, layout),
        fragmentation_bytes=reserve.fragmentation * mem.activations * rpc,
        capacity_bytes=hbm_bytes_per_rank * rpc,
        stage=stage,
        per_rank=mem,
    )


def check_fits(
    model: ModelSpec,
    par: ParallelismCfg,
    train: TrainingCfg,
    layout: Layout,
    hbm_bytes_per_rank: float,
    *,
    reserve: RuntimeReserve = _NO_RESERVE,
    moe: MoECfg | None = None,
    seed: int = 0,
) -> MemoryCheck:
    """Raise ``ScenarioError`` at ``parallelism`` if the fullest chip's counted state and
    runtime reserve overflow its HBM; else return the check (its ``warning`` set when
    it fits only without the allocator's fragmentation).

    The message says by how much, and which changes would fit, found by
    evaluating the memory of each alternative (ZeRO-1, recompute, a smaller
    microbatch, doubling tp or pp at the expense of dp), alone and then combined.
    """
    check = memory_check(
        model, par, train, layout, hbm_bytes_per_rank, reserve=reserve, moe=moe, seed=seed
    )
    capacity = check.capacity_bytes
    if check.need_bytes <= capacity:
        return check
    route = (moe, seed)
    need, mem = check.need_bytes, check.per_rank
    parts = ", ".join(
        f"{k} {getattr(mem, k) / GIB:.1f}" for k in ("weights", "grads", "optimizer", "activations")
    )
    held = ""
    if check.reserve_bytes:
        held = f", runtime reserve {check.reserve_bytes / GIB:.1f} per chip"
    problem = (
        f"needs {need / GIB:.1f} GiB per chip but the chip has {capacity / GIB:.1f} GiB of HBM "
        f"(over by {(need - capacity) / GIB:.1f} GiB; stage {check.stage}, per rank: {parts} "
        f"GiB{held}); "
    )
    fits: list[str] = []
    # Sharding the parameters too (FSDP) is tried alone, not in the combined path.
    fsdp = [("zero: 3", par.model_copy(update={"zero": 3}), layout)]
    fsdp = fsdp if layout.dp > 1 and par.zero < 3 else []
    for label, p2, l2 in [*_alternatives(model, par, layout), *fsdp]:
        if _valid(model, p2, train, l2):
            need2 = _chip_peak(model, p2, train, l2, route)[0] + reserve_per_chip(reserve, l2)
            if need2 <= capacity:
                fits.append(f"{label} ({need2 / GIB:.1f} GiB)")
    if fits:
        problem += "fits with " + " or ".join(fits)
    else:
        problem += _combined(model, par, train, layout, capacity, route=route, reserve=reserve)
    value = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "cp": layout.cp}
    raise ScenarioError("parallelism", value, problem)


def _combined(
    model: ModelSpec,
    par: ParallelismCfg,
    train: TrainingCfg,
    layout: Layout,
    capacity: float,
    *,
    route: _Route,
    reserve: RuntimeReserve = _NO_RESERVE,
) -> str:
    """Apply the alternatives one after another until the layout fits."""
    new_par, new_layout = par, layout
    need = float("inf")
    changed = False
    while True:
        # Selective recompute is a step towards full recompute: skip straight to it.
        options = [
            c
            for c in _alternatives(model, new_par, new_layout)
            if c[0] != "recompute: selective" and _valid(model, c[1], train, c[2])
        ]
        if not options:
            break
        _, new_par, new_layout = options[0]
        changed = True
        need = _chip_peak(model, new_par, train, new_layout, route)[0]
        need += reserve_per_chip(reserve, new_layout)
        if need <= capacity:
            text = _describe(par, layout, new_par, new_layout)
            return f"no single change fits; try together: {text} ({need / GIB:.1f} GiB)"
    if not changed:
        return "no change of the layout fits; use more chips or chips with more HBM"
    text = _describe(par, layout, new_par, new_layout)
    return (
        f"no change of the layout fits (even {text} needs {need / GIB:.1f} GiB); "
        "use more chips or chips with more HBM"
    )


def _describe(par: ParallelismCfg, layout: Layout, new_par: ParallelismCfg, new: Layout) -> str:
    """The settings that differ between two layouts, as YAML-like ``key: value`` pairs."""
    out = [
        f"{key}: {getattr(new_par, key)}"
        for key in ("zero", "recompute", "microbatch_size")
        if getattr(new_par, key) != getattr(par, key)
    ]
    out += [
        f"{key}: {getattr(new, key)}"
        for key in ("tp", "pp", "dp")
        if getattr(new, key) != getattr(layout, key)
    ]
    return ", ".join(out)
