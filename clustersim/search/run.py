"""The layout search: enumerate, keep what fits, rank by estimate, simulate the best.

``search(res, chips=N)`` sizes the scenario's cluster to N chips, enumerates
every layout (``space``), estimates each one that fits (``estimate``), and
simulates the ``simulate`` best by the objective with ``sim.simulate``
(folded above ``FOLD_ABOVE_RANKS`` ranks). The final ranking puts simulated
layouts first, by their simulated objective, then the rest by estimate.

Objectives: ``time`` ranks by step time (the token budget per step is the
scenario's, so this is time per token); ``cost`` by dollars per million tokens
under the scenario's pricing mode.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from clustersim import cost
from clustersim.errors import ClusterSimError, ScenarioError
from clustersim.hardware.chip import ChipModel
from clustersim.scenario import Resolved, resolve
from clustersim.search.estimate import Estimator, NetModel
from clustersim.search.space import Candidate, layouts_of
from clustersim.workload.titan import lowering_of

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FOLD_ABOVE_RANKS",
    "OBJECTIVES",
    "Objective",
    "SearchResult",
    "resize",
    "search",
    "write_search",
]

Objective = Literal["time", "cost"]
OBJECTIVES: tuple[str, ...] = ("time", "cost")
FOLD_ABOVE_RANKS = 64
"""Candidates with more ranks are simulated folded (one rank per stage; within 1% of
detailed, and several times faster)."""
Progress = Callable[[int, int, str], None]
"""``(done, total, label)``: called before and after each simulated candidate."""


@dataclass
class SearchResult:
    """Every enumerated layout (``frame``, best first) and what the search did."""

    frame: pd.DataFrame
    scenario: str
    instance: str
    instances: int
    chips: int
    objective: str
    counts: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    estimate_s: float = 0.0

    def top(self, k: int) -> pd.DataFrame:
        """The best ``k`` layouts that fit."""
        return self.frame[self.frame["fits"]].head(k)

    def meta(self) -> dict[str, Any]:
        best = self.top(1).to_dict(orient="records")
        return {
            "scenario": self.scenario,
            "instance": self.instance,
            "instances": self.instances,
            "chips": self.chips,
            "objective": self.objective,
            **self.counts,
            "wall_s": self.wall_s,
            "estimate_s": self.estimate_s,
            "best": _plain(best[0]) if best else None,
        }


def resize(res: Resolved, chips: int) -> Resolved:
    """The scenario on ``chips`` chips: instance count = chips / chips per instance."""
    per = res.instance.chips
    if chips < 1 or chips % per:
        raise ScenarioError(
            "--chips",
            chips,
            f"must be a positive multiple of the {per} chips of one {res.instance.name}",
        )
    raw = copy.deepcopy(res.raw)
    raw.setdefault("cluster", {})["count"] = chips // per
    return resolve(raw)


def search(
    res: Resolved,
    *,
    chips: int,
    objective: str = "time",
    simulate: int = 5,
    progress: Progress | None = None,
) -> SearchResult:
    """Search the layouts of ``res``'s model on ``chips`` chips of its instance."""
    if objective not in OBJECTIVES:
        raise ScenarioError("--objective", objective, "expected time or cost")
    if simulate < 0:
        raise ScenarioError("--simulate", simulate, "must be zero or more")
    t0 = time.perf_counter()
    from clustersim.sim.run import check_precision

    res = resize(res, chips)
    check_precision(res)
    sc = res.scenario
    chip = ChipModel(res.chip, res.lnc)
    net = NetModel.of(res.instance, res.chip, sc.cluster.count, res.lnc)
    cands = layouts_of(
        res, domain_ranks=net.chips_per_instance * net.instances_per_domain * res.ranks_per_chip
    )
    usd_hour = cost.usd_per_hour(res.instance, sc.cluster.count, sc.cost, res.chip)
    tokens = sc.training.global_batch_size * sc.training.seq_len
    rows = [_row(i, c, sc.training.global_batch_size) for i, c in enumerate(cands)]
    lowering = lowering_of(sc.software.compile, res.software.compile)
    estimator = Estimator(
        res.model, sc.training, chip, net, moe=sc.moe, seed=sc.seed, lowering=lowering,
        host_op_s=sc.software.host_op_s or 0.0,
    )  # fmt: skip
    t_est = time.perf_counter()
    for cand, row in zip(cands, rows, strict=True):
        if cand.fits:
            est = estimator(cand.par, cand.layout)
            row.update(
                est_step_time_s=est.step_time_s,
                est_compute_s=est.compute_s,
                est_comm_s=est.comm_s,
                est_bubble_s=est.bubble_s,
                est_dp_exposed_s=est.dp_exposed_s,
                est_mfu=est.mfu,
                est_usd_per_million_tokens=cost.usd_per_million_tokens(
                    usd_hour, tokens / est.step_time_s
                ),
            )
    estimate_s = time.perf_counter() - t_est
    key = "step_time_s" if objective == "time" else "usd_per_million_tokens"
    fitting = sorted((r for r in rows if r["fits"]), key=lambda r: (r[f"est_{key}"], _order(r)))
    chosen = fitting[:simulate]
    for i, row in enumerate(chosen):
        label = _label(row)
        if progress is not None:
            progress(i, len(chosen), label)
        _simulate(res, cands[row["index"]], row)
        if progress is not None:
            progress(i + 1, len(chosen), label)
    rows.sort(key=lambda r: _rank_key(r, key))
    import pandas as pd

    frame = pd.DataFrame(rows).drop(columns=["index"])
    frame.insert(0, "rank", range(1, len(frame) + 1))
    counts = {
        "enumerated": len(cands),
        "valid": sum(c.valid for c in cands),
        "fit": sum(c.fits for c in cands),
        "simulated": len(chosen),
        "simulation_errors": sum(bool(r["sim_error"]) for r in chosen),
    }
    return SearchResult(
        frame=frame,
        scenario=sc.name,
        instance=res.instance.name,
        instances=sc.cluster.count,
        chips=res.chips,
        objective=objective,
        counts=counts,
        wall_s=time.perf_counter() - t0,
        estimate_s=estimate_s,
    )


_EST = (
    "est_step_time_s",
    "est_compute_s",
    "est_comm_s",
    "est_bubble_s",
    "est_dp_exposed_s",
    "est_mfu",
    "est_usd_per_million_tokens",
)
_SIM = (
    "sim_step_time_s",
    "sim_mfu",
    "sim_exposed_comm_s",
    "sim_bubble_s",
    "sim_usd_per_million_tokens",
    "sim_kwh_per_million_tokens",
    "sim_wall_s",
)


def _row(index: int, c: Candidate, batch: int) -> dict[str, Any]:
    nan = math.nan
    row: dict[str, Any] = {"index": index, **c.key()}
    row.update(
        microbatches=batch // (c.layout.dp * c.par.microbatch_size),
        valid=c.valid,
        fits=c.fits,
        memory_gib_per_chip=c.memory_gib_per_chip,
        reason=c.reason,
    )
    row.update(dict.fromkeys(_EST, nan))
    row.update(simulated=False, sim_fidelity="", sim_error="")
    row.update(dict.fromkeys(_SIM, nan))
    return row


def _simulate(res: Resolved, cand: Candidate, row: dict[str, Any]) -> None:
    from clustersim.sim import simulate

    raw = copy.deepcopy(res.raw)
    raw["parallelism"] = cand.par.model_dump(mode="json")
    row["simulated"] = True
    try:
        one = resolve(raw)
        folded = one.ranks > FOLD_ABOVE_RANKS
        s = simulate(one, record=False, fidelity="folded" if folded else "detailed").summary
    except ClusterSimError as exc:
        row["sim_error"] = str(exc)
        return
    row.update(
        sim_fidelity=s["fidelity"],
        sim_step_time_s=s["step_time_s"],
        sim_mfu=s["mfu"],
        sim_exposed_comm_s=s["breakdown_s"]["exposed_comm"],
        sim_bubble_s=s["breakdown_s"]["bubble"],
        sim_usd_per_million_tokens=s["cost"]["usd_per_million_tokens"],
        sim_kwh_per_million_tokens=s["energy"]["kwh_per_million_tokens"],
        sim_wall_s=s["wall_s"],
        memory_gib_per_chip=s["memory_gib_per_chip"]["total"],
    )


def _order(row: dict[str, Any]) -> tuple[Any, ...]:
    """A deterministic tie-break: simpler layouts first."""
    return (
        row["tp"] * row["pp"] * row["cp"],
        row["tp"],
        row["pp"],
        row["cp"],
        -row["microbatch_size"],
        row["zero"],
        -row["dp_shard"],
        ("none", "selective", "full").index(row["recompute"]),
        row["schedule"],
    )


def _rank_key(row: dict[str, Any], key: str) -> tuple[Any, ...]:
    inf = math.inf
    if row["simulated"] and not row["sim_error"]:
        return (0, row[f"sim_{key}"], _order(row))
    if row["fits"]:
        return (1, row[f"est_{key}"], _order(row))
    if row["valid"]:
        return (2, row["memory_gib_per_chip"], _order(row))
    return (3, inf, _order(row))


def _label(row: dict[str, Any]) -> str:
    experts = f" ep {row['ep']} etp {row['etp']}" if row.get("ep", 1) > 1 else ""
    return (
        f"tp {row['tp']} pp {row['pp']} dp {row['dp']} cp {row['cp']}{experts} mb "
        f"{row['microbatch_size']} zero {row['zero']} dp_shard {row['dp_shard']} "
        f"{row['recompute']} {row['schedule']}"
    )


def _plain(row: dict[Any, Any]) -> dict[str, Any]:
    """A frame row as JSON values: numpy scalars unwrapped, NaN as null."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        value = v.item() if hasattr(v, "item") else v
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        out[str(k)] = value
    return out


def write_search(out: Path, result: SearchResult) -> list[Path]:
    """Write ``search.parquet``, ``search.csv`` and ``search.json`` atomically into ``out``."""
    from clustersim.trace.io import atomic_write_text, write_parquet

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "search.parquet", out / "search.csv", out / "search.json"]
    write_parquet(paths[0], result.frame)
    atomic_write_text(paths[1], result.frame.to_csv(index=False))
    atomic_write_text(paths[2], json.dumps(result.meta(), indent=2) + "\n")
    return paths
