"""Megatron-Core's bucketing rule (``grad_bucketing: first_chunk``), by hand count.

Only the first pipeline stage's first model chunk cuts its gradients into buckets;
every other chunk's gradients are one bucket, reduced once the chunk's last
microbatch backward has produced them all.
"""

from __future__ import annotations

import pytest

from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.workload import Kind, Phase, build_programs, first_chunk_buckets, microbatches

from .helpers import setup, tiny
from .test_grad_buckets import ATTN, DOWN, MIB, NORM, TABLE, UP

LAYER = NORM + DOWN + UP + NORM + ATTN  # one layer's gradient bytes at tp 1


def _buckets(stage: int, rule: str) -> list:  # type: ignore[type-arg]
    par, train, lay = setup(8, pp=2, zero=1, virtual_stages=2, grad_bucket_bytes=MIB)
    par = par.model_copy(update={"grad_bucketing": rule})
    prog = build_programs(tiny(), par, train, lay)[stage]
    return [i for i in prog.instrs if i.kind == Kind.ASYNC_COLLECTIVE]


def test_pp2_vp2_counts_the_bucket_collectives_of_each_rank() -> None:
    # pp 2 x vp 2 over 8 layers: stage 0 holds layers 0-1 (chunk 0) and 4-5 (chunk 1),
    # stage 1 layers 2-3 (chunk 0) and 6-7 with the final norm and the LM head (chunk 1).
    one = [DOWN, UP, NORM + ATTN, NORM + DOWN, UP, NORM + ATTN]
    # stage 0: chunk 1 whole, then chunk 0 cut at 1 MiB as before: 1 + 7 collectives
    assert [b.nbytes for b in _buckets(0, "first_chunk")] == [
        2 * LAYER,
        *one,
        NORM + TABLE,
    ]
    # stage 1: one bucket per chunk, 2 collectives. every_chunk cuts chunk 1 into the
    # head, 6 of its two layers and the last norm (8), and chunk 0 into 7: 15.
    head = TABLE + NORM  # the LM head and the final norm
    assert [b.nbytes for b in _buckets(1, "first_chunk")] == [head + 2 * LAYER, 2 * LAYER]
    assert len(_buckets(1, "every_chunk")) == 15
    assert len(_buckets(0, "every_chunk")) == 14  # 6 + 1 and 6 + 1
    # the same bytes either way
    for stage in (0, 1):
        whole = sum(b.nbytes for b in _buckets(stage, "first_chunk"))
        assert whole == sum(b.nbytes for b in _buckets(stage, "every_chunk"))


def test_a_whole_chunk_starts_after_its_last_backward() -> None:
    par, train, lay = setup(8, pp=2, zero=1, virtual_stages=2, grad_bucket_bytes=MIB)
    par = par.model_copy(update={"grad_bucketing": "first_chunk"})
    last = microbatches(par, train, lay) - 1
    prog = build_programs(tiny(), par, train, lay)[1]
    instrs = prog.instrs
    at = [n for n, i in enumerate(instrs) if i.kind == Kind.ASYNC_COLLECTIVE]
    # chunk 1's bucket right after layer 6's first piece (its attention norm), in the
    # last microbatch's backward of that chunk; chunk 0's after layer 2's
    for n, layer in zip(at, (6, 2), strict=True):
        before = instrs[n - 1]
        assert (before.name, before.layer, before.microbatch) == ("attn.norm", layer, last)
        assert instrs[n].microbatch == last
    # the last one starts when the stage's backward is over: no compute of it follows
    assert not any(i.phase == Phase.BACKWARD and i.kind == Kind.COMPUTE for i in instrs[at[-1] :])


@pytest.mark.parametrize("zero", [2, 3])
def test_sharded_gradients_keep_their_own_units(zero: int) -> None:
    par, _, _ = setup(8, zero=zero)
    assert not first_chunk_buckets(par.model_copy(update={"grad_bucketing": "first_chunk"}))


def test_every_chunk_is_the_default_and_first_chunk_is_a_key() -> None:
    base = """\
name: t
cluster: {instance: p5.48xlarge, count: 1}
model: llama3-8b
parallelism: {tp: 8%s}
training: {seq_len: 8192, global_batch_size: 64}
"""
    assert load_scenario(base % "").scenario.parallelism.grad_bucketing == "every_chunk"
    named = load_scenario(base % ", grad_bucketing: first_chunk").scenario.parallelism
    assert named.grad_bucketing == "first_chunk"
    assert first_chunk_buckets(named)
    with pytest.raises(ScenarioError) as bad:
        load_scenario(base % ", grad_bucketing: first")
    assert bad.value.path == "parallelism.grad_bucketing"


@pytest.mark.parametrize("zero", [0, 1])
def test_without_overlap_each_chunk_is_reduced_after_the_whole_backward(zero: int) -> None:
    # Megatron-LM as of SC'21: each chunk's gradient buffer reduced once, after the
    # forward-backward of all microbatches (overlap_grad_reduce: false).
    par, train, lay = setup(8, pp=2, zero=zero, virtual_stages=2, grad_bucket_bytes=MIB)
    par = par.model_copy(update={"overlap_grad_reduce": False})
    for prog in build_programs(tiny(), par, train, lay):
        instrs = prog.instrs
        at = [n for n, i in enumerate(instrs) if i.kind == Kind.ASYNC_COLLECTIVE]
        sizes = [instrs[n].nbytes for n in at]
        head = 0.0 if prog.stage == 0 else TABLE + NORM  # the LM head and final norm
        embed = TABLE if prog.stage == 0 else 0.0
        assert sizes == [2 * LAYER + head, 2 * LAYER + embed]  # chunk 1, then chunk 0
        backward = [n for n, i in enumerate(instrs) if i.phase == Phase.BACKWARD]
        assert at[0] > backward[-1]  # after every backward op
        assert instrs[at[-1] + 1].name == "dp.wait"
