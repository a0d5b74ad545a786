"""Decode attention on a NeuronCore: instruction cycles from the catalog's engine facts."""

from __future__ import annotations

import math

import pytest

from clustersim import catalog
from clustersim.hardware.chip import ChipModel
from clustersim.serve.decode_attention import DecodeAttention
from clustersim.serve.iteration import IterationModel


def test_one_problem_is_its_engines_instructions_in_turn() -> None:
    """Trn1: Tensor 2.8 GHz, Vector 1.12 GHz, Scalar 1.4 GHz, 64-cycle start-up and
    minimum; 1,000 keys, 4 query heads on the KV head."""
    spec = catalog.chip("trn1")
    att = DecodeAttention(spec, 1, kv_heads=1, group=4)
    tensor = (2 * (64 + 512) + 2 * 8 * (64 + 128)) / 2.8e9
    vector, scalar = (1000 + 1000) / 1.12e9, 1000 / 1.4e9
    assert att.engines_s(1000) == pytest.approx((tensor, vector, scalar), rel=1e-12)
    assert att(1, 1000) == pytest.approx(tensor + vector + scalar, rel=1e-12)
    # further problems pipeline behind the busiest engine, dealt to a rank's cores
    busiest = max(tensor, vector, scalar)
    assert att(8, 1000) == pytest.approx(tensor + vector + scalar + 7 * busiest, rel=1e-12)
    two = DecodeAttention(spec, 2, kv_heads=2, group=4)
    assert two(4, 1000) == pytest.approx(tensor + vector + scalar + 3 * busiest, rel=1e-12)
    # short contexts pay the instruction minimum; none costs nothing
    assert att.engines_s(10)[2] == pytest.approx(64 / 1.4e9)
    assert att(0, 1000) == att(3, 0) == 0.0


def test_trainium_decode_steps_grow_with_the_batch_by_their_attention() -> None:
    spec = catalog.chip("trn1")
    model = catalog.model("llama3-8b")
    it = IterationModel(model, ChipModel(spec, 1), 32)
    assert it.decode_attention is not None
    att = it.decode_attention
    one = it.iteration_s((), 1, 2047, padded_decodes=1)
    eight = it.iteration_s((), 8, 8 * 2047, padded_decodes=8)
    extra = model.layers * (att(8, 2048) - att(1, 2048))
    assert eight - one >= extra
    assert math.isclose(att(1, 2048), sum(att.engines_s(2048)))


def test_gpus_price_decode_attention_as_its_kv_read_only() -> None:
    it = IterationModel(catalog.model("llama3-8b"), ChipModel(catalog.chip("h100"), 1), 1)
    assert it.decode_attention is None
