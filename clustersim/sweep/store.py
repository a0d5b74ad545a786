"""The study directory: its marker, one file per finished point, ``results.parquet``.

Every file is written atomically (a temporary file renamed into place), so a
study killed at any moment leaves whole point files or none: a rerun trusts
every ``points/<id>.json`` it finds and runs the rest. ``results.parquet`` is
removed when a study starts and rebuilt from the point files when it ends, so
its presence says the study finished. A lock (``lockf`` on ``.lock``, released by
the kernel even on SIGKILL) keeps two sweeps out of one directory.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustersim._version import __version__
from clustersim.errors import ScenarioError
from clustersim.sweep.axes import ID_CHARS, Point
from clustersim.sweep.spec import Study, axis_size
from clustersim.trace.io import atomic_write_text, write_parquet

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MARKER",
    "POINTS_DIR",
    "RESULTS",
    "StudyStore",
    "flatten",
    "results_frame",
]

MARKER = "study.json"
POINTS_DIR = "points"
RESULTS = "results.parquet"
RETRIED_KINDS = frozenset({"worker"})
"""Failures a rerun tries again: a lost worker says nothing about the point itself."""
LEAD_COLUMNS = ("point", "index")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys; lists become JSON text."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list | tuple):
        out[prefix] = json.dumps(value)
    else:
        out[prefix] = value
    return out


def _valid_id(name: str) -> bool:
    stem = name.removesuffix(".json")
    head = stem.split("-", 1)[0]
    return (
        name.endswith(".json")
        and len(head) == ID_CHARS
        and all(c in "0123456789abcdef" for c in head)
    )


class StudyStore:
    """One study's output directory."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.points_dir = out / POINTS_DIR
        self._lock: Any = None

    # -- guard and lock -------------------------------------------------------------

    def open(self, study: Study, points: Sequence[Point], *, force: bool) -> None:
        """Check the directory is this study's (or new), lock it, write the marker."""
        out = self.out
        if out.exists() and not out.is_dir():
            raise ScenarioError("--out", str(out), "output path exists and is not a directory")
        previous = self.previous_name()
        if not force:
            if previous is not None and previous != study.name:
                raise ScenarioError(
                    "--out",
                    str(out),
                    f"holds the results of study {previous!r}, not {study.name!r}; "
                    "choose another --out or pass --force",
                )
            if previous is None and (out / "summary.json").exists():
                raise ScenarioError(
                    "--out",
                    str(out),
                    "holds the results of a `clustersim run`; choose another --out or pass --force",
                )
        out.mkdir(parents=True, exist_ok=True)
        self.points_dir.mkdir(exist_ok=True)
        self._acquire()
        if force and previous is not None and previous != study.name:
            for path in self.points_dir.glob("*.json"):  # another study's points
                path.unlink()
        (out / RESULTS).unlink(missing_ok=True)  # rebuilt at the end
        atomic_write_text(out / MARKER, json.dumps(self.marker(study, points), indent=2) + "\n")

    def previous_name(self) -> str | None:
        try:
            data = json.loads((self.out / MARKER).read_text("utf-8"))
        except (OSError, ValueError):
            return None
        name = data.get("study") if isinstance(data, dict) else None
        return name if isinstance(name, str) else None

    def _acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return
        fh = (self.out / ".lock").open("a")
        try:
            # A POSIX record lock belongs to this process: forked pool workers do not
            # inherit it, so a worker outliving a killed sweep cannot keep the study locked.
            fcntl.lockf(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise ScenarioError(
                "--out", str(self.out), "another sweep is writing to this directory"
            ) from None
        self._lock = fh
        # Leftovers of a sweep killed while writing a point; no writer can hold them now.
        for tmp in self.points_dir.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    @staticmethod
    def marker(study: Study, points: Sequence[Point]) -> dict[str, Any]:
        spec = study.spec
        return {
            "study": study.name,
            "description": spec.description,
            "base": study.base_label,
            "points": len(points),
            "axes": [
                {"kind": a.kind, "keys": a.varied_keys(), "size": axis_size(a)} for a in spec.axes
            ],
            "set": spec.set,
            "run": spec.run.model_dump(mode="json"),
            "report": spec.report.model_dump(mode="json"),
            "clustersim_version": __version__,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    # -- points -----------------------------------------------------------------------

    def finished(self, *, retry_failed: bool = False) -> dict[str, dict[str, Any]]:
        """The point records on disk, by id, that a rerun does not run again."""
        done: dict[str, dict[str, Any]] = {}
        if not self.points_dir.is_dir():
            return done
        for path in self.points_dir.iterdir():
            if not _valid_id(path.name):
                continue
            try:
                record = json.loads(path.read_text("utf-8"))
            except (OSError, ValueError):
                continue  # unreadable: run the point again
            if not isinstance(record, dict) or record.get("id") != path.stem:
                continue
            if record.get("status") == "failed" and (
                retry_failed or record.get("error_kind") in RETRIED_KINDS
            ):
                continue
            done[path.stem] = record
        return done

    def save(self, point: Point, record: dict[str, Any], study: Study) -> dict[str, Any]:
        """Persist one finished point at once (atomically); return the stored record."""
        full = {
            "id": point.id,
            "index": point.index,
            "study": study.name,
            "overrides": list(point.overrides),
            "values": point.values,
            **{k: v for k, v in record.items() if k != "id"},
        }
        text = json.dumps(full, indent=1, allow_nan=True, default=str) + "\n"
        atomic_write_text(self.points_dir / f"{point.id}.json", text)
        return full

    # -- results ----------------------------------------------------------------------

    def write_results(
        self, points: Sequence[Point], records: Mapping[str, dict[str, Any]], study: Study
    ) -> pd.DataFrame:
        frame = results_frame(points, records, study)
        write_parquet(self.out / RESULTS, frame)
        return frame


def results_frame(
    points: Sequence[Point], records: Mapping[str, dict[str, Any]], study: Study
) -> pd.DataFrame:
    """One row per point of the study that has a record, in study order."""
    import pandas as pd

    axis_keys = [k for a in study.spec.axes for k in a.varied_keys()]
    tokens = study.spec.report.train_tokens
    rows: list[dict[str, Any]] = []
    for p in points:
        rec = records.get(p.id)
        if rec is None:
            continue
        row: dict[str, Any] = {"point": p.id, "index": p.index}
        row.update({k: p.values.get(k) for k in axis_keys})
        row["status"] = rec.get("status", "failed")
        row["error"] = rec.get("error")
        summary = rec.get("summary") or {}
        for k, v in flatten(summary).items():
            row.setdefault(k, v)  # an axis value (seed, say) is the same value
        if tokens is not None:
            tps = summary.get("tokens_per_s")
            row["time_to_train_h"] = tokens / tps / 3600.0 if tps else math.nan
        row["point_wall_s"] = rec.get("wall_s")
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=[*LEAD_COLUMNS, *axis_keys, "status", "error"])
    for col in frame.columns:
        frame[col] = _arrow_safe(frame[col])
    return frame


def _arrow_safe(col: pd.Series[Any]) -> pd.Series[Any]:
    """A column Parquet can store: values of mixed types (``choice: [4096, auto]``) or
    mappings become text."""
    kinds = {type(v) for v in col if v is not None and not (isinstance(v, float) and math.isnan(v))}
    numeric = {int, float, bool}
    if len(kinds) <= 1 and not (kinds & {dict, list}):
        return col
    if kinds <= numeric and bool not in kinds:
        return col.astype("float64")
    return col.map(lambda v: None if v is None else (v if isinstance(v, str) else json.dumps(v)))
