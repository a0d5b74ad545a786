"""Trace records and the link table -> pandas DataFrames and files, written atomically."""

from clustersim.trace.frame import TRACE_COLUMNS, StageColumns, build_frame
from clustersim.trace.io import atomic_write_bytes, atomic_write_text, write_parquet
from clustersim.trace.links import LINK_COLUMNS, LINK_TABLE, link_frame, write_link_table

__all__ = [
    "LINK_COLUMNS",
    "LINK_TABLE",
    "TRACE_COLUMNS",
    "StageColumns",
    "atomic_write_bytes",
    "atomic_write_text",
    "build_frame",
    "link_frame",
    "write_link_table",
    "write_parquet",
]
