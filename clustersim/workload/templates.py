"""Instruction templates: what the lowering modules build and ``transformer`` stamps out.

A template is an instruction without its layer and microbatch; ``ops``, ``mla``,
``moe`` and ``cp_ring`` build them, and ``transformer`` stamps them out once per
layer and microbatch.
"""

from __future__ import annotations

from dataclasses import replace

from clustersim.hardware.work import Work
from clustersim.workload.program import Kind

__all__ = ["ACT_BYTES", "Tpl", "async_coll", "coll", "compute", "twice", "wait"]

ACT_BYTES = 2
"""Bytes per activation, gradient and weight element in HBM and on the wire (bf16)."""

Tpl = tuple[Kind, str, str, Work | None, str, str, float]
"""An instruction template: kind, name, phase, work, collective, group, nbytes."""


def compute(name: str, phase: str, work: Work) -> Tpl:
    return (Kind.COMPUTE, name, phase, work, "", "", 0.0)


def coll(group: str, collective: str, phase: str, nbytes: float, suffix: str = "") -> Tpl:
    """A blocking collective over ``group``."""
    name = f"{group}.{collective}{suffix}"
    return (Kind.COLLECTIVE, name, phase, None, collective, group, float(nbytes))


def async_coll(group: str, collective: str, phase: str, nbytes: float, suffix: str = "") -> Tpl:
    """A collective over ``group`` started without waiting (see :func:`wait`)."""
    name = f"{group}.{collective}{suffix}"
    return (Kind.ASYNC_COLLECTIVE, name, phase, None, collective, group, float(nbytes))


def wait(group: str, collective: str, phase: str, suffix: str = "") -> Tpl:
    """Wait for every ``collective`` of ``group`` started without waiting so far."""
    return (Kind.WAIT_ASYNC, f"{group}.wait{suffix}", phase, None, collective, group, 0.0)


def twice(work: Work) -> Work:
    """The backward of an elementwise op: twice the engine ops and HBM bytes."""
    return replace(
        work,
        vector_ops=2 * work.vector_ops,
        scalar_ops=2 * work.scalar_ops,
        gpsimd_ops=2 * work.gpsimd_ops,
        hbm_bytes=2 * work.hbm_bytes,
    )
