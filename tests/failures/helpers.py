"""A one-class job model whose closed forms are known."""

from __future__ import annotations

from clustersim.failures import FailureClass, JobModel


def one_class(
    mtbf_s: float,
    *,
    components: int = 1,
    shape: float = 1.0,
    effect: str = "job",
    repair_s: float = 0.0,
) -> FailureClass:
    return FailureClass("x", "cause x", "chip", components, mtbf_s, shape, repair_s, effect)


def job(
    mtbf_s: float,
    interval_s: float,
    write_s: float,
    restart_s: float,
    horizon_s: float,
    **kw: object,
) -> JobModel:
    """A job of 1 token per 1 s step, a single exponential class of job failures."""
    classes = kw.pop("classes", None) or (one_class(mtbf_s),)
    return JobModel(
        classes=classes,  # type: ignore[arg-type]
        step_time_s=1.0,
        tokens_per_step=1.0,
        interval_s=interval_s,
        write_s=write_s,
        read_s=0.0,
        restart_s=restart_s,
        horizon_s=horizon_s,
        **kw,  # type: ignore[arg-type]
    )
