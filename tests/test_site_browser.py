"""A real browser opens the documentation site: every page in the navigation loads with
no console errors (a script that fails, a resource that does not load) and shows its
title.

The site is built with ``mkdocs build --strict`` and served over HTTP on the loopback
address (the search index is fetched by script, which a ``file://`` page may not do).
Uses headless Chromium (Debian's ``chromium``; ``.ci/run`` installs it) and mkdocs
(``pip install -e ".[docs]"``); skipped with a reason where either is missing.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
    ),
    pytest.mark.skipif(
        shutil.which("mkdocs") is None, reason='mkdocs not installed: pip install -e ".[docs]"'
    ),
]
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000",
]  # fmt: skip


def _nav_pages(nav: object) -> Iterator[str]:
    """Every page path (``tutorials/first-run.md``) in mkdocs.yml's ``nav``."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_pages(value)


def _url_path(page: str) -> str:
    """Where mkdocs writes a page with directory URLs: ``a/b.md`` -> ``a/b/``."""
    stem = page.removesuffix(".md")
    if stem == "index":
        return ""
    return (stem.removesuffix("/index") if stem.endswith("/index") else stem) + "/"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    handler = functools.partial(_QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _pages() -> list[str]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text("utf-8"), Loader=yaml.BaseLoader)
    return sorted(set(_nav_pages(config.get("nav", []))))


def test_every_page_loads_without_console_errors(site: str, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    pages = _pages()
    assert len(pages) >= 10, pages
    failures = []
    for page in pages:
        url = site + _url_path(page)
        profile = tmp_path / f"profile-{len(failures)}-{page.replace('/', '-')}"
        cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)
        console = [line for line in res.stderr.splitlines() if ":CONSOLE" in line]
        if res.returncode != 0 or console or "<h1" not in res.stdout:
            failures.append(f"{page}: rc {res.returncode}, {console[:3]}")
    assert not failures, failures
