"""Failures: injection inside a step simulation, and the long-horizon reliability model.

The long-horizon model (``reliability``) simulates days to months of a training
job with failure processes per component class (``processes``, rates from
``presets/`` or the scenario), checkpoints, detection, restart, hot spares and a
recovery policy, at the step time the step simulation measured. ``studies``
runs it over seeds on a process pool and sweeps the checkpoint interval;
``analytic`` has the Young and Daly closed forms it is checked against.
"""

from clustersim.failures.analytic import (
    daly_interval,
    expected_ettr,
    expected_goodput,
    young_interval,
)
from clustersim.failures.jobs import JobSetup, build_job, component_counts, validate
from clustersim.failures.presets import preset, preset_names
from clustersim.failures.processes import FailureClass, resolve_classes, sample_failures
from clustersim.failures.reliability import JobModel, Outcome, simulate_job
from clustersim.failures.studies import (
    TIMELINE_FILE,
    add_reliability,
    checkpoint_study,
    evaluate,
    run_seeds,
    summarise,
    timeline_frame,
)

__all__ = [
    "TIMELINE_FILE",
    "FailureClass",
    "JobModel",
    "JobSetup",
    "Outcome",
    "add_reliability",
    "build_job",
    "checkpoint_study",
    "component_counts",
    "daly_interval",
    "evaluate",
    "expected_ettr",
    "expected_goodput",
    "preset",
    "preset_names",
    "resolve_classes",
    "run_seeds",
    "sample_failures",
    "simulate_job",
    "summarise",
    "timeline_frame",
    "validate",
    "young_interval",
]
