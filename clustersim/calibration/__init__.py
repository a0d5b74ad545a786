"""Calibration: fits of each chip family's declared constants, and users' own measurements.

- ``fit``: bounded least squares (scipy) on the closed-form estimate, per chip
  family and software stack, on the reference rows whose role is calibration;
- ``measurements``: parsers of nccl-tests and nccom-test output and of a CSV of
  measured step times;
- ``user``: fits to a user's cluster, written as a catalog overlay;
- ``command``: ``clustersim calibrate``.

The declared constants, the shipped fits and the error bars they imply live in
``catalog/calibration.yaml`` and ``catalog.fits``.
"""

from __future__ import annotations

from clustersim.calibration.fit import FitResult, FitRow, fit_group, fit_references
from clustersim.calibration.measurements import (
    CollectivePoint,
    parse_nccl_tests,
    parse_nccom_test,
    parse_step_times,
)

__all__ = [
    "CollectivePoint",
    "FitResult",
    "FitRow",
    "fit_group",
    "fit_references",
    "parse_nccl_tests",
    "parse_nccom_test",
    "parse_step_times",
]
