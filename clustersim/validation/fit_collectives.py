"""Fit the communication runtime's fixed costs to measured collectives.

    python -m clustersim.validation.fit_collectives            # fit and print
    python -m clustersim.validation.fit_collectives --check    # exit 1 if the catalog differs

For one chip family (``trainium`` by default) the constants of the chip catalog's
``collectives`` block (:class:`~clustersim.catalog.schema.CollectiveCosts`) are
fitted by bounded least squares (``scipy.optimize.least_squares``) on every
``measured_collectives`` reference whose ``role`` is ``calibration`` and whose
instance has a chip of that family; ``hold-out`` rows are never read. The residual
of a size is ``log(simulated time / measured time)``, so every size weighs the
same whatever its magnitude. Each evaluation simulates each size once (about
0.05 s a size), so a fit takes well under a minute.

The constants are physical, shared by every chip of the family and every
collective: a launch per collective, a handshake per round, a ring's own handshake
per step, a posting cost per message, an extra posting cost per EFA message, the
fraction of EFA bandwidth a collective sustains, and the DMA engines that move one
message of a round that is not pipelined. None belongs to one row: each row's sizes
constrain several of them, and each of them is seen by several rows.

The launch is held (:data:`HELD`), read from the catalog and not moved: these rows
do not identify it. Only the smallest sizes see it (the 8-byte floor of the trn1
table, the 2 MiB halving-doubling of the Trn2 one), and each trades it against the
handshakes and posting costs of its rounds, so any launch from 0 to 420 us fits them
about equally well; at 420 us the ring step's handshake and the other rounds'
coincide, and below 0 it cannot go. Collectives inside a compiled program pay the
handshakes without the launch, and they separate the two:
``python -m clustersim.calibration.launch`` fits the launch on these rows, the
Trainium calibration step rows and the batch-1 decode rows of the serving
references together, refitting this module's constants at each launch.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from clustersim import catalog
from clustersim.validation.measured import point_time_s, simulate
from clustersim.validation.rows import MeasuredCollectiveRef, references

__all__ = ["PARAMETERS", "Fit", "fit", "main"]

PARAMETERS: tuple[tuple[str, float, float, float], ...] = (
    # name, lower bound, upper bound, scale (the unit the optimiser works in)
    ("step_s", 0.0, 2e-4, 1e-6),
    ("ring_step_s", 0.0, 2e-4, 1e-6),
    ("message_s", 0.0, 1e-4, 1e-6),
    ("efa_message_s", 0.0, 1e-3, 1e-6),
    ("efa_efficiency", 0.3, 1.0, 1.0),
    ("message_engines", 0.5, 16.0, 1.0),
)
"""The fitted fields of ``collectives``, with their bounds."""

HELD: tuple[str, ...] = ("launch_s",)
"""Fields the fit reads from the catalog and does not move: the measured rows do not
identify them (see the module doc)."""


@dataclass(frozen=True)
class Fit:
    family: str
    values: dict[str, float]
    rows: tuple[str, ...]
    residuals: dict[str, float]
    """Relative error of the simulated time per size, ``NAME@SIZE -> error``."""

    @property
    def rms(self) -> float:
        errors = np.asarray(list(self.residuals.values()))
        return float(np.sqrt(np.mean(errors**2))) if errors.size else 0.0


def _family_refs(family: str) -> list[MeasuredCollectiveRef]:
    out = []
    for ref in references().measured_collectives:
        chip = catalog.chip(catalog.instance(ref.instance).chip)
        if ref.role == "calibration" and chip.family == family:
            out.append(ref)
    return out


def _residuals(values: dict[str, float], refs: Sequence[MeasuredCollectiveRef]) -> dict[str, float]:
    out: dict[str, float] = {}
    for ref in refs:
        sims = simulate(ref, {"collectives": values})
        for point, sim in zip(ref.points, sims, strict=True):
            measured = point_time_s(ref, point, int(sim["ranks"]))
            out[f"{ref.name}@{point.size:.0f}"] = float(sim["time_s"]) / measured - 1.0
    return out


def fit(family: str = "trainium", held: dict[str, float] | None = None) -> Fit:
    """Fit :data:`PARAMETERS` on the family's calibration rows (deterministic), with the
    :data:`HELD` fields at the catalog's values or at ``held``'s."""
    refs = _family_refs(family)
    if not refs:
        raise ValueError(f"no calibration rows of measured collectives for family {family!r}")
    names = [p[0] for p in PARAMETERS]
    scale = np.asarray([p[3] for p in PARAMETERS])
    lo = np.asarray([p[1] for p in PARAMETERS]) / scale
    hi = np.asarray([p[2] for p in PARAMETERS]) / scale
    start = np.clip(np.asarray([5e-6, 5e-6, 2e-6, 10e-6, 0.9, 2.0]) / scale, lo, hi)

    fixed = {n: v for n, v in _shipped(family).items() if n in HELD}
    held = {**fixed, **{n: v for n, v in (held or {}).items() if n in HELD}}

    def values_of(x: np.ndarray) -> dict[str, float]:
        return {**held, **{n: float(v) for n, v in zip(names, x * scale, strict=True)}}

    def fun(x: np.ndarray) -> np.ndarray:
        res = _residuals(values_of(x), refs)
        out: np.ndarray = np.log1p(np.asarray(list(res.values())))
        return out

    result = least_squares(fun, start, bounds=(lo, hi), diff_step=[1e-3] * len(names))
    values = values_of(result.x)
    return Fit(family, values, tuple(r.name for r in refs), _residuals(values, refs))


def _shipped(family: str) -> dict[str, float]:
    for name in catalog.names("chips"):
        chip = catalog.chip(name)
        if chip.family == family:
            c = chip.collectives
            return {n: float(getattr(c, n)) for n in (*HELD, *(p[0] for p in PARAMETERS))}
    raise ValueError(f"no chip of family {family!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clustersim.validation.fit_collectives")
    parser.add_argument("--family", default="trainium")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the catalog's constants differ"
    )
    args = parser.parse_args(argv)
    result = fit(args.family)
    print(f"family {result.family}; rows: {', '.join(result.rows)}")
    for name, value in result.values.items():
        print(f"  {name:15s} {value:.4g}")
    for row, err in result.residuals.items():
        print(f"  {row:40s} {err:+.1%}")
    print(f"  rms {result.rms:.1%}")
    if args.check:
        shipped = _shipped(args.family)
        off = {
            n: (shipped[n], v)
            for n, v in result.values.items()
            if n not in HELD and not math.isclose(shipped[n], v, rel_tol=0.02, abs_tol=2e-7)
        }
        for n, (have, want) in off.items():
            print(f"catalog {n} = {have:.4g}, fit gives {want:.4g}", file=sys.stderr)
        return 1 if off else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
