"""A real browser opens report.html: no console errors, every image decodes, not blank.

Uses headless Chromium (Debian's ``chromium``; ``.ci/run`` installs it). Skipped
with a reason where it is not installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
)
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
]  # fmt: skip


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def test_report_loads_in_headless_chromium(tiny_run: Path, tmp_path: Path) -> None:
    url = (tiny_run / "report.html").resolve().as_uri()
    dom = _chromium(tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console  # no script errors, no failed loads
    imgs = re.findall(r"<img\b[^>]*>", dom.stdout)
    assert len(imgs) >= 5
    for tag in imgs:
        src = re.search(r'\ssrc="([^"]*)"', tag)
        assert src is not None and src.group(1).startswith("data:image/png;base64,")
        assert len(src.group(1)) > 1000, tag[:120]
    assert "Exposed communication" in dom.stdout

    shot = tmp_path / "shot.png"
    res = _chromium(tmp_path, "--window-size=1200,1600", f"--screenshot={shot}", url)
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    px = np.asarray(mpimg.imread(shot))
    assert px.shape[0] >= 1000 and float(px[..., :3].var()) > 1e-3
