"""Injected failures in trace.json: the ``failures`` process, its events, times and names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clustersim.trace.chrome import write_chrome_trace
from clustersim.trace.injections import injection_events, injection_label

Traced = Any  # tests/trace/conftest.py: frame, layout, summary

LANE = {
    "index": 0, "at_s": 0.002, "target": "lane", "name": "chip0<->chip1", "kind": "down",
    "factor": None, "applied_s": 0.002, "detected_s": 0.003,
    "effect": "last lane lost, link down; detected, rerouted at 3 ms",
}  # fmt: skip
STRAGGLE = {
    "index": 1, "at_s": 0.004, "target": "chip", "name": "chip5", "kind": "straggle",
    "factor": 1.5, "applied_s": 0.004, "detected_s": None, "effect": "compute x1.5 from now",
}  # fmt: skip
LATE = {
    "index": 2, "at_s": 100.0, "target": "instance", "name": "instance0", "kind": "down",
    "factor": None, "applied_s": None, "detected_s": None, "effect": "",
}  # fmt: skip
RECORDS = [LANE, STRAGGLE, LATE]


def _write(traced: Traced, path: Path, **kw: Any) -> dict[str, Any]:
    write_chrome_trace(path, traced.frame, traced.layout, chip_name="trn2", **kw)
    return json.loads(path.read_text())


def _failures_pid(trace: dict[str, Any]) -> int:
    (pid,) = [
        e["pid"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"] == "failures"
    ]
    return int(pid)


def test_labels_name_the_target_kind_and_factor() -> None:
    assert injection_label(LANE) == "lane chip0<->chip1 down"
    assert injection_label(STRAGGLE) == "chip5 straggle 1.5"
    assert injection_label(LATE) == "instance0 down"


def test_each_injection_on_its_thread_at_the_time_it_applied(
    traced: Traced, tmp_path: Path
) -> None:
    trace = _write(traced, tmp_path / "trace.json", injections=RECORDS)
    pid = _failures_pid(trace)
    events = trace["traceEvents"]
    threads = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e["pid"] == pid and e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert threads == {1: "inject.0: lane chip0<->chip1 down", 2: "inject.1: chip5 straggle 1.5"}
    sort = [e for e in events if e["pid"] == pid and e["name"] == "process_sort_index"]
    assert sort[0]["args"]["sort_index"] < 0  # above the chips and the steps
    drawn = [e for e in events if e.get("cat") == "failure"]
    instants = {e["tid"]: e for e in drawn if e["ph"] == "i"}
    assert set(instants) == {1, 2}
    assert instants[1]["ts"] == 2000.0 and instants[1]["name"] == "lane chip0<->chip1 down"
    assert instants[2]["ts"] == 4000.0 and instants[2]["name"] == "chip5 straggle 1.5"
    for rec, e in ((LANE, instants[1]), (STRAGGLE, instants[2])):
        assert e["pid"] == pid and e["s"] == "t"
        assert {k: e["args"][k] for k in rec} == rec
    # The dead link's stall, from the failure to the reroute, as a slice of its own.
    (stall,) = [e for e in drawn if e["ph"] == "X"]
    assert (stall["tid"], stall["ts"], stall["dur"]) == (1, 2000.0, 1000.0)
    assert stall["name"] == "stalled until reroute"
    assert stall["args"]["stall_s"] == 0.003 - 0.002
    # Injections the run never reached are not drawn, and otherData says so.
    assert trace["otherData"]["injections"] == 3
    assert trace["otherData"]["injections_not_reached"] == "2"
    chips = {int(c) for c in traced.frame["chip"].unique()}
    assert pid not in chips


def test_failed_step_is_marked(traced: Traced, tmp_path: Path) -> None:
    down = {**LATE, "index": 0, "at_s": 0.001, "applied_s": 0.001, "effect": "step failed"}
    failed = {"at_s": 0.001, "step": 0, "cause": "instance0 down", "injection": 0}
    trace = _write(traced, tmp_path / "trace.json", injections=[down], step_failed=failed)
    pid = _failures_pid(trace)
    marks = [e for e in trace["traceEvents"] if e.get("cat") == "failure" and e["tid"] == 0]
    (mark,) = marks
    assert mark["pid"] == pid and mark["ph"] == "i" and mark["ts"] == 1000.0
    assert mark["name"] == "step 0 failed: instance0 down"
    assert mark["args"] == {"step": 0, "cause": "instance0 down", "injection": 0, "at_s": 0.001}


def test_deterministic_and_unchanged_without_injections(traced: Traced, tmp_path: Path) -> None:
    a, b, plain, empty = (tmp_path / f"{n}.json" for n in ("a", "b", "plain", "empty"))
    _write(traced, a, injections=RECORDS)
    _write(traced, b, injections=list(reversed(RECORDS)))
    assert a.read_bytes() == b.read_bytes()
    _write(traced, plain)
    _write(traced, empty, injections=[], step_failed=None)
    assert plain.read_bytes() == empty.read_bytes()
    assert b'"failures"' not in plain.read_bytes()
    assert injection_events([], None, pid=99) == []
    assert injection_events([LATE], None, pid=99) == []  # nothing applied: nothing to draw
