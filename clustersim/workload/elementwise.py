"""The elementwise ops of a transformer layer: their ``Work``, and how many kernels run them.

The fused lowering (every stack's by default) runs each elementwise op as one kernel
(Megatron-Core's and Transformer Engine's fused kernels): ``norm_work``,
``residual_work``, ``rope_work`` and ``activation_work`` are those kernels, and the
backward of each costs twice its forward (``templates.twice``). An ``Elementwise``
overrides that per op name with a list of kernels, forward and backward; ``FUSED``
overrides nothing. torchtitan's eager and compiled kernels (``workload.titan``) are such
overrides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from clustersim.hardware.work import Work
from clustersim.workload.dims import Dims
from clustersim.workload.templates import ACT_BYTES, Tpl, compute, twice

__all__ = [
    "FUSED",
    "Elementwise",
    "Kernels",
    "activation_work",
    "norm_work",
    "residual_work",
    "rope_work",
]

Kernels = tuple[tuple[str, Work], ...]
"""The kernels that run one op, in order: (name, work)."""


def norm_work(dm: Dims, rows: int) -> Work:
    """One norm over ``rows`` tokens: 3 vector ops per element for RMSNorm (square-sum,
    scale, weight), 5 for LayerNorm, one scalar rsqrt per row; HBM reads and writes the
    activation and reads the weights."""
    elems = rows * dm.hidden
    ops_per_elem = 5 if dm.layernorm else 3
    weights = dm.hidden * (2 if dm.layernorm else 1)
    return Work(
        vector_ops=float(ops_per_elem * elems),
        scalar_ops=float(rows),
        hbm_bytes=float(ACT_BYTES * (2 * elems + weights)),
    )


def residual_work(rows: int, hidden: int) -> Work:
    """The residual add: reads both operands, writes the sum."""
    elems = rows * hidden
    return Work(vector_ops=float(elems), hbm_bytes=float(3 * ACT_BYTES * elems))


def rope_work(dm: Dims) -> Work:
    """RoPE on the rank's query and key heads: x*cos + rotate(x)*sin (3 vector ops an
    element); reads q and k and the cos and sin tables, writes q and k."""
    T, d = dm.tokens, dm.head_dim
    elems = T * (dm.heads_local + dm.kv_heads_local) * d
    return Work(vector_ops=float(3 * elems), hbm_bytes=float(ACT_BYTES * (2 * elems + 2 * T * d)))


def activation_work(elems: int, swiglu: bool) -> Work:
    """The MLP activation over ``elems`` outputs of the up projection's width."""
    if swiglu:  # silu(gate) on the scalar engine, times up on the vector engine
        return Work(
            scalar_ops=float(elems),
            vector_ops=float(elems),
            hbm_bytes=float(3 * ACT_BYTES * elems),
        )
    return Work(scalar_ops=float(elems), hbm_bytes=float(2 * ACT_BYTES * elems))


@dataclass(frozen=True)
class Elementwise:
    """How a layer's elementwise ops run, by op name (``attn.norm``, ``attn.split``,
    ``attn.rope``, ``attn.residual``, ``mlp.norm``, ``mlp.act``, ``mlp.up.sum``,
    ``mlp.residual``): ``fwd`` and ``bwd`` give an op's kernels where they are not the
    fused lowering's one kernel (an empty tuple: no kernel of its own, fused into
    another). ``split_up``: the MLP's gate and up projections are two linears (w1 and
    w3), not one of twice the width."""

    fwd: Mapping[str, Kernels] = field(default_factory=dict)
    bwd: Mapping[str, Kernels] = field(default_factory=dict)
    split_up: bool = False
    name: str = "fused"

    def forward(self, op: str, phase: str, work: Work | None) -> list[Tpl]:
        """The forward kernels of ``op``; by default ``work`` as one kernel (none if None)."""
        kernels = self.fwd.get(op)
        if kernels is None:
            return [] if work is None else [compute(op, phase, work)]
        return [compute(name, phase, w) for name, w in kernels]

    def backward(self, op: str, phase: str, work: Work | None) -> list[Tpl]:
        """The backward kernels of ``op``; by default one kernel of twice ``work``."""
        kernels = self.bwd.get(op)
        if kernels is None:
            return [] if work is None else [compute(op, phase, twice(work))]
        return [compute(name, phase, w) for name, w in kernels]


FUSED = Elementwise()
"""The fused lowering: one kernel per elementwise op, its backward twice its forward."""
