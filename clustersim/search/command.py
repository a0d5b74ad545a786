"""``clustersim search``: load, search, write the table, print the best layouts."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rich.console import Console

from clustersim.progress import Bar
from clustersim.scenario import load_scenario
from clustersim.search.present import counts_line, search_table
from clustersim.search.run import search, write_search
from clustersim.terminal import console

__all__ = ["search_command"]


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return slug[:80] or "scenario"


class _Bar:
    """A progress bar over the simulated candidates, on stderr."""

    def __init__(self, console: Console) -> None:
        self.bar = Bar(console, eta=True, template="simulating {task.description}")

    def __call__(self, done: int, total: int, label: str) -> None:
        self.bar.update(done, total, label)

    def close(self) -> None:
        self.bar.close()


def search_command(args: argparse.Namespace) -> int:
    sets = [*args.sets, *([f"chip_model={args.chip_model}"] if args.chip_model else [])]
    res = load_scenario(args.scenario, sets)
    res.require_training("search")
    err = console(stderr=True)
    bar = None if args.json else _Bar(err)
    try:
        result = search(
            res,
            chips=args.chips,
            objective=args.objective,
            simulate=args.simulate,
            progress=bar,
        )
    finally:
        if bar is not None:
            bar.close()
    out = args.out or Path("reports") / f"{_slug(result.scenario)}-search"
    paths = write_search(out, result)
    if args.json:
        meta = result.meta()
        meta["top"] = json.loads(result.top(args.top).to_json(orient="records"))
        meta["files"] = [str(p) for p in paths]
        print(json.dumps(meta, indent=2))
        return 0
    con = console()
    con.print(counts_line(result), markup=False, highlight=False)
    con.print(search_table(result, args.top))
    con.print(f"full table: {paths[0]} ({paths[1].name}, {paths[2].name})", markup=False)
    return 0
