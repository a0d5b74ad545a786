"""The README and the documentation site stay true: every section a page points to
exists, no page names a file the repository lacks, every page is in the site's
navigation, and every command a page shows parses. (The outputs the pages quote are
generated and checked by ``python -m clustersim.docs``.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from clustersim.cli_args import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = sorted((ROOT / "docs").rglob("*.md"))
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in DOCS}
ALL = {"README.md": README, **PAGES}
HEADINGS = [
    m.group(1).strip() for t in ALL.values() for m in re.finditer(r"^#{1,4} (.+)$", t, re.M)
]


def test_readme_is_a_front_door() -> None:
    assert len(README.splitlines()) < 250
    assert "python -m pytest" in README  # CI runs the README's test command
    # One click from the README to each study a new user comes for.
    for page in ("failure-study", "layout-search", "trn2-vs-h100", "serving"):
        assert f"(docs/tutorials/{page}.md)" in README
    for page in ("chakra", "calibrate", "custom-fabric", "sweeps"):
        assert f"(docs/how-to/{page}.md)" in README


def test_every_section_it_points_to_exists() -> None:
    pointers = {
        p for t in ALL.values() for p in re.findall(r"\bsee ([A-Z][A-Za-z]+(?: [a-z]+)*)", t)
    }
    assert pointers, "no page points to a section: the pattern needs updating"
    missing = sorted(p for p in pointers if not any(h.startswith(p) for h in HEADINGS))
    assert not missing, f"the pages point to sections they lack: {missing}"


def test_every_file_it_names_exists() -> None:
    missing = []
    for page, text in ALL.items():
        named = set(re.findall(r"`((?:clustersim|scenarios|docs|tests)/[\w./-]+)`", text))
        named |= set(re.findall(r"\b([A-Z]+\.md)\b", text)) - {"SOURCES.md"}
        missing += [f"{page}: {n}" for n in named if "*" not in n and not (ROOT / n).exists()]
    assert not missing, f"the pages name files the repository lacks: {sorted(missing)}"


def test_every_relative_link_resolves() -> None:
    missing = []
    for page, text in ALL.items():
        for target in re.findall(r"\]\(([^)\s#]+)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not ((ROOT / page).parent / target).exists():
                missing.append(f"{page}: {target}")
    assert not missing, f"links to nothing: {missing}"


def _nav(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav(item)]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav(v)]
    return []


def test_every_page_is_in_the_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = set(_nav(config["nav"]))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in DOCS}
    assert pages == nav, f"not in nav: {sorted(pages - nav)}; no page: {sorted(nav - pages)}"


def _commands(text: str) -> list[str]:
    """Every ``clustersim ...`` command of a page's bash blocks (continuations joined)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\|", line.split(" #")[0]):
                words = shlex.split(part.strip()) if part.strip() else []
                if words[:1] == ["clustersim"]:
                    out.append(shlex.join(words[1:]))
                elif words[:3] == ["python", "-m", "clustersim"]:
                    out.append(shlex.join(words[3:]))
    return out


COMMANDS = sorted({(page, c) for page, text in ALL.items() for c in _commands(text)})


def test_pages_show_commands() -> None:
    assert len(COMMANDS) > 20


@pytest.mark.parametrize(("page", "command"), COMMANDS)
def test_every_command_shown_parses(page: str, command: str) -> None:
    try:
        build_parser().parse_args(shlex.split(command))
    except SystemExit as exc:
        pytest.fail(f"{page}: `clustersim {command}` does not parse (exit {exc.code})")


def test_a_renamed_flag_fails() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["search", "x.yaml", "--chipz", "64"])
