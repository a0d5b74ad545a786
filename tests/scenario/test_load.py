"""Scenario loading: validation errors name the key path and the bad value."""

from __future__ import annotations

import pytest

from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario

BASE = """\
name: t
cluster: {instance: trn2.48xlarge, count: 1}
model: llama3-8b
parallelism: {tp: 8}
training: {seq_len: 8192, global_batch_size: 64}
"""


def _err(text: str, *sets: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load_scenario(text, sets)
    return info.value


def test_valid_base() -> None:
    res = load_scenario(BASE)
    assert res.chips == 16
    assert res.ranks == 64
    assert res.lnc == 2
    assert res.model.layers == 32


def test_yaml_syntax_error_names_line() -> None:
    msg = str(_err(BASE.replace("parallelism: {tp: 8}", "parallelism: {tp: 8")))
    assert "YAML error at line 5" in msg


def test_duplicate_keys_rejected() -> None:
    assert "duplicate key 'model'" in str(_err(BASE + "model: llama3-70b\n"))


def test_unknown_key_suggests_closest() -> None:
    err = _err(BASE.replace("parallelism: {tp: 8}", "parallelism: {tpp: 8}"))
    assert err.path == "parallelism.tpp"
    assert "did you mean 'tp'" in str(err)


def test_unknown_top_level_key() -> None:
    err = _err(BASE + "trainig: {}\n")
    assert err.path == "trainig"
    assert "did you mean 'training'" in str(err)


def test_wrong_type() -> None:
    err = _err(BASE, "training.seq_len=long")
    assert err.path == "training.seq_len"
    assert "'long'" in str(err)


def test_out_of_range() -> None:
    err = _err(BASE, "parallelism.tp=0")
    assert err.path == "parallelism.tp"


def test_unknown_instance_lists_valid_names() -> None:
    err = _err(BASE, "cluster.instance=trn2.96xlarge")
    assert err.path == "cluster"
    assert "trn2.48xlarge" in str(err)


def test_unknown_model() -> None:
    err = _err(BASE, "model=llama9")
    assert err.path == "model"
    assert "llama3-8b" in str(err)


def test_set_overrides_and_inline_catalog_override() -> None:
    res = load_scenario(BASE, ["model.layers=16", "cluster.chip.hbm_bytes=64GiB"])
    assert res.model.layers == 16
    assert res.model.hidden == 4096
    assert res.chip.hbm_bytes == 64 * 2**30


def test_inline_override_bad_unit() -> None:
    err = _err(BASE, "cluster.chip.hbm_bytes=64GiBs")
    assert err.path == "cluster.chip.hbm_bytes"


def test_bad_set_syntax() -> None:
    assert _err(BASE, "novalue").path == "--set"


def test_lnc_must_be_supported() -> None:
    assert _err(BASE, "cluster.lnc=3").path == "cluster.lnc"


def test_empty_and_non_mapping() -> None:
    assert "empty" in str(_err("# nothing\n"))
    assert "mapping" in str(_err("- a\n- b\n"))


def test_python_tags_refused() -> None:
    err = _err(BASE + "x: !!python/object/apply:os.system ['echo hi']\n")
    assert "YAML error" in str(err)


def test_missing_file() -> None:
    with pytest.raises(ScenarioError, match="not found"):
        load_scenario("does-not-exist.yaml")
