"""MkDocs hook: the repository files the pages link to outside docs/ (the sample report,
the hardware study's figure) are published with the site.

A page links to them by their path from the page (``../../reports/sample/timeline.png``
from ``docs/tutorials/``), so the link works on a repository browser too. The hook
adds each such file to the site under ``_repo/`` and points the link there.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(\]\()([^)\s#]+)")
_wanted: set[str] = set()


def _outside(page_uri: str, target: str) -> str | None:
    """The repository path of ``target`` when it leaves docs/ and names a file there."""
    if "://" in target or target.startswith(("/", "#", "mailto:")):
        return None
    joined = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_uri), target))
    if joined.startswith(("docs/", "../")) or not (ROOT / joined).is_file():
        return None
    return joined


def on_pre_build(config: Any) -> None:
    _wanted.clear()
    for md in (ROOT / "docs").rglob("*.md"):
        uri = md.relative_to(ROOT / "docs").as_posix()
        for m in LINK.finditer(md.read_text("utf-8")):
            found = _outside(uri, m.group(2))
            if found:
                _wanted.add(found)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path in sorted(_wanted):
        src = ROOT / path
        files.append(File.generated(config, f"_repo/{path}", abs_src_path=str(src)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    uri = page.file.src_uri

    def repoint(m: re.Match[str]) -> str:
        found = _outside(uri, m.group(2))
        if found is None:
            return m.group(0)
        rel = posixpath.relpath(f"_repo/{found}", posixpath.dirname(uri) or ".")
        return m.group(1) + rel

    return LINK.sub(repoint, markdown)
