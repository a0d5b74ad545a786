"""Hostile input never crashes the CLI: exit 2 with one line naming the key, fast.

Thousands of generated cases mutate the TINY scenario and the shipped scenarios
(see ``tests/strategies.py``) and drive them through ``clustersim check`` and
``clustersim run``. Each test runs at its default size and, marked ``slow``, at ten
times that (``pytest -m slow tests/robustness``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import strategies as hs
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustersim import units
from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario, resolve

from .harness import CASE_SECONDS, assert_contract, case_dir, check_summary, run_cli, write

SCALES = [pytest.param(1, id="default"), pytest.param(10, id="x10", marks=pytest.mark.slow)]
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]


def _examples(n: int, scale: int) -> Callable[[Any], Any]:
    return settings(max_examples=n * scale, suppress_health_check=_QUIET)


def _check(path: Path, *extra: str) -> str | None:
    outcome = run_cli(["check", str(path), *extra])
    return assert_contract(outcome)


def _run(path: Path, out: Path, *extra: str) -> tuple[int, str | None]:
    outcome = run_cli(["run", str(path), "--out", str(out), "--quiet", *extra])
    return outcome.rc, assert_contract(outcome)


@pytest.mark.parametrize("scale", SCALES)
def test_tree_mutations_check(scale: int) -> None:
    """Deleted, renamed, retyped and replaced keys and values, in every base scenario."""

    @_examples(800, scale)
    @given(case=hs.tree_mutations())
    def inner(case: tuple[str, Any, list[hs.Mutation]]) -> None:
        _name, tree, _mutations = case
        with case_dir() as d:
            _check(write(d, hs.dump(tree)))

    inner()


@pytest.mark.parametrize("scale", SCALES)
def test_bad_numbers_name_their_key(scale: int) -> None:
    """NaN, infinities, 1e308, 10**300, 1e-300 anywhere (in a file or through --set):
    the error names exactly that key, whatever its type and however deep."""

    @_examples(300, scale)
    @given(case=hs.number_mutations(), via_set=st.booleans())
    def inner(case: tuple[str, Any, hs.Path_, Any], via_set: bool) -> None:
        name, tree, path, value = case
        with case_dir() as d:
            if via_set:
                scenario = write(d, hs.BASE_TEXTS[name])
                text = hs.dump(value).removesuffix("\n...\n").strip()
                where = _check(scenario, "--set", f"{hs.dotted(path)}={text}")
            else:
                where = _check(write(d, hs.dump(tree)))
        assert where == hs.dotted(path)

    inner()


@pytest.mark.parametrize("scale", SCALES)
def test_text_mutations_check(scale: int) -> None:
    """Tags, aliases, bombs, deep nesting, control characters, garbage, truncation."""

    @_examples(500, scale)
    @given(case=hs.text_mutations())
    def inner(case: tuple[str, bytes]) -> None:
        _what, content = case
        with case_dir() as d:
            _check(write(d, content))

    inner()


@pytest.mark.parametrize("scale", SCALES)
def test_set_overrides_check(scale: int) -> None:
    """Hostile ``--set`` keys, values and syntax over the TINY scenario."""

    @_examples(300, scale)
    @given(sets=hs.set_overrides())
    def inner(sets: list[str]) -> None:
        with case_dir() as d:
            # --set=VALUE: a separate "-x" would be read by argparse as an option
            _check(write(d, hs.TINY), *(f"--set={s}" for s in sets))

    inner()


@pytest.mark.parametrize("scale", SCALES)
def test_resolve_api(scale: int) -> None:
    """``resolve(mapping)`` from Python, where values YAML cannot make (tuples, sets,
    bytes, Decimal, arbitrary objects) also arrive: ScenarioError or a result."""

    @_examples(300, scale)
    @given(case=hs.python_trees())
    def inner(case: tuple[str, Any, list[hs.Mutation]]) -> None:
        _name, tree, _mutations = case
        if not isinstance(tree, dict):
            return  # load_scenario refuses those before resolve
        try:
            resolve(tree)
        except ScenarioError as exc:
            assert len(str(exc).splitlines()) == 1, str(exc)

    inner()


def _small_enough(path: Path) -> bool:
    """True if a valid scenario simulates in about a second: few ranks x microbatches
    x layers x steps (the generated hostile numbers can make a valid, huge run)."""
    res = load_scenario(path)
    sc = res.scenario
    par, train = sc.parallelism, sc.training
    dp = res.ranks // (par.tp * par.pp * par.cp)
    microbatches = train.global_batch_size // max(dp * par.microbatch_size, 1)
    work = res.ranks * microbatches * res.model.layers / par.pp * train.steps
    return work <= 64 * 4 * 4 * 2 and sc.output.trace is False and sc.output.html is False


@pytest.mark.parametrize("scale", SCALES)
def test_tree_mutations_run(scale: int) -> None:
    """Mutations of SMALL through ``check`` and then ``run``: run fails wherever check
    does, with the same contract, and a valid run writes a finite summary."""

    @_examples(250, scale)
    @given(case=hs.tree_mutations(bases={"small": hs.SMALL_TREE}, max_mutations=2))
    def inner(case: tuple[str, Any, list[hs.Mutation]]) -> None:
        _name, tree, _mutations = case
        with case_dir() as d:
            scenario = write(d, hs.dump(tree))
            checked = run_cli(["check", str(scenario)])
            assert_contract(checked)
            if checked.rc == 0 and not _small_enough(scenario):
                return
            rc, _where = _run(scenario, d / "out")
            if checked.rc == 2:
                assert rc == 2
            elif rc == 0:
                check_summary(d / "out")

    inner()


@pytest.mark.parametrize("scale", SCALES)
def test_small_valid_variants_run(scale: int) -> None:
    """Valid small layouts: check and run agree, and every summary number is finite."""

    @_examples(40, scale)
    @given(tree=hs.small_valid_variants())
    def inner(tree: dict[str, Any]) -> None:
        with case_dir() as d:
            scenario = write(d, hs.dump(tree))
            checked = run_cli(["check", str(scenario)])
            assert_contract(checked)
            rc, _where = _run(scenario, d / "out")
            if checked.rc == 2:
                assert rc == 2
            elif rc == 0:
                check_summary(d / "out")

    inner()


# -- the bugs the generated cases found, pinned --------------------------------------------

SMALL_FLOW = hs.SMALL.replace(
    "cluster: {instance: trn2.48xlarge, count: 1}",
    "cluster: {instance: trn2.48xlarge, count: 1, CHIP}",
)


@pytest.mark.parametrize(
    ("content", "where", "phrase"),
    [
        # the unit regex backtracked polynomially: 10,000 digits took 9 s, 30,000 81 s
        (hs.TINY + "x: 1\n", "x", "unknown key"),
        (SMALL_FLOW.replace("CHIP", "chip: {hbm_bytes: '" + "1" * 30_000 + "#'}"),
         "cluster.chip.hbm_bytes", "characters"),
        # an int beyond any sane size in a free-form override
        (SMALL_FLOW.replace("CHIP", "chip: {hbm_bytes: " + "1" * 40 + "}"),
         "cluster.chip.hbm_bytes", "out of range"),
        # more digits than Python converts to int: ValueError inside the YAML loader
        (hs.TINY.replace("seed: 0", "seed: " + "9" * 5000), "scenario.yaml", "integer too large"),
        # a hex literal of 12,000 bits: loads, but no error message could print it
        (hs.TINY.replace("seed: 0", "seed: 0x" + "f" * 3000), "scenario.yaml", "integer too large"),
        # 1e308 is a string to YAML 1.1 and a float to pydantic: accepted, then inf downstream
        (SMALL_FLOW.replace("CHIP", "chip: {core: {vector_tflops: 1e308}}"),
         "cluster.chip.core.vector_tflops", "out of range"),
        (SMALL_FLOW.replace("CHIP", "chip: {hbm_bw_Bps: 1e-300}"),
         "cluster.chip.hbm_bw_Bps", "too close to zero"),
        (SMALL_FLOW.replace("CHIP", "prices_usd_per_hour: {on_demand: 1e308}"),
         "cluster.prices_usd_per_hour.on_demand", "out of range"),
        (hs.SMALL + "cost: {usd_per_instance_hour: 1.0e+300}\n", "cost.usd_per_instance_hour",
         "out of range"),
        (SMALL_FLOW.replace("CHIP", "chip: {hbm_bytes: .nan}"), "cluster.chip.hbm_bytes",
         "finite"),
        (SMALL_FLOW.replace("CHIP", "chip: {hbm_bytes: 1e300TB}"), "cluster.chip.hbm_bytes",
         "at most"),
        # 1-byte gradient buckets: billions of instructions, the machine ran out of memory
        (hs.SMALL.replace("zero: 1,", "zero: 1, grad_bucket_bytes: 1,"),
         "parallelism.grad_bucket_bytes", "greater than or equal"),
        # the error named cluster.fabric, a key that does not exist in a scenario
        (SMALL_FLOW.replace("CHIP", "neuronlink: {dims: 5}"), "cluster.neuronlink.dims", "tuple"),
        # the first member of the union was reported: "model.str: ... valid string"
        (hs.TINY.replace("{name: tiny,", "{name: tiny, 5: 5,"), "model.5", "keys must be strings"),
        (hs.TINY.replace(hs.TINY.splitlines()[3], "model: 5"), "model",
         "valid string or a valid dictionary"),
        # a line break in a name reached f-strings in messages: two lines on stderr
        (hs.TINY.replace("{name: tiny,", '{name: "a\\nb",'), "model.name", "line breaks"),
        (hs.TINY.replace("instance: trn2.48xlarge", 'instance: "trn2\\u2028"'),
         "cluster.instance", "line breaks"),
        # ReaderError's message spans two lines
        (hs.TINY.replace("name: tiny", "name: a\x00b"), "scenario.yaml", "'\\x00' is not allowed"),
        (hs.TINY.replace("name: tiny", 'name: "\\ud800"'), "scenario.yaml", "YAML error"),
        # expansion and nesting limits
        (hs.Bomb("laughs", 9).build(), "scenario.yaml", "aliases expand"),
        (hs.Bomb("laughs-in-override", 12).build(), "scenario.yaml", "aliases expand"),
        ("x: &a [*a]\n", "scenario.yaml", "refers to its own anchor"),
        (hs.Bomb("flow-depth", 100_000).build(), "scenario.yaml", "nesting depth"),
        (hs.Bomb("block-depth", 40).build(), "scenario.yaml", "nested deeper than"),
        (hs.Bomb("wide-list", 200_000).build(), "scenario.yaml", "more than 20,000 values"),
        (hs.Bomb("long-string", 4 * 2**20 + 1).build(), "scenario.yaml", "larger than 4 MiB"),
        # tags: one line, and a name for each
        (hs.TINY + "x: !!python/object/apply:os.system ['true']\n", "scenario.yaml",
         "!!python/object/apply:os.system is not allowed"),
        (hs.TINY + "x: !!set {a, b}\n", "scenario.yaml", "!!set is not allowed"),
        (hs.TINY + "<<: {seed: 1}\n", "scenario.yaml", "merge keys"),
        (b"\xff\xfename: x\n", "scenario.yaml", "not UTF-8"),
    ],
)  # fmt: skip
def test_found_bugs_stay_fixed(content: str | bytes, where: str, phrase: str) -> None:
    with case_dir() as d:
        outcome = run_cli(["check", str(write(d, content))])
    assert assert_contract(outcome) == where, str(outcome)
    assert outcome.rc == 2
    assert phrase in outcome.err, str(outcome)
    # A bomb that expands shows as minutes, not seconds: the harness's bound catches it
    # without failing on a loaded machine (2.2 s was seen for a plain refusal).
    assert outcome.seconds < CASE_SECONDS, str(outcome)


def test_units_refuse_ints_beyond_floats() -> None:
    """``float(10**400)`` raises OverflowError, which pydantic does not turn into an error."""
    with pytest.raises(units.UnitError, match="at most"):
        units.parse_bytes(10**400)


def test_timestamps_are_text() -> None:
    """``name: 2024-06-01`` is a name, not a date that fails validation."""
    res = load_scenario(hs.TINY.replace("name: tiny", "name: 2024-06-01"))
    assert res.scenario.name == "2024-06-01"


def test_surrogates_in_set_argument() -> None:
    """Undecodable bytes in argv arrive as lone surrogates."""
    with case_dir() as d:
        outcome = run_cli(["check", str(write(d, hs.TINY)), "--set", "name=\udcff"])
    assert assert_contract(outcome) == "--set name"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_endless_file_is_refused() -> None:
    outcome = run_cli(["check", "/dev/zero"])
    assert assert_contract(outcome) == "zero"
    assert "larger than 4 MiB" in outcome.err


def test_directory_is_refused(tmp_path: Path) -> None:
    outcome = run_cli(["check", str(tmp_path)])
    assert assert_contract(outcome) is not None


# -- bugs found outside the scenario loader, fixed: each a one-line reproducer ---------------

FIXED_ELSEWHERE = [
    pytest.param("chip: {calibration: {tile: [0, 0]}}", id="tile-0"),
    pytest.param("neuronlink: {dims: [-4, -4]}", id="negative-torus-dims"),
    pytest.param("neuronlink: {link_bw_Bps: 0}", id="zero-link-bandwidth"),
    pytest.param("chip: {dma_bw_Bps: 0}", id="zero-dma-bandwidth"),
    pytest.param("chip: {hbm_bw_Bps: 0}", id="zero-hbm-bandwidth"),
    pytest.param("collectives: {all_reduce: bogus}", id="unknown-algorithm"),
    pytest.param("collectives: {all_reduce: sharp}", id="sharp-on-trainium"),
    pytest.param("efa: {sharp: true}", id="sharp-switches-on-efa"),
]


@pytest.mark.parametrize("cluster_extra", FIXED_ELSEWHERE)
@pytest.mark.parametrize("command", ["check", "run"])
def test_fixed_elsewhere(cluster_extra: str, command: str) -> None:
    with case_dir() as d:
        scenario = write(d, SMALL_FLOW.replace("CHIP", cluster_extra))
        args = [command, str(scenario)]
        if command == "run":
            args += ["--out", str(d / "out"), "--quiet"]
        outcome = run_cli(args)
    assert assert_contract(outcome) is not None


def test_check_applies_the_work_guard() -> None:
    with case_dir() as d:
        scenario = write(d, SMALL_FLOW.replace("CHIP", "chip: {}"))
        outcome = run_cli(["check", str(scenario), "--set", "training.global_batch_size=80000000"])
    assert assert_contract(outcome) == "training"
    assert "over the limit" in outcome.err


def test_bases_are_valid() -> None:
    """The mutations start from valid scenarios (else every case would be trivially bad)."""
    for name, text in {**hs.BASE_TEXTS, "small": hs.SMALL}.items():
        assert load_scenario(text).scenario.name, name
        assert yaml.safe_load(hs.dump(hs.BASES.get(name, hs.SMALL_TREE))) is not None
