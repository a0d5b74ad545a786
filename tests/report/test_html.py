"""report.html: self-contained, escapes user text, answers the headline questions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clustersim.report import comm_table, load_run
from clustersim.report.html import render_comparison, render_report

EVIL = "<script>alert(1)</script>"


def test_user_strings_are_escaped(tiny_run: Path) -> None:
    data = load_run(tiny_run)
    data.summary["scenario"] = EVIL
    data.resolved["description"] = '<img src=x onerror="alert(2)">'
    data.resolved_yaml = f"name: {EVIL}\n"
    page = render_report(data, [])
    assert "<script" not in page
    assert "onerror=" not in page.replace("onerror=&#34;", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x" not in page
    other = load_run(tiny_run, trace=False)
    cmp = render_comparison([data, other], [])
    assert "<script" not in cmp and "&lt;script&gt;" in cmp


def test_page_is_self_contained(tiny_run: Path) -> None:
    page = (tiny_run / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    srcs = re.findall(r'<img[^>]*\ssrc="([^"]*)"', page)
    assert len(srcs) >= 5
    assert all(s.startswith("data:image/png;base64,") and len(s) > 1000 for s in srcs)
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing from the network
    assert "<link" not in page and "@import" not in page and "url(" not in page


def test_page_answers_the_headline_questions(tiny_run: Path) -> None:
    data = load_run(tiny_run)
    page = (tiny_run / "report.html").read_text()
    s = data.summary
    exposed = 100 * s["breakdown_s"]["exposed_comm"] / s["step_time_s"]
    answer = re.search(r'<div class="answer" id="answer">(.*?)</div>', page, re.S)
    assert answer is not None
    text = answer.group(1)
    assert f"{exposed:.1f}%" in text
    assert f"${s['cost']['usd_per_million_tokens']:.3f}" in text
    for needle in ("MFU", "HFU", "tok/s", "memory per chip", "Largest exposed communication"):
        assert needle in page
    for pkg in ("clustersim", "python", "numpy", "pandas", "simpy", "matplotlib"):
        assert f"<th>{pkg}</th>" in page
    assert "resolved_scenario.yaml" in page and "seq_len" in page


def test_exposed_table_adds_up_to_the_summary(tiny_run: Path) -> None:
    """The per-op exposure from the trace reproduces the simulator's own accounting."""
    data = load_run(tiny_run)
    table = comm_table(data, top=None)
    assert table["exposed_s"].sum() == pytest.approx(
        data.summary["breakdown_s"]["exposed_comm"], rel=1e-6
    )
    hidden = table[table["op"] == "dp.reduce_scatter"]
    assert len(hidden) == 1 and hidden["exposed_s"].iloc[0] == 0.0  # overlapped with backward
    assert (table["bubble_s"] > 0).any()  # receives that waited for the previous stage
    top = comm_table(data)
    assert len(top) <= 10 and list(top["exposed_s"]) == sorted(top["exposed_s"], reverse=True)


def test_comparison_page(comparison: Path) -> None:
    page = (comparison / "report.html").read_text()
    pngs = sorted(comparison.glob("*.png"))
    assert "Comparison of 2 runs" in page
    assert page.count("data:image/png;base64,") == len(pngs) >= 4
    for row in ("step time", "MFU", "$ / million tokens", "tiny"):
        assert row in page
    assert "Cheapest per token" in page
