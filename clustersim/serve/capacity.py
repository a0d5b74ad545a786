"""Capacity search: the cheapest instance type, TP and instance count that serves a
Poisson rate within a scenario's latency SLO (``clustersim serve-search``).

A *layout* is an instance type, a tensor-parallel size within one instance and the
engine's batch (on Neuron the compiled decode batch, ``max_num_seqs``, is tried at
:data:`NEURON_BATCHES`); a *candidate* is a layout on a number of instances, each
filled with replicas. The search

1. refuses, with the reason, the layouts that cannot run: the model does not fit a
   rank, the TP neither divides the KV heads nor is a multiple of them, the chip has
   no rate at the scenario's precision, Neuron's KV reservation does not fit;
2. estimates each layout in closed form from its iteration model: the batch-1 decode
   step (no request's TPOT is shorter) and one prompt's prefill alone (no TTFT is
   shorter) rule out layouts that cannot meet the SLO at any load, and a replica's
   work per request (its prefill plus its share of the largest decode batch whose
   step meets the TPOT target) gives the fewest instances worth simulating, halved
   for safety (:data:`START_FRACTION`);
3. simulates candidates cheapest first (the price per hour; at a fixed rate, $ per
   million output tokens follows it), each layout from its estimated count upwards,
   with ``requests`` requests each. A candidate meets the SLO when every request
   finished and the p90 of TTFT and of TPOT are within their targets; one that
   misses moves to one instance more, or to as many as its simulated throughput says
   the rate needs when it served clearly less than arrived. Simulating goes on, each
   layout to its cheapest count that meets the SLO, until the price passes
   :data:`COST_RATIO` times that of the first candidate to meet it, so the table holds
   the trade-off between price and latency around the pick.
4. picks the cheapest candidate that met the SLO (at one price, the one furthest
   inside it), simulated again with the scenario's own request count; if it misses
   then, the next. Every candidate simulated that cost less than the pick missed.

$ per million output tokens is priced at the offered rate (``rate x mean output
tokens``): a candidate that meets its SLO serves what arrives. ``clustersim serve``'s
summary divides by the simulated span instead, which includes the drain after the
last arrival and reads a little higher.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from clustersim import cost
from clustersim.errors import ClusterSimError, ScenarioError
from clustersim.scenario import Resolved, resolve
from clustersim.scenario.serving import ServingCfg
from clustersim.serve.arrivals import lengths
from clustersim.serve.capacity_layouts import (
    DEFAULT_INSTANCES,
    NEURON_BATCHES,
    Estimate,
    Layout,
    estimate,
    layouts_of,
    scenario_of,
)
from clustersim.serve.run import serve, serving_of

__all__ = [
    "COST_RATIO",
    "DEFAULT_INSTANCES",
    "NEURON_BATCHES",
    "CapacityResult",
    "Layout",
    "serve_search",
    "write_serve_search",
]

COST_RATIO = 3.0
"""Candidates are simulated up to this multiple of the pick's price per hour."""
PERCENTILE = "p90"
"""The SLO holds when this percentile of TTFT and of TPOT is within its target."""
FILES = ("serve_search.parquet", "serve_search.csv", "serve_search.json")
FIGURE = "pareto.png"
Progress = Callable[[int, int, str], None]
"""``(done, total, label)``: called before and after each simulated candidate."""


@dataclass
class CapacityResult:
    """Every layout and simulated candidate (``frame``, the pick first) and the search's
    settings and counts (``meta``)."""

    frame: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def pick(self) -> dict[str, Any] | None:
        rows = self.frame[self.frame["status"] == "pick"]
        return None if rows.empty else _plain(rows.iloc[0].to_dict())


def _meets(s: dict[str, Any]) -> bool:
    slo = s["slo"]
    ttft, tpot = s["ttft_s"][PERCENTILE], s["tpot_s"][PERCENTILE]
    return (
        s["requests_finished"] == s["requests"]
        and ttft is not None
        and ttft <= slo["ttft_s"]
        and (tpot is None or tpot <= slo["tpot_s"])
    )


def _row(lay: Layout, est: Estimate | None, status: str, reason: str) -> dict[str, Any]:
    return {
        "status": status,
        "instance": lay.instance,
        "tp": lay.tp,
        "engine": lay.engine,
        "max_num_seqs": lay.max_num_seqs,
        "instances": None,
        "replicas": None,
        "chips": None,
        "usd_per_hour": None,
        "est_tpot_floor_s": est.tpot_floor_s if est else None,
        "est_ttft_floor_s": est.ttft_floor_s if est else None,
        "est_replica_rps": est.capacity_rps if est else None,
        "est_start_instances": est.start_count if est else None,
        "requests": None,
        "meets_slo": False,
        "ttft_p90_s": None,
        "tpot_p90_s": None,
        "ttft_p99_s": None,
        "tpot_p99_s": None,
        "goodput_fraction": None,
        "output_tokens_per_s": None,
        "usd_per_million_output_tokens": None,
        "output_tokens_per_s_per_usd_hour": None,
        "output_tokens_per_s_per_chip": None,
        "reason": reason,
        "wall_s": None,
    }


def _simulated(
    base: dict[str, Any], res: Resolved, count: int, est: Estimate, offered_tokens: float
) -> dict[str, Any]:
    s = serve(res).summary
    meets = _meets(s)
    usd = float(s["usd_per_hour"])
    row = dict(base)
    row.update(
        status="meets" if meets else "misses",
        instances=count,
        replicas=int(s["replicas"]),
        chips=count * est.chips_per_instance,
        usd_per_hour=usd,
        requests=int(s["requests"]),
        meets_slo=meets,
        ttft_p90_s=s["ttft_s"]["p90"],
        tpot_p90_s=s["tpot_s"]["p90"],
        ttft_p99_s=s["ttft_s"]["p99"],
        tpot_p99_s=s["tpot_s"]["p99"],
        goodput_fraction=s["goodput_requests_per_s"] / s["requests_per_s"]
        if s["requests_per_s"]
        else 0.0,
        output_tokens_per_s=s["output_tokens_per_s"],
        usd_per_million_output_tokens=cost.usd_per_million_tokens(usd, offered_tokens)
        if meets
        else None,
        output_tokens_per_s_per_usd_hour=s["output_tokens_per_s"] / usd,
        output_tokens_per_s_per_chip=s["output_tokens_per_s"] / (count * est.chips_per_instance),
        reason="" if meets else _miss(s),
        wall_s=s["wall_s"],
    )
    return row


def _miss(s: dict[str, Any]) -> str:
    slo, parts = s["slo"], []
    if s["requests_finished"] < s["requests"]:
        parts.append(f"{s['requests'] - s['requests_finished']} requests unfinished")
    ttft, tpot = s["ttft_s"][PERCENTILE], s["tpot_s"][PERCENTILE]
    if ttft is not None and ttft > slo["ttft_s"]:
        parts.append(f"TTFT {PERCENTILE} {ttft:.3g} s > {slo['ttft_s']:g} s")
    if tpot is not None and tpot > slo["tpot_s"]:
        parts.append(f"TPOT {PERCENTILE} {tpot * 1e3:.3g} ms > {slo['tpot_s'] * 1e3:g} ms")
    return "; ".join(parts)


def _next_count(count: int, row: dict[str, Any], offered: float) -> int:
    """After a miss: one instance more, or, when the candidate served clearly fewer
    output tokens per second than arrived (``offered``), as many as its simulated
    throughput says the rate needs (x0.9)."""
    served = row["output_tokens_per_s"] or 0.0
    if served > 0 and served < 0.8 * offered:
        return max(count + 1, math.ceil(0.9 * count * offered / served))
    return count + 1


def _check_inputs(rate: float, requests: int, max_instances: int) -> None:
    if not (isinstance(rate, (int, float)) and 0 < rate < math.inf):
        raise ScenarioError("--rate", rate, "must be a positive, finite number of requests/s")
    if requests < 1:
        raise ScenarioError("--requests", requests, "must be at least 1")
    if max_instances < 1:
        raise ScenarioError("--max-instances", max_instances, "must be at least 1")


@dataclass
class _Search:
    """One search's fixed inputs and its layouts' estimates."""

    res: Resolved
    rate: float
    requests: int
    full: int  # requests of the pick's second run
    offered: float  # output tokens per second arriving
    layouts: list[Layout]
    ests: dict[int, tuple[Estimate, dict[str, Any]]] = field(default_factory=dict)

    def simulate(self, i: int, count: int, requests: int) -> dict[str, Any]:
        est, base = self.ests[i]
        res = resolve(scenario_of(self.res, self.layouts[i], count, self.rate, requests))
        return {**_simulated(base, res, count, est, self.offered), "_i": i}

    def choose(self, rows: list[dict[str, Any]]) -> None:
        """Mark the pick among ``rows``: the cheapest candidate meeting the SLO (of those
        at one price, the one furthest inside it), simulated again with ``full``
        requests; one that misses then says so, and the next is tried."""
        slo = serving_of(self.res).slo.model_dump()
        met = [r for r in rows if r["meets_slo"]]
        met.sort(key=lambda r: (r["usd_per_hour"], _headroom(r, slo)))
        for row in met:
            if self.full > self.requests:
                row.update(self.simulate(row["_i"], row["instances"], self.full))
                if not row["meets_slo"]:
                    short = f"met the SLO with {self.requests} requests, not with {self.full}"
                    row["reason"] = f"{short}: {row['reason']}"
                    continue
            row["status"] = "pick"
            return


def serve_search(
    res: Resolved,
    rate: float,
    *,
    instances: Sequence[str] = DEFAULT_INSTANCES,
    requests: int = 400,
    max_instances: int = 16,
    progress: Progress | None = None,
) -> CapacityResult:
    """Search ``instances`` for the cheapest candidate meeting ``res``'s SLO at ``rate``
    requests per second (see the module docstring); exit 2 on bad input."""
    t0 = time.perf_counter()
    cfg: ServingCfg = serving_of(res)
    if cfg.arrival.kind == "trace":
        raise ScenarioError(
            "serving.arrival.kind",
            "trace",
            "serve-search draws Poisson arrivals at --rate: give input_tokens and output_tokens",
        )
    _check_inputs(rate, requests, max_instances)
    full = max(requests, cfg.requests)
    outs = lengths(cfg.output_tokens, full, res.scenario.seed, 2)
    search = _Search(
        res, rate, requests, full, rate * float(np.mean(outs)), layouts_of(res, instances)
    )
    rows: list[dict[str, Any]] = []
    heap: list[tuple[float, float, int, int]] = []
    for i, lay in enumerate(search.layouts):
        est, why = estimate(res, lay, rate, requests)
        base = _row(lay, est, "skipped", why)
        if est is None:
            rows.append(base)
            continue
        search.ests[i] = (est, base)
        count = min(est.start_count, max_instances)
        heap.append((count * est.usd_per_instance_hour, -est.capacity_rps, i, count))
    heapq.heapify(heap)
    cheapest: float | None = None  # the price of the first candidate to meet the SLO
    done = 0
    open_layouts: set[int] = set()
    while heap:
        usd, key, i, count = heapq.heappop(heap)
        if cheapest is not None and usd > COST_RATIO * cheapest:
            heapq.heappush(heap, (usd, key, i, count))
            break
        if progress is not None:
            progress(done, done + len(heap) + 1, f"{search.layouts[i].label} x{count}")
        done += 1
        open_layouts.discard(i)
        try:
            row = search.simulate(i, count, requests)
        except ClusterSimError as exc:
            rows.append({**search.ests[i][1], "status": "skipped", "reason": str(exc)})
            continue
        rows.append(row)
        if row["meets_slo"]:
            cheapest = usd if cheapest is None else cheapest
            continue
        nxt = _next_count(count, row, search.offered)
        if nxt > max_instances:
            row["reason"] += f"; more than --max-instances {max_instances} needed"
            continue
        open_layouts.add(i)
        heapq.heappush(heap, (nxt * search.ests[i][0].usd_per_instance_hour, key, i, nxt))
    if progress is not None:
        progress(done, done, "")
    for usd, _key, i, count in heap:
        if i in open_layouts:
            continue  # its last simulated candidate is in the table
        rows.append(
            {
                **search.ests[i][1],
                "status": "not simulated",
                "instances": count,
                "usd_per_hour": usd,
                "reason": f"{count} instances at ${usd:,.2f}/h: past {COST_RATIO:g}x the "
                "cheapest that met the SLO",
            }
        )
    search.choose(rows)
    frame = _ordered(pd.DataFrame.from_records(rows))
    meta = {
        "scenario": res.scenario.name,
        "model": res.model.name,
        "rate_per_s": rate,
        "slo": cfg.slo.model_dump(),
        "percentile": PERCENTILE,
        "requests_per_candidate": requests,
        "requests_pick": full,
        "instances_searched": list(dict.fromkeys(lay.instance for lay in search.layouts)),
        "max_instances": max_instances,
        "pricing": res.scenario.cost.pricing,
        "layouts": len(search.layouts),
        "layouts_skipped": int((frame["status"] == "skipped").sum()),
        "simulated": int(frame["status"].isin(["pick", "meets", "misses"]).sum()),
        "wall_s": time.perf_counter() - t0,
    }
    result = CapacityResult(frame, meta)
    meta["pick"] = result.pick
    return result


def _headroom(row: dict[str, Any], slo: dict[str, float]) -> float:
    """How close a candidate runs to its SLO: the larger of its two p90s over their targets."""
    ttft = float(row["ttft_p90_s"]) / slo["ttft_s"]
    return max(ttft, float(row["tpot_p90_s"] or 0.0) / slo["tpot_s"])


_STATUS_ORDER = {"pick": 0, "meets": 1, "misses": 2, "not simulated": 3, "skipped": 4}


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    # A layout refused for a reason every batch shares is listed once, its batch blank.
    skipped = frame["status"] == "skipped"
    shared = skipped & frame.duplicated(["instance", "tp", "reason"], keep=False)
    frame.loc[shared, "max_num_seqs"] = None
    frame = frame[~(skipped & frame.duplicated(["instance", "tp", "reason"]))]
    order = frame["status"].map(_STATUS_ORDER)
    frame = frame.assign(_o=order).sort_values(
        ["_o", "usd_per_million_output_tokens", "usd_per_hour", "instance", "tp"],
        na_position="last",
        kind="stable",
    )
    frame = frame.drop(columns=["_o", "_i"], errors="ignore").reset_index(drop=True)
    return frame.astype(dict.fromkeys(_COUNTS, "Int64"))


_COUNTS = ("max_num_seqs", "instances", "replicas", "chips", "requests", "est_start_instances")


def write_serve_search(
    out: Path, result: CapacityResult, figure: Callable[[CapacityResult], bytes] | None = None
) -> list[Path]:
    """Write the table (parquet, csv), the meta (json) and, given ``figure``, the Pareto
    front (``pareto.png``) into ``out``, each atomically."""
    import json

    from clustersim.trace.io import atomic_write_bytes, atomic_write_text, write_parquet

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in FILES]
    write_parquet(paths[0], result.frame)
    atomic_write_text(paths[1], result.frame.to_csv(index=False))
    text = json.dumps(result.meta, indent=2, default=_json_default) + "\n"
    if figure is not None:
        paths.append(out / FIGURE)
        atomic_write_bytes(paths[-1], figure(result))
    atomic_write_text(paths[2], text)
    return paths


def _plain(row: dict[Any, Any]) -> dict[str, Any]:
    """A frame row as JSON values: numpy scalars as Python's, NaN as None."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        plain = None if value is pd.NA else value
        if isinstance(plain, np.generic):
            plain = plain.item()
        if isinstance(plain, float) and not math.isfinite(plain):
            plain = None
        out[str(key)] = plain
    return out


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")
