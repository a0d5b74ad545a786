"""torchtitan's per-op selective checkpointing (``recompute_policy: op``): what it keeps.

The policy (``workload.recompute``'s module doc has its source) counts a block's
``aten.mm`` calls from 1 and saves the output of each odd one; the even ones rerun in
the backward. ``block_matmuls`` lists a dense block's matmuls in the order its forward
calls them, ``op_split`` applies the count, and ``op_activation_bytes`` is what a block
keeps, per microbatch and rank, in BF16 (2 B an element):

- the block's input, the checkpoint's (2*T_sp*h);
- each saved matmul's output (2*rows*n; a row-parallel one's is its partial sum over
  the whole sequence, T x h on every TP rank);
- the attention kernel's outputs: O (2*T*a*d) and its FP32 log-sum-exp (4*T*a);
- under sequence parallelism with tp > 1, each row-parallel matmul's reduce-scatter
  output (2*T_sp*h): ``reduce_scatter_tensor`` is on the save list whether or not its
  matmul is.

With T = b*s/cp tokens, T_sp = T/tp under sequence parallelism, a and g the query and
key-value heads on the rank, d the head width, f the MLP width on the rank.

The matmul order is that of torchtitan's Llama blocks with separate ``wq``, ``wk`` and
``wv`` linears, as its published runs of 2024-2025 built them: wq, wk, wv, wo, w1, w3, w2,
so wk, wo and w3 rerun. torchtitan 0.3.0 builds one fused ``wqkv`` by default
(``pytorch/torchtitan@v0.3.0:torchtitan/models/llama3/__init__.py``, ``fuse_qkv``): its
count is wqkv, wo, w1, w3, w2, so wo and w3 rerun and the saved projection is all of
q, k and v (a few percent of a block's recomputed FLOPs and kept bytes apart); not
modelled apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.workload.dims import Dims

__all__ = ["Matmul", "block_matmuls", "op_activation_bytes", "op_split"]


@dataclass(frozen=True)
class Matmul:
    """One linear layer's forward GEMM: ``rows`` x ``k`` by ``k`` x ``n``, on one rank."""

    name: str
    rows: int
    k: int
    n: int
    row_parallel: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.k * self.n


def block_matmuls(dm: Dims) -> list[Matmul]:
    """A dense block's matmuls in forward order, as torchtitan's Llama calls them: wq, wk,
    wv, wo, then w1, w3, w2 (SwiGLU) or w1, w2 (GeLU)."""
    T, h, d = dm.tokens, dm.hidden, dm.head_dim
    g = dm.kv_heads_local * d
    f = dm.ffn_local
    mlp = [Matmul("mlp.w1", T, h, f)]
    if dm.swiglu:
        mlp.append(Matmul("mlp.w3", T, h, f))
    mlp.append(Matmul("mlp.w2", T, f, h, row_parallel=True))
    return [
        Matmul("attn.q", T, h, dm.attn_cols),
        Matmul("attn.k", T, h, g),
        Matmul("attn.v", T, h, g),
        Matmul("attn.out", T, dm.attn_cols, h, row_parallel=True),
        *mlp,
    ]


def op_split(dm: Dims) -> tuple[list[Matmul], list[Matmul]]:
    """The block's matmuls the policy keeps (odd counts) and those that rerun (even)."""
    mms = block_matmuls(dm)
    kept = [m for i, m in enumerate(mms, start=1) if i % 2]
    rerun = [m for i, m in enumerate(mms, start=1) if not i % 2]
    return kept, rerun


def op_activation_bytes(dm: Dims) -> int:
    """Bytes one block keeps for its backward under the op policy (module doc)."""
    T, Ts, h = dm.tokens, dm.sp_tokens, dm.hidden
    kept, _ = op_split(dm)
    total = 2 * Ts * h  # the block's input
    total += sum(2 * m.rows * m.n for m in kept)
    total += 2 * T * dm.attn_cols + 4 * T * dm.heads_local  # O and the log-sum-exp
    if dm.tp > 1 and dm.sequence_parallel:  # wo's and w2's reduce-scatter outputs
        total += 2 * 2 * Ts * h
    return total
