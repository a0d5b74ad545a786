"""trace.json in Chrome Trace Event format: fields, nesting, flows, counters, caps."""

from __future__ import annotations

import bisect
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from clustersim.trace.chrome import (
    ChromeTraceInfo,
    p2p_pairs,
    representative_ranks,
    write_chrome_trace,
)
from clustersim.workload import Layout

Traced = Any  # tests/trace/conftest.py: frame, layout, summary

REQUIRED = ("name", "ph", "ts", "pid", "tid")


def _write(traced: Traced, path: Path, **kw: Any) -> tuple[ChromeTraceInfo, dict[str, Any]]:
    info = write_chrome_trace(
        path,
        traced.frame,
        traced.layout,
        memory_gib_per_chip=traced.summary["memory_gib_per_chip"],
        chip_name="trn2",
        **kw,
    )
    return info, json.loads(path.read_text())


@pytest.fixture(scope="module")
def full(traced: Traced, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every rank of the tiny run, so flows and collectives are complete."""
    path = tmp_path_factory.mktemp("chrome") / "trace.json"
    return _write(traced, path, max_ranks=traced.layout.ranks)[1]


def test_every_event_has_the_required_fields(full: dict[str, Any]) -> None:
    events = full["traceEvents"]
    assert events
    for e in events:
        missing = [k for k in REQUIRED if k not in e]
        assert not missing, (missing, e)
        assert isinstance(e["ts"], int | float)
        if e["ph"] == "X":
            assert e["dur"] >= 0
    assert set(Counter(e["ph"] for e in events)) <= {"X", "M", "C", "s", "t", "f"}
    assert full["displayTimeUnit"] == "ms"


def test_one_process_per_chip_and_named_threads(full: dict[str, Any], traced: Traced) -> None:
    meta = [e for e in full["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    chips = set(traced.frame["chip"].unique().tolist())
    assert chips <= set(procs)
    assert all(procs[c] == f"chip {c} (trn2)" for c in chips)
    threads = {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert "rank 0: tensor" in threads
    assert "rank 0: tp comm" in threads
    assert "rank 0: p2p" in threads  # the tiny scenario has two pipeline stages
    x_threads = {(e["pid"], e["tid"]) for e in full["traceEvents"] if e["ph"] == "X"}
    named = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert x_threads - {(max(procs), 0)} <= named  # every op thread has a name


def test_timestamps_are_microseconds(full: dict[str, Any], traced: Traced) -> None:
    xs = [e for e in full["traceEvents"] if e["ph"] == "X" and e.get("cat") != "step"]
    end_us = max(e["ts"] + e["dur"] for e in xs)
    assert end_us == pytest.approx(traced.frame["end_s"].max() * 1e6, abs=0.01)
    assert len(xs) == len(traced.frame)  # every op of every rank


def test_slices_nest_on_every_thread(full: dict[str, Any]) -> None:
    """Perfetto drops slices that overlap without nesting: none may."""
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in full["traceEvents"]:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for key, slices in by_thread.items():
        slices.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[float] = []
        for start, end in slices:
            while open_ends and open_ends[-1] <= start + 1e-9:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-6, (key, start, end)
            open_ends.append(end)


def test_flows_link_sends_to_receives_and_collective_members(full: dict[str, Any]) -> None:
    events = full["traceEvents"]
    flows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ph"] in "stf":
            flows[e["id"]].append(e)
    cats = Counter(f[0]["cat"] for f in flows.values())
    assert cats["p2p"] > 0 and cats["collective"] > 0
    for chain in flows.values():
        phases = [e["ph"] for e in chain]
        assert phases[0] == "s" and phases[-1] == "f" and set(phases[1:-1]) <= {"t"}
    # Every flow event binds to a slice on its thread (it lies inside one).
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for s in slices.values():
        s.sort()
    for chain in flows.values():
        for e in chain:
            s = slices[(e["pid"], e["tid"])]
            i = bisect.bisect_right(s, (e["ts"], float("inf"))) - 1
            assert i >= 0 and s[i][0] <= e["ts"] <= s[i][1] + 1e-6, e


def test_counters_for_hbm_and_communication(full: dict[str, Any], traced: Traced) -> None:
    counters = [e for e in full["traceEvents"] if e["ph"] == "C"]
    names = {e["name"] for e in counters}
    assert "HBM GiB (modelled)" in names
    assert {"tp comm GB/s", "dp comm GB/s", "pp comm GB/s"} <= names
    mem = traced.summary["memory_gib_per_chip"]
    hbm = [e for e in counters if e["name"] == "HBM GiB (modelled)"]
    peak = max(e["args"]["static"] + e["args"]["activations"] for e in hbm)
    assert peak == pytest.approx(mem["total"], rel=1e-4)
    assert all(v >= 0 for e in counters for v in e["args"].values())


def test_other_data_says_what_is_shown(full: dict[str, Any], traced: Traced) -> None:
    other = full["otherData"]
    assert other["ranks_total"] == traced.layout.ranks
    assert other["ops_shown"] == other["ops_total"] == len(traced.frame)
    assert other["capped"] is False


def test_caps_ranks_and_events(traced: Traced, tmp_path: Path) -> None:
    info, doc = _write(traced, tmp_path / "t.json")  # default: a few representative ranks
    assert 0 < len(info.ranks_shown) < traced.layout.ranks
    assert doc["otherData"]["capped"] is True
    assert "of 64 traced ranks" in doc["otherData"]["note"]
    info, doc = _write(traced, tmp_path / "t2.json", max_ranks=64, max_events=3000)
    assert len(doc["traceEvents"]) <= 3000
    assert info.events == len(doc["traceEvents"])
    assert doc["otherData"]["capped"] is True
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, nothing left behind


def test_representative_ranks_take_stages_in_turn() -> None:
    layout = Layout(tp=4, pp=2, dp=8, cp=1, ep=1, ranks=64, ranks_per_chip=4)
    assert representative_ranks(layout, 4) == [0, 1, 32, 33]
    assert representative_ranks(layout, 64) == list(range(64))
    assert representative_ranks(layout, 8, available=[0, 32]) == [0, 32]  # a folded trace


def test_p2p_pairs_match_each_receive_to_its_send(traced: Traced) -> None:
    frame, layout = traced.frame, traced.layout
    pairs = p2p_pairs(frame, layout)
    recvs = frame[frame["op"].astype(str).str.contains("recv")]
    assert len(pairs) == len(recvs)
    assert pairs["recv"].is_unique and pairs["send"].is_unique
    send, recv = frame.loc[pairs["send"]], frame.loc[pairs["recv"]]
    assert (send["microbatch"].to_numpy() == recv["microbatch"].to_numpy()).all()
    stage_s = send["rank"].map(layout.stage).to_numpy()
    stage_r = recv["rank"].map(layout.stage).to_numpy()
    acts = send["op"].astype(str).str.endswith("act").to_numpy()
    assert (stage_r[acts] == stage_s[acts] + 1).all()
    assert (stage_r[~acts] == stage_s[~acts] - 1).all()
    # Data cannot arrive before it is sent.
    assert (recv["end_s"].to_numpy() >= send["start_s"].to_numpy() - 1e-12).all()


def test_folded_trace_of_representatives(traced: Traced, tmp_path: Path) -> None:
    """A folded run traces one rank per stage; the writer shows what it has."""
    reps = traced.frame[traced.frame["rank"].isin([0, 32])].reset_index(drop=True)
    path = tmp_path / "folded.json"
    info = write_chrome_trace(path, reps, traced.layout, max_ranks=8)
    doc = json.loads(path.read_text())
    assert info.ranks_shown == (0, 32)
    assert any(e["ph"] == "s" and e["cat"] == "p2p" for e in doc["traceEvents"])
