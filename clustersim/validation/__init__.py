"""Validation against published measurements and closed forms (``clustersim validate``).

    rows = validate()                    # every shipped reference
    rows = validate(only=names)          # rows by their name in references.yaml
    ok = passed(rows)

The reference set lives in ``references.yaml`` with a scenario file per
end-to-end row in ``references/``. End-to-end rows compare the simulated step
time with the one derived from the published throughput (MFU beside); analytic
rows compare collective times with their alpha-beta closed forms (``consistency``:
checks of the algorithms, not validation), measured rows compare them with nccom-test
and nccl-tests (``measured_collectives``), serving rows compare a ``clustersim serve``
run's p50 TTFT and TPOT with published serving measurements (``serving``), and checkpoint
intervals and the long-horizon failure model with Young's and Daly's closed forms. Validation
passes when every row is within its tolerance and the mean ``|error|`` of the
checked end-to-end rows is within :data:`MEAN_TOLERANCE`. A row marked
``status: known_gap`` (a mechanism the model lacks, named in its ``gap``) reports
its error and never fails.
"""

from __future__ import annotations

from collections.abc import Iterable

from clustersim.errors import ScenarioError
from clustersim.validation.analytic import closed_form_s
from clustersim.validation.parallel import Progress, Reference, Status, run_references
from clustersim.validation.rows import Row, references

__all__ = [
    "MEAN_TOLERANCE",
    "Row",
    "Status",
    "closed_form_s",
    "mean_training_error",
    "passed",
    "reference_names",
    "role_errors",
    "validate",
]

MEAN_TOLERANCE = 0.06
"""Bound on the mean |error| of the end-to-end training rows."""


def reference_names(*, quick: bool = False) -> list[str]:
    """Names of the shipped references; ``quick`` leaves out the slow end-to-end rows."""
    refs = references()
    training = [r.name for r in refs.training if not (quick and r.slow)]
    return [
        *training,
        *(r.name for r in refs.collectives),
        *(r.name for r in refs.measured_collectives),
        *(r.name for r in refs.reliability),
        *(r.name for r in refs.serving),
    ]


def validate(
    only: Iterable[str] | None = None,
    *,
    quick: bool = False,
    jobs: int = 1,
    progress: Progress | None = None,
) -> list[Row]:
    """Check the references named in ``only`` (default: all; ``quick``: the fast subset).

    An unknown name raises :class:`~clustersim.errors.ScenarioError` on ``--only``.
    ``jobs`` above 1 runs the references in that many worker processes at once
    (:mod:`clustersim.validation.parallel`); the rows are the same, in the same order.
    ``progress`` is called with the run's :class:`~clustersim.validation.parallel.Status`
    whenever a reference starts or finishes.
    """
    refs = references()
    wanted = reference_names(quick=quick)
    if only is not None:
        chosen = list(dict.fromkeys(only))
        for name in chosen:
            if name not in refs.names():
                valid = ", ".join(refs.names())
                raise ScenarioError("--only", name, f"unknown reference; valid: {valid}")
        wanted = [n for n in refs.names() if n in chosen]
    keep = set(wanted)
    every: list[Reference] = [
        *refs.training, *refs.collectives, *refs.measured_collectives, *refs.reliability,
        *refs.serving,
    ]  # fmt: skip
    return run_references([r for r in every if r.name in keep], jobs=jobs, progress=progress)


def mean_training_error(rows: Iterable[Row]) -> float | None:
    """Mean |error| of the checked end-to-end rows (known gaps left out), or None."""
    errors = [abs(r.error) for r in rows if r.kind == "training" and r.status != "known_gap"]
    return sum(errors) / len(errors) if errors else None


def role_errors(rows: Iterable[Row]) -> dict[str, dict[str, float]]:
    """Per role of the end-to-end rows: count, mean and max |error| (known gaps apart)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.kind != "training":
            continue
        key = "known_gap" if r.status == "known_gap" else r.role
        out.setdefault(key, {"rows": 0, "mean_abs_error": 0.0, "max_abs_error": 0.0})
        agg = out[key]
        agg["rows"] += 1
        agg["mean_abs_error"] += abs(r.error)
        agg["max_abs_error"] = max(agg["max_abs_error"], abs(r.error))
    for agg in out.values():
        agg["mean_abs_error"] /= agg["rows"]
    return out


def passed(rows: list[Row], *, whole_set: bool = True) -> bool:
    """Every row within tolerance, and (for the whole set or the quick set, not rows
    picked by name: ``whole_set`` False) the end-to-end rows' mean |error| within bound."""
    if not all(r.passed for r in rows):
        return False
    mean = mean_training_error(rows)
    return not whole_set or mean is None or mean <= MEAN_TOLERANCE
