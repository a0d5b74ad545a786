"""The Trn2-against-H100 tutorial's figures, from its study simulated afresh.

``scenarios/studies/trn2-vs-h100-llama3-70b.yaml`` is expanded as ``clustersim sweep``
expands it and each point simulated in this process as a sweep's worker simulates it,
with the shipped fits; :func:`clustersim.search.hardware.comparison_frame` prices each
under every pricing mode, as ``python -m clustersim.search.hardware`` does for a study
directory. The study runs once per process and every figure reads that run.

Each entry of :data:`FIGURES` is ``(name, pattern, compute, noise, what, pages)``, a
figure of ``python -m clustersim.docs`` (a block where ``pattern`` is empty).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "FIGURES",
    "STUDY",
    "hardware_claims",
    "hardware_intervals",
    "hardware_rows",
    "hardware_table",
    "study_wall",
]

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "scenarios" / "studies" / "trn2-vs-h100-llama3-70b.yaml"
MODES = ("on_demand", "reserved", "capacity_block", "owned")


@functools.cache
def _study() -> tuple[list[dict[str, Any]], float]:
    """The study's comparison rows (one per group and hardware) and the seconds its
    points took to simulate, one after another in this process."""
    from clustersim.search.hardware import comparison_frame
    from clustersim.sweep.axes import expand
    from clustersim.sweep.execute import PointTask, run_point
    from clustersim.sweep.spec import load_study
    from clustersim.sweep.store import results_frame

    study = load_study(STUDY)
    points = expand(study)
    run = study.spec.run
    t0 = time.perf_counter()
    records = {}
    for p in points:
        task = PointTask(
            p.id, study.base, p.overrides, run.fidelity, run.max_events, run.max_memory
        )
        rec = run_point(task)
        if rec["status"] != "ok":
            raise RuntimeError(f"{STUDY.name}: point {p.values.get('name')}: {rec['error']}")
        records[p.id] = rec
    wall = time.perf_counter() - t0
    frame = comparison_frame(results_frame(points, records, study))
    rows: list[dict[str, Any]] = [
        {str(k): v for k, v in r.items()} for r in frame.to_dict("records")
    ]
    return rows, wall


def hardware_rows(group: str) -> dict[str, dict[str, Any]]:
    """The study's rows of ``group`` (``chips144`` or ``usd480``), by hardware."""
    return {r["hardware"]: r for r in _study()[0] if r["group"] == group}


def _name(hardware: str) -> str:
    return hardware.capitalize() if hardware.startswith("trn") else hardware.upper()


def hardware_table(group: str) -> Callable[[object], str]:
    """The study's ``group`` as the tutorial shows it: step, MFU, $ per million tokens
    under each pricing mode and energy per hardware, each column's lowest in bold."""

    def compute(ctx: object = None) -> str:
        rows = list(hardware_rows(group).values())
        cols = [f"usd_per_million_tokens.{m}" for m in MODES] + ["kwh_per_million_tokens"]
        digits = {c: (2 if c.startswith("kwh") else 3) for c in cols}
        best = {c: min(round(float(r[c]), digits[c]) for r in rows) for c in cols}
        tail = "$/M tok on demand | reserved | capacity block | owned (TCO) | kWh/M tok |"
        if group == "chips144":
            out = [f"| 144 chips | step | MFU | {tail}", "|---|---|---|---|---|---|---|---|"]
        else:
            out = [
                f"| about $480/h | chips | step | MFU | {tail}",
                "|---|---|---|---|---|---|---|---|---|",
            ]
        for r in rows:
            name = _name(r["hardware"])
            if group == "chips144":
                cells = [f"{name}, {r['instances']} x {r['instance']}"]
            else:
                usd_h = float(r["usd_per_hour.on_demand"])
                cells = [f"{name}, {r['instances']} instances (${usd_h:.0f}/h)", str(r["chips"])]
            cells += [f"{float(r['step_time_s']):.2f} s", f"{float(r['mfu']):.1%}"]
            for c in cols:
                v = round(float(r[c]), digits[c])
                text = f"{v:.{digits[c]}f}"
                cells.append(f"**{text}**" if v == best[c] else text)
            out.append("| " + " | ".join(cells) + " |")
        return "\n".join(out)

    return compute


def hardware_intervals(group: str) -> Callable[[object], str]:
    """The Trn2 and H100 on-demand $/M-token intervals of the study's ``group``."""

    def compute(ctx: object = None) -> str:
        rows = hardware_rows(group)
        shown = []
        for hw in ("trn2", "h100"):
            r = rows[hw]
            step, usd = float(r["step_time_s"]), float(r["usd_per_million_tokens.on_demand"])
            low, high = float(r["step_low_s"]), float(r["step_high_s"])
            shown.append(f"{usd * low / step:.2f}-{usd * high / step:.2f}")
        return " against ".join(shown)

    return compute


def _better(group: str, hw: str, mode: str, ref: str = "h100") -> float:
    """``hw``'s price-performance against ``ref``: ref's $/M tokens over hw's, minus one."""
    rows = hardware_rows(group)
    key = f"usd_per_million_tokens.{mode}" if mode != "energy" else "kwh_per_million_tokens"
    return float(rows[ref][key]) / float(rows[hw][key]) - 1.0


def hardware_claims(ctx: object = None) -> str:
    """Trn2's price-performance against H100 under each pricing mode, Trn1's and B200's
    where a real discount or ownership moves them, and the energy per token (Markdown
    bullets)."""
    del ctx
    a, b = hardware_rows("chips144"), hardware_rows("usd480")

    def usd(rows: dict[str, dict[str, Any]], hw: str, mode: str = "on_demand") -> str:
        return f"{float(rows[hw][f'usd_per_million_tokens.{mode}']):.3f}"

    def pct(x: float) -> str:
        return f"{x:.0%}" if x >= 0 else f"{x:.0%} (worse)"

    def than(x: float) -> str:
        return f"{abs(x):.0%} {'better' if x >= 0 else 'worse'} than"

    def energy(group: str) -> str:
        x = 1.0 / (1.0 + _better(group, "trn2", "energy")) - 1.0
        return f"{abs(x):.0%} {'more' if x >= 0 else 'less'}"

    kwh = {hw: f"{float(a[hw]['kwh_per_million_tokens']):.2f}" for hw in ("trn2", "h100")}
    return "\n".join(
        [
            f"- *On demand* it is **{pct(_better('chips144', 'trn2', 'on_demand'))}** at 144 "
            f"chips ({usd(a, 'h100')} against {usd(a, 'trn2')} $/M tokens) and "
            f"**{pct(_better('usd480', 'trn2', 'on_demand'))}** at about $480/h "
            f"({usd(b, 'h100')} against {usd(b, 'trn2')}).",
            "- *Reserved* and *capacity block*: the same again, only because neither Trn2 "
            "nor p5 has a published rate, so both take the same default fraction of "
            "on-demand: under these modes the claim is a statement about the two "
            "discounts. Trn1 shows what one real discount does: "
            f"{than(_better('chips144', 'trn1', 'on_demand'))} H100 on demand, and at its "
            f"published reserved rate ({usd(a, 'trn1', 'reserved')} $/M tokens) "
            f"{than(_better('chips144', 'trn1', 'reserved'))} H100 reserved at 144 chips.",
            f"- *Owned*: **{pct(_better('chips144', 'trn2', 'owned'))}** at 144 chips and "
            f"**{pct(_better('usd480', 'trn2', 'owned'))}** at about $480/h. Trn2 uses "
            f"{energy('chips144')} energy per token than H100 at 144 chips ({kwh['trn2']} "
            f"against {kwh['h100']} kWh per million tokens) and {energy('usd480')} at about "
            f"$480/h. Owned, B200 is {than(_better('chips144', 'b200', 'owned'))} H100 at "
            f"144 chips and {than(_better('usd480', 'b200', 'owned'))} H100 at $480/h.",
        ]
    )


def study_wall(ctx: object = None) -> str:
    """Seconds the study's points took to simulate in one process."""
    del ctx
    return f"{_study()[1]:.0f} s"


_PAGE = ("docs/tutorials/trn2-vs-h100.md",)
_WALL_NOISE = 4.0  # a shared machine's load moves wall times several-fold: only 5x is stale
FIGURES: tuple[tuple[str, str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    ("hardware-table-chips144", "", hardware_table("chips144"), 0.0,
     "the hardware study at 144 chips, simulated afresh", _PAGE),
    ("hardware-table-usd480", "", hardware_table("usd480"), 0.0,
     "the hardware study at about $480/h, simulated afresh", _PAGE),
    ("hardware-intervals-chips144",
     r"At 144 chips the\s+on-demand\s+\$/M-token\s+intervals\s+are\s+"
     r"(\d+\.\d+-\d+\.\d+ against \d+\.\d+-\d+\.\d+)",
     hardware_intervals("chips144"), 0.0,
     "Trn2 and H100 $/M-token intervals of the hardware study at 144 chips", _PAGE),
    ("hardware-intervals-usd480",
     r"at\s+about\s+\$480/h,\s+(\d+\.\d+-\d+\.\d+ against \d+\.\d+-\d+\.\d+)",
     hardware_intervals("usd480"), 0.0, "the same at about $480/h", _PAGE),
    ("hardware-claims", "", hardware_claims, 0.0,
     "Trn2's price-performance against H100 under each pricing mode", _PAGE),
    ("hardware-study-wall", r"in one process takes about (\d+ s)", study_wall, _WALL_NOISE,
     "wall time of the study's 11 points simulated one after another", _PAGE),
)  # fmt: skip
