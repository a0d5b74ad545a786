"""Rank numbering, groups, and every invalid layout naming its key path."""

from __future__ import annotations

from typing import Any

import pytest

from clustersim.catalog.schema import MoESpec
from clustersim.errors import ScenarioError
from clustersim.scenario.models import ParallelismCfg, TrainingCfg
from clustersim.workload import Layout, make_layout, validate

from .helpers import llama3_8b, setup, tiny


def _layout(**kw: int) -> Layout:
    sizes = {"tp": 4, "pp": 2, "dp": 3, "cp": 2, "ep": 1, "ranks_per_chip": 4}
    sizes.update(kw)
    ranks = sizes["tp"] * sizes["pp"] * sizes["dp"] * sizes["cp"]
    return Layout(ranks=ranks, **sizes)


def test_coords_megatron_order_and_inverse() -> None:
    lay = _layout()
    assert lay.coords(0) == (0, 0, 0, 0)
    assert lay.coords(1) == (1, 0, 0, 0)  # tp varies fastest
    assert lay.coords(4) == (0, 1, 0, 0)  # then cp
    assert lay.coords(8) == (0, 0, 1, 0)  # then dp
    assert lay.coords(24) == (0, 0, 0, 1)  # then pp
    for rank in range(lay.ranks):
        assert lay.rank_of(*lay.coords(rank)) == rank
        assert lay.stage(rank) == lay.coords(rank)[3]
        assert lay.chip_of(rank) == rank // 4


def test_groups() -> None:
    lay = _layout()
    assert lay.group("tp", 5) == (4, 5, 6, 7)
    assert lay.group("cp", 5) == (1, 5)
    assert lay.group("dp", 5) == (5, 13, 21)
    assert lay.group("pp", 5) == (5, 29)
    for name, size in (("tp", 4), ("cp", 2), ("dp", 3), ("pp", 2)):
        groups = lay.groups(name)
        assert len(groups) == lay.ranks // size
        assert sorted(r for g in groups for r in g) == list(range(lay.ranks))
        for g in groups:
            assert all(lay.group(name, r) == g for r in g)
            index = {"tp": 0, "cp": 1, "dp": 2, "pp": 3}[name]
            coords = [lay.coords(r) for r in g]
            assert [c[index] for c in coords] == list(range(size))
            others = {c[:index] + c[index + 1 :] for c in coords}
            assert len(others) == 1
    with pytest.raises(ValueError, match="valid: tp, cp, dp, pp"):
        lay.group("xx", 0)
    with pytest.raises(ValueError, match="out of range"):
        lay.coords(lay.ranks)


def test_tp_group_is_on_one_chip_when_it_fits() -> None:
    lay = _layout(tp=4, ranks_per_chip=4)
    for g in lay.groups("tp"):
        assert len({lay.chip_of(r) for r in g}) == 1


def test_ep_groups_are_consecutive_dp_indices() -> None:
    lay = _layout(tp=2, cp=1, dp=4, pp=1, ep=2)
    assert lay.group("ep", 0) == (0, 2)
    assert lay.group("ep", 4) == (4, 6)
    assert lay.groups("ep") == [(0, 2), (1, 3), (4, 6), (5, 7)]


def test_make_layout_fills_dp() -> None:
    lay = make_layout(ParallelismCfg(tp=8, pp=2), 64, 4)
    assert (lay.tp, lay.pp, lay.dp, lay.cp, lay.ranks) == (8, 2, 4, 1, 64)
    assert lay.chips == 16


def test_make_layout_dp_mismatch_says_what_fits() -> None:
    with pytest.raises(ScenarioError) as err:
        make_layout(ParallelismCfg(tp=8, dp=4), 64, 4)
    assert err.value.path == "parallelism.dp"
    assert (
        "tp*pp*dp*cp = 8*1*4*1 = 32 but the cluster has 64 ranks (16 chips x 4 ranks per chip); "
        "set parallelism.dp: 8 or omit dp to fill" in str(err.value)
    )


def test_make_layout_dp_mismatch_not_divisible() -> None:
    with pytest.raises(ScenarioError, match="does not divide 60 either") as err:
        make_layout(ParallelismCfg(tp=8, dp=4), 60, 4)
    assert err.value.path == "parallelism.dp"


@pytest.mark.parametrize(
    ("kw", "path"),
    [({"tp": 3}, "parallelism.tp"), ({"tp": 4, "cp": 3}, "parallelism.cp"),
     ({"tp": 4, "pp": 3}, "parallelism.pp")],
)  # fmt: skip
def test_make_layout_unfillable_blames_the_size(kw: dict[str, int], path: str) -> None:
    with pytest.raises(ScenarioError, match="does not divide the cluster's 64 ranks") as err:
        make_layout(ParallelismCfg(**kw), 64, 4)
    assert err.value.path == path
    with pytest.raises(ScenarioError, match=r"tp\*pp\*cp = 8\*2\*1 = 16 does not divide") as err:
        make_layout(ParallelismCfg(tp=8, pp=2), 40, 4)
    assert err.value.path == "parallelism.pp"


def test_make_layout_ep_must_divide_dp() -> None:
    with pytest.raises(ScenarioError) as err:
        make_layout(ParallelismCfg(tp=8, ep=3), 32, 4)
    assert err.value.path == "parallelism.ep"


def test_valid_layouts_pass() -> None:
    model = llama3_8b()
    # tp > kv_heads replicates KV heads; seq_len beyond max_seq_len is allowed;
    # the vocabulary (128256) is padded rather than rejected.
    par, train, lay = setup(64, tp=16, seq_len=16384, global_batch_size=16)
    validate(model, par, train, lay)
    par, train, lay = setup(64, tp=4, pp=4, cp=2, global_batch_size=16)
    validate(model, par, train, lay)


def _expect(path: str, match: str, model: Any = None, ranks: int = 64, **kw: Any) -> None:
    seq = kw.pop("seq_len", 256)
    gbs = kw.pop("global_batch_size", 64)
    par = ParallelismCfg(**kw)
    lay = make_layout(par, ranks, 4)
    train = TrainingCfg(seq_len=seq, global_batch_size=gbs)
    with pytest.raises(ScenarioError, match=match) as err:
        validate(model or tiny(), par, train, lay)
    assert err.value.path == path


def test_heads_not_divisible_by_tp() -> None:
    _expect("parallelism.tp", "8 attention heads", tiny(), ranks=48, tp=3)


def test_kv_heads_incompatible_with_tp() -> None:
    model = tiny(heads=12, kv_heads=4, hidden=768, ffn_hidden=1536)
    _expect("parallelism.tp", "4 KV heads", model, ranks=48, tp=6)


def test_ffn_not_divisible_by_tp() -> None:
    _expect("parallelism.tp", "MLP width 1004", tiny(ffn_hidden=1004), tp=8)


def test_layers_not_divisible_by_pp() -> None:
    _expect("parallelism.pp", "8 layers, not divisible by pp", tiny(), ranks=48, pp=3)


def test_global_batch_not_divisible() -> None:
    _expect(
        "training.global_batch_size",
        r"dp\*microbatch_size = 16\*2 = 32",
        tiny(),
        tp=4,
        microbatch_size=2,
        global_batch_size=48,
    )


def test_seq_len_with_sequence_parallel() -> None:
    _expect("training.seq_len", r"tp\*cp", tiny(), tp=4, cp=2, seq_len=260)


def test_seq_len_with_cp_only() -> None:
    kw = {"tp": 4, "cp": 2, "seq_len": 257, "sequence_parallel": False}
    _expect("training.seq_len", "multiple of cp = 2", tiny(), **kw)


def test_moe_layout_checks() -> None:
    moe = MoESpec(experts=8, top_k=2, expert_ffn_hidden=1024)
    _expect("parallelism.ep", "at most", tiny(moe=moe), tp=1, ep=16)
    moe6 = MoESpec(experts=6, top_k=2, expert_ffn_hidden=1024)
    _expect("parallelism.ep", "split evenly", tiny(moe=moe6), tp=1, ep=4)
    _expect("parallelism.etp", "expert width", tiny(moe=moe), tp=1, etp=3, ranks=48)
    _expect(
        "parallelism.sequence_parallel",
        "sequence parallelism",
        tiny(moe=moe),
        tp=2,
        sequence_parallel=False,
    )


def test_ep_on_dense_model_rejected() -> None:
    _expect("parallelism.ep", "needs a MoE model", tiny(), tp=4, ep=2)


def test_uneven_stages_split() -> None:
    from clustersim.workload.dims import stage_layer_counts

    assert stage_layer_counts(126, 16) == [7] + [8] * 14 + [7]
    assert stage_layer_counts(32, 4) == [8, 8, 8, 8]
    assert stage_layer_counts(10, 4) == [2, 3, 3, 2]
    assert stage_layer_counts(11, 4) == [2, 3, 3, 3]
    assert sum(stage_layer_counts(127, 16)) == 127
