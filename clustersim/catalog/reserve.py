"""HBM a rank holds besides the state the memory model counts (``memory.yaml``).

    r = runtime_reserve(chip)                 # the chip family's entry
    r.per_rank_bytes, r.per_communicator_bytes, r.fragmentation
    r.reserve_bytes(communicators=3)          # what one rank holds in all

On a GPU: the CUDA context and libraries, cuBLAS's workspaces and NCCL's buffers (one
set per communicator); on Trainium, the Neuron runtime's own memory. ``fragmentation``
is what the allocator holds beyond the dynamic memory (activations and what the
backward regenerates), as a fraction of it. A chip's ``memory`` keys (``cluster.chip.
memory`` in a scenario) replace the family's figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from pydantic import Field

from clustersim.catalog._strict import Strict
from clustersim.catalog.schema import Bytes, ChipSpec
from clustersim.catalog.shipped import load_yaml

__all__ = ["RuntimeReserve", "memory_file", "runtime_reserve"]


class _Figure(Strict):
    bytes: Bytes = Field(ge=0)
    source: str = Field(min_length=1)


class _Fraction(Strict):
    fraction: float = Field(ge=0, le=1, allow_inf_nan=False)
    source: str = Field(min_length=1)


class FamilyMemory(Strict):
    """One chip family's entry of ``memory.yaml``."""

    per_rank: dict[str, _Figure]
    per_communicator: dict[str, _Figure]
    fragmentation: _Fraction


@cache
def memory_file() -> dict[str, FamilyMemory]:
    """The shipped ``memory.yaml``, by chip family."""
    text = resources.files("clustersim.catalog").joinpath("memory.yaml").read_text("utf-8")
    data = load_yaml(text) or {}
    return {str(k): FamilyMemory.model_validate(v) for k, v in data.items()}


@dataclass(frozen=True)
class RuntimeReserve:
    """What each rank holds besides the counted state, and the allocator's fragmentation.

    ``parts`` names the per-rank figures (bytes); ``per_communicator_bytes`` is held once
    per communication group. A chip's ``memory.reserve_bytes`` is the whole reserve (no
    per-communicator part then)."""

    per_rank_bytes: float = 0.0
    per_communicator_bytes: float = 0.0
    fragmentation: float = 0.0
    parts: tuple[tuple[str, float], ...] = ()

    def reserve_bytes(self, communicators: int) -> float:
        """Bytes one rank in ``communicators`` groups of more than one rank holds."""
        return self.per_rank_bytes + communicators * self.per_communicator_bytes


def runtime_reserve(chip: ChipSpec) -> RuntimeReserve:
    """The reserve and fragmentation of ``chip``: its family's, with the chip's
    ``memory`` keys over them."""
    fam = memory_file().get(chip.family)
    if fam is None:
        base = RuntimeReserve()
    else:
        base = RuntimeReserve(
            per_rank_bytes=sum(f.bytes for f in fam.per_rank.values()),
            per_communicator_bytes=sum(f.bytes for f in fam.per_communicator.values()),
            fragmentation=fam.fragmentation.fraction,
            parts=tuple((name, f.bytes) for name, f in fam.per_rank.items()),
        )
    over = chip.memory
    if over.reserve_bytes is not None:
        base = RuntimeReserve(
            float(over.reserve_bytes), 0.0, base.fragmentation, (("reserve", over.reserve_bytes),)
        )
    if over.fragmentation is not None:
        base = RuntimeReserve(
            base.per_rank_bytes, base.per_communicator_bytes, over.fragmentation, base.parts
        )
    return base
