"""Trace records -> pandas DataFrames and files, written atomically."""

from clustersim.trace.frame import TRACE_COLUMNS, StageColumns, build_frame
from clustersim.trace.io import atomic_write_bytes, atomic_write_text, write_parquet

__all__ = [
    "TRACE_COLUMNS",
    "StageColumns",
    "atomic_write_bytes",
    "atomic_write_text",
    "build_frame",
    "write_parquet",
]
