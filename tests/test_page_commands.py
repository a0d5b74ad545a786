"""Every command a page shows runs, as a reader would run it from a fresh clone.

The commands are the ``clustersim ...`` and ``python -m clustersim...`` lines of the
code blocks of README.md and docs/ (a ``$`` prompt, ``\\`` continuations and trailing
comments allowed; ``pip install ... && clustersim run ...`` runs its clustersim part).
Each page runs in a copy of the repository's tracked files, in a temporary folder,
its commands in the order the page shows them, so that a page that writes a result
and then reads it works as written and nothing lands in the checkout (relative
``--out`` folders and the default ``reports/NAME`` are inside the copy). A code block
with a title (``yaml title="FILE"``) is a file the page's commands read: it is written
into the copy first.

A command exits 0, or 2 where the page shows its error (the line after it starts
with ``clustersim: error:``). Synopses, commands with placeholders (``SCENARIO.yaml``,
``[--gzip]``), are not run; they must parse.

Most commands simulate for more than a few seconds and are marked slow
(``python -m pytest -m slow tests/test_page_commands.py``); those in ``FAST`` run in
the default suite, each only when every command before it on its page is fast too.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from clustersim.cli_args import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
GENERATED = {"docs/reference/cli.md"}  # every --help: usage lines, no commands
TIMEOUT_S = 3600.0  # the longest, `clustersim validate`, takes about 9 CPU-minutes

FAST = (
    "clustersim check ",
    "clustersim collective ",
    "clustersim topology export ",
    "clustersim export chakra ",
    "clustersim serve scenarios/serve-trn2-llama3-70b.yaml ",
)
"""Commands that take about 3 s on a loaded 2-core machine, where a training step's
simulation or a report takes 10 s or more: the default suite runs these."""

_BLOCK = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
_TITLE = re.compile(r'title="([^"]+)"')
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(\.[a-z]+)?|[A-Z_]+=[A-Z_]+")


@dataclass(frozen=True)
class Command:
    """One command of a page: its words after the interpreter (``-m clustersim ...``)."""

    page: str
    index: int
    argv: tuple[str, ...]
    exit_code: int

    @property
    def text(self) -> str:
        """As the page shows it."""
        if self.argv[:2] == ("-m", "clustersim"):
            return shlex.join(("clustersim", *self.argv[2:]))
        return shlex.join(("python", *self.argv))

    @property
    def fast(self) -> bool:
        return (self.text + " ").startswith(FAST)


def _argv(part: str) -> tuple[str, ...] | None:
    if not re.match(r"(clustersim|python -m clustersim)\b", part):
        return None
    words = shlex.split(part)
    if words[:1] == ["clustersim"]:
        return ("-m", "clustersim", *words[1:])
    if words[:2] == ["python", "-m"] and words[2:3] and words[2].split(".")[0] == "clustersim":
        return tuple(words[1:])
    return None


def _placeholder(word: str) -> bool:
    """``SCENARIO.yaml``, ``KEY=VALUE``, an optional ``[--gzip]`` or ``...`` (but not a
    value such as ``failures.inject=[]``)."""
    optional = word.startswith("[") or (word.endswith("]") and "[" not in word)
    return optional or "..." in word or _PLACEHOLDER.fullmatch(word) is not None


def _is_synopsis(argv: tuple[str, ...]) -> bool:
    return any(_placeholder(w) for w in argv[2:])


def page_commands(text: str) -> tuple[list[tuple[tuple[str, ...], int]], list[tuple[str, ...]]]:
    """A page's runnable commands in order, with the exit code each should give, and
    its synopses."""
    runs: list[tuple[tuple[str, ...], int]] = []
    synopses: list[tuple[str, ...]] = []
    for block in _BLOCK.finditer(text):
        lines = block.group(2).replace("\\\n", " ").splitlines()
        for i, line in enumerate(lines):
            shown = re.split(r"\s#", line.strip().removeprefix("$ "))[0]
            for part in re.split(r"&&|\|", shown):
                argv = _argv(part.strip())
                if argv is None:
                    continue
                if _is_synopsis(argv):
                    synopses.append(argv)
                    continue
                after = lines[i + 1] if i + 1 < len(lines) else ""
                runs.append((argv, 2 if after.startswith("clustersim: error:") else 0))
    return runs, synopses


def page_files(text: str) -> dict[str, str]:
    """The titled code blocks of a page: files its commands read."""
    return {
        title.group(1): block.group(2)
        for block in _BLOCK.finditer(text)
        if (title := _TITLE.search(block.group(1)))
    }


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


TEXTS = {_rel(p): p.read_text(encoding="utf-8") for p in PAGES if _rel(p) not in GENERATED}
COMMANDS: list[Command] = []
SYNOPSES: list[tuple[str, str]] = []
for _page, _text in TEXTS.items():
    _runs, _synopses = page_commands(_text)
    COMMANDS += [Command(_page, i, argv, code) for i, (argv, code) in enumerate(_runs)]
    SYNOPSES += [(_page, shlex.join(s[2:])) for s in _synopses if s[1] == "clustersim"]


def _marks(command: Command) -> list[pytest.MarkDecorator]:
    before = [c for c in COMMANDS if c.page == command.page and c.index <= command.index]
    return [] if all(c.fast for c in before) else [pytest.mark.slow]


def _fresh_clone(dest: Path, *, package: bool) -> None:
    """The repository's tracked files (a checkout without git: all but caches and
    results). ``package=False`` links the package instead of copying it, so that its
    compiled modules are reused: for pages whose commands do not write into it."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout.decode()
        files = [f for f in listed.split("\0") if f and (ROOT / f).is_file()]
    except (OSError, subprocess.SubprocessError):
        files = []
    if not package:
        files = [f for f in files if not f.startswith("clustersim/")]
        (dest / "clustersim").symlink_to(ROOT / "clustersim", target_is_directory=True)
    if not files:
        names = ("README.md", "pyproject.toml", "docs", "scenarios", "reports/sample")
        names += ("clustersim",) * package
        for name in names:
            if (ROOT / name).is_dir():
                junk = shutil.ignore_patterns("__pycache__")
                shutil.copytree(ROOT / name, dest / name, ignore=junk, dirs_exist_ok=True)
            elif (ROOT / name).is_file():
                shutil.copy2(ROOT / name, dest / name)
        return
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)


class _Page:
    """A page's copy of the repository, and how many of its commands have run there."""

    def __init__(self, page: str, root: Path) -> None:
        self.root = root
        self.ran = 0
        writes = any("--write" in c.argv for c in COMMANDS if c.page == page)
        _fresh_clone(root, package=writes)  # calibrate --write rewrites the catalog
        for name, text in page_files(TEXTS[page]).items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text, encoding="utf-8")

    def run(self, command: Command) -> str:
        env = {**os.environ, "PYTHONPATH": str(self.root), "MPLBACKEND": "Agg", "COLUMNS": "120"}
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, *command.argv],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        self.ran = command.index + 1
        tail = (proc.stdout[-2000:] + proc.stderr[-2000:]).strip()
        took = time.perf_counter() - start
        assert proc.returncode == command.exit_code, (
            f"{command.page}: `{command.text}` exited {proc.returncode} after {took:.1f} s, "
            f"not {command.exit_code}:\n{tail}"
        )
        return tail


_SANDBOXES: dict[str, _Page] = {}


@pytest.fixture
def sandbox(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> _Page:
    page = request.node.callspec.params["command"].page
    if page not in _SANDBOXES:
        _SANDBOXES[page] = _Page(page, tmp_path_factory.mktemp("page"))
    return _SANDBOXES[page]


def test_pages_show_commands() -> None:
    assert len(COMMANDS) > 30
    assert any(c.exit_code == 2 for c in COMMANDS), "no page shows a refused command"
    assert any(c.fast for c in COMMANDS) and not all(c.fast for c in COMMANDS)


@pytest.mark.parametrize(
    "command",
    [pytest.param(c, id=f"{c.page}:{c.index}", marks=_marks(c)) for c in COMMANDS],
)
def test_every_command_shown_runs(command: Command, sandbox: _Page) -> None:
    """The commands before it on its page run first, where an earlier test has not."""
    earlier = [c for c in COMMANDS if c.page == command.page and c.index < command.index]
    for before in earlier[sandbox.ran :]:
        sandbox.run(before)
    sandbox.run(command)


@pytest.mark.parametrize(("page", "synopsis"), SYNOPSES)
def test_every_synopsis_parses(page: str, synopsis: str) -> None:
    # Placeholders become values of the right form: the options and their arity count.
    words = [w.strip("[]") for w in shlex.split(synopsis) if "..." not in w]
    words = ["k=1" if "=" in w else "1" if _placeholder(w) else w for w in words]
    try:
        build_parser().parse_args(words)
    except SystemExit as exc:
        pytest.fail(f"{page}: `clustersim {synopsis}` does not parse (exit {exc.code})")


def test_commands_are_found_as_shown() -> None:
    text = (
        "```bash\npip install -e . && clustersim run a.yaml  # note\n"
        "clustersim sweep STUDY.yaml --dask-local 4\n```\n"
        '```yaml title="b.yaml"\nname: b\n```\n'
        "```\n$ clustersim run b.yaml \\\n  --set x=1\nclustersim: error: x: unknown key\n"
        "$ python -m clustersim.docs --check\n```\n"
    )
    runs, synopses = page_commands(text)
    assert runs == [
        (("-m", "clustersim", "run", "a.yaml"), 0),
        (("-m", "clustersim", "run", "b.yaml", "--set", "x=1"), 2),
        (("-m", "clustersim.docs", "--check"), 0),
    ]
    assert synopses == [("-m", "clustersim", "sweep", "STUDY.yaml", "--dask-local", "4")]
    assert page_files(text) == {"b.yaml": "name: b\n"}
