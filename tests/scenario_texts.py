"""Scenario texts shared by the tests (importable: the tests directory is on sys.path)."""

from __future__ import annotations

TINY = """\
name: tiny
seed: 0
cluster: {instance: trn2.48xlarge, count: 1}
model: {name: tiny, layers: 4, hidden: 1024, heads: 8, kv_heads: 2, ffn_hidden: 4096, vocab: 8192}
parallelism: {tp: 4, pp: 2, zero: 1, schedule: 1f1b, recompute: selective}
training: {seq_len: 1024, global_batch_size: 32, steps: 1}
"""
