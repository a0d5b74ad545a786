"""Gradient buckets cut as Megatron-Core's gradient buffer cuts them, by hand count.

Whole parameters in reverse model order; a bucket closes after the parameter that
brings it to the bucket size; no bucket spans two model chunks; under the
distributed optimizer a tied model's shared embedding and LM head (pp > 1) each get a
bucket of their own; a routed experts' piece is one parameter per local expert.
"""

from __future__ import annotations

from clustersim.catalog.schema import MoESpec
from clustersim.workload import Kind, Phase, build_programs, grad_buckets

from .helpers import setup, tiny

MIB = 2**20
# tiny()'s bf16 gradient bytes per piece at tp 1 (hidden 512, ffn 1536, 8 + 2x4 heads of 64)
DOWN, UP, NORM = 1.5 * MIB, 3 * MIB, 1024
ATTN = 0.5 * MIB + 1 * MIB  # the output projection, then QKV
TABLE = 4 * MIB  # the embedding, and the LM head


def _sizes(*args: object, **kw: object) -> list[float]:
    return [float(b) for b in grad_buckets(*args, **kw)[1]]  # type: ignore[arg-type]


def test_a_tied_models_shared_embedding_gets_its_own_bucket_under_zero_1() -> None:
    model = tiny(tied_embeddings=True)
    par, train, lay = setup(8, pp=2, zero=1, grad_bucket_bytes=MIB)
    layer = [NORM + DOWN, UP, NORM + ATTN]  # the previous layer's attention norm opens it
    shared = _sizes(model, lay, 0, MIB, shared_embedding=True)
    assert shared == [DOWN, UP, NORM + ATTN, *layer * 3, NORM, TABLE]
    # DDP without the distributed optimizer: the embedding joins the open bucket
    assert _sizes(model, lay, 0, MIB) == [DOWN, UP, NORM + ATTN, *layer * 3, NORM + TABLE]
    # the LM head closes its bucket alone either way
    assert _sizes(model, lay, 1, MIB, shared_embedding=True)[:2] == [TABLE, NORM + DOWN]
    # the program reduce-scatters those buckets
    prog = build_programs(model, par, train, lay)[0]
    rs = [i.nbytes for i in prog.instrs if i.kind == Kind.ASYNC_COLLECTIVE]
    assert rs == shared
    assert all(i.phase == Phase.GRAD_SYNC for i in prog.instrs if i.kind == Kind.ASYNC_COLLECTIVE)


def test_no_bucket_spans_two_model_chunks() -> None:
    # pp 2 x vp 2 over 8 layers: stage 0 holds layers 0-1 (chunk 0) and 4-5 (chunk 1).
    _, _, lay = setup(8, pp=2, zero=1, virtual_stages=2, grad_bucket_bytes=MIB)
    one = [DOWN, UP, NORM + ATTN, NORM + DOWN, UP, NORM + ATTN]
    # chunk 1's gradients first (layers 5, 4): its last attention norm closes a bucket
    assert _sizes(tiny(), lay, 0, MIB) == [*one, NORM, *one, NORM + TABLE]


def test_routed_experts_are_one_parameter_per_local_expert() -> None:
    # 8 experts over ep 2: 4 per rank, each a 1 MiB down and a 2 MiB gate-and-up projection.
    moe = MoESpec(experts=8, top_k=2, expert_ffn_hidden=1024)
    model = tiny(layers=2, moe=moe)
    _, _, lay = setup(8, tp=1, ep=2, zero=1, grad_bucket_bytes=3 * MIB)
    # layer 1's four 1 MiB down projections, then its four 2 MiB up projections, then
    # layer 0's: (1+1+1) (1+2) (2+2) (2+1) (1+1+1) (2+2) (2+2)
    cut = [3 * MIB, 3 * MIB, 4 * MIB, 3 * MIB, 3 * MIB, 4 * MIB, 4 * MIB]
    assert _sizes(model, lay, 0, 3 * MIB, experts=True) == cut
    # (as one parameter per piece it would be 4, 8, 4, 8 MiB)
