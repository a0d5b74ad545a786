"""Start-up costs what the command needs: each subcommand imports its own modules.

Each check runs in a fresh interpreter and reads ``sys.modules`` after the command
ran, so an import added at the top of ``cli.py`` (or of anything it pulls in) fails
here rather than slowing every command down.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import contextlib, io, json, sys
from clustersim.cli import main
argv = json.loads(sys.argv[1])
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main(argv)
    except SystemExit as exc:  # --help exits through argparse
        code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules), "stdout": out.getvalue()}))
"""


def _loaded(*argv: str) -> tuple[int, set[str], str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(argv))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return int(data["code"] or 0), set(data["modules"]), str(data["stdout"])


def _under(modules: set[str], *prefixes: str) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_help_loads_nothing_of_the_simulator() -> None:
    code, modules, out = _loaded("--help")
    assert code == 0
    assert "collective" in out
    heavy = _under(
        modules, "numpy", "pandas", "pydantic", "yaml", "rich", "scipy", "matplotlib", "simpy"
    )
    assert heavy == []
    ours = {m for m in modules if m.startswith("clustersim")}
    assert ours <= {
        "clustersim",
        "clustersim._version",
        "clustersim.cli",
        "clustersim.cli_args",
        "clustersim.errors",
        "clustersim.units",
    }


def test_collective_loads_neither_the_reliability_model_nor_pandas_nor_matplotlib() -> None:
    code, modules, out = _loaded(
        "collective", "--instance", "trn2.48xlarge", "--size", "1MiB", "--json"
    )
    assert code == 0
    rows = json.loads(out)
    assert rows[0]["size_bytes"] == 2**20
    assert "clustersim.network.microbench" in modules
    unwanted = _under(
        modules,
        "clustersim.failures",
        "clustersim.sim",
        "clustersim.report",
        "clustersim.sweep",
        "clustersim.search",
        "clustersim.validation",
        "pandas",
        "matplotlib",
    )
    assert unwanted == []


def test_names_spelled_in_the_parser_match_their_sources() -> None:
    from clustersim import catalog, cli_args
    from clustersim.cli_args import CATALOG_KINDS, RELIABILITY_FILES
    from clustersim.failures import TIMELINE_FILE
    from clustersim.failures.command import RESULT_FILE
    from clustersim.sweep import guard

    assert (*catalog.KINDS, "stacks") == CATALOG_KINDS
    assert cli_args.STUDY_MAX_EVENTS == guard.STUDY_MAX_EVENTS
    assert (RESULT_FILE, TIMELINE_FILE) == RELIABILITY_FILES
