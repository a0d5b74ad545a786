"""The README's figures and references stay true: every section it points to exists,
it names no file the repository lacks, and the layout search's best row is what
the simulator gives for that layout today."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clustersim.scenario import load_scenario
from clustersim.sim import simulate

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
HEADINGS = [m.group(1).strip() for m in re.finditer(r"^#{2,3} (.+)$", README, re.M)]


def test_every_section_it_points_to_exists() -> None:
    pointers = set(re.findall(r"\bsee ([A-Z][A-Za-z]+(?: [a-z]+)*)", README))
    assert pointers, "the README points to no section: the pattern needs updating"
    missing = sorted(p for p in pointers if not any(h.startswith(p) for h in HEADINGS))
    assert not missing, f"the README points to sections it lacks: {missing}"


def test_every_file_it_names_exists() -> None:
    named = set(re.findall(r"`((?:clustersim|scenarios|docs|tests)/[\w./-]+)`", README))
    named |= set(re.findall(r"\b([A-Z]+\.md)\b", README))
    missing = sorted(n for n in named if "*" not in n and not (ROOT / n).exists())
    assert not missing, f"the README names files the repository lacks: {missing}"


def test_the_layout_search_best_row() -> None:
    # README, "Layout search": row 1 of the search of the shipped 70B scenario.
    row = re.search(r"^ 1 +1 +1 +32 +8 +3 +32 +2 +full +1f1b +([\d.]+) +([\d.]+)%", README, re.M)
    assert row is not None, "the README's search table changed: update this test with it"
    sets = [
        "parallelism.tp=1", "parallelism.pp=1", "parallelism.cp=8", "parallelism.zero=3",
        "parallelism.dp_shard=32", "parallelism.recompute=full", "parallelism.microbatch_size=2",
    ]  # fmt: skip
    res = load_scenario(ROOT / "scenarios" / "trn2-ultraserver-llama3-70b.yaml", sets)
    summary = simulate(res, record=False, fidelity="folded").summary  # as the search runs it
    assert summary["step_time_s"] == pytest.approx(float(row.group(1)), abs=5e-4)
    assert 100 * summary["mfu"] == pytest.approx(float(row.group(2)), abs=0.05)
