"""Chips: cores with Tensor, Vector, Scalar and GPSIMD engines, and shared HBM."""

from clustersim.hardware.chip import HBM, RESOURCES, ChipModel, OpTime
from clustersim.hardware.work import ENGINES, Work

__all__ = ["ENGINES", "HBM", "RESOURCES", "ChipModel", "OpTime", "Work"]
