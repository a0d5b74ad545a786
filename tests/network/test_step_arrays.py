"""Algorithms' array forms give the steps of their tuple forms, pair for pair."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from clustersim.network import GroupInfo, collective_steps
from clustersim.network.collectives import collective_step_arrays


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize(
    ("name", "info"),
    [
        ("halving_doubling", GroupInfo.flat(2)),
        ("halving_doubling", GroupInfo.flat(64)),
        # 4 domains of 8 ranks, 2 per chip: the phases across run halving-doubling or rings.
        (
            "hierarchical",
            GroupInfo(tuple(r // 2 for r in range(32)), tuple(r // 8 for r in range(32))),
        ),
    ],
)
@pytest.mark.parametrize("nbytes", [8.0, 4e6, 512e6])
def test_array_form_equals_the_steps(op: str, name: str, info: GroupInfo, nbytes: float) -> None:
    steps = collective_steps(op, info.p, nbytes, name, info)
    arrays = collective_step_arrays(op, info.p, nbytes, name, info)
    assert len(arrays) == len(steps) > 0
    for step, (bare, pairs) in zip(steps, arrays, strict=True):
        assert bare == replace(step, pairs=())
        np.testing.assert_array_equal(pairs, np.asarray(step.pairs, dtype=np.int64).reshape(-1, 2))
