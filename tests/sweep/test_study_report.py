"""``clustersim report`` on a study directory: Pareto front, sensitivity, Monte Carlo
distributions, and the page escaping what the study file says."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.report.study_data import (
    distribution_stats,
    is_study_dir,
    load_study_dir,
    pareto_mask,
    sensitivity,
)

STUDY = """\
name: "mini <b>report</b>"
description: "<script>alert(1)</script>"
base: mini.yaml
axes:
  - grid: {parallelism.tp: [1, 2], parallelism.pp: [1, 2]}
  - seeds: 2
report: {train_tokens: 1.0e9}
"""


def test_pareto_mask_by_hand() -> None:
    x = np.array([1.0, 2.0, 3.0, 2.0, 4.0, 1.0, math.nan])
    y = np.array([5.0, 3.0, 1.0, 4.0, 1.0, 6.0, 0.0])
    # (1,5) (2,3) (3,1) are the front; (2,4) (4,1) (1,6) are beaten; NaN is left out.
    assert pareto_mask(x, y).tolist() == [True, True, True, False, False, False, False]


def test_distribution_stats_match_the_t_interval() -> None:
    st = distribution_stats([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)  # t(0.975, 4) s / sqrt(n)
    assert st["mean"] == 3.0 and st["std"] == pytest.approx(math.sqrt(2.5))
    assert (st["ci_low"], st["ci_high"]) == pytest.approx((3.0 - half, 3.0 + half))
    assert (st["p5"], st["p50"], st["p95"]) == pytest.approx((1.2, 3.0, 4.8))
    assert distribution_stats([2.0])["ci_low"] == 2.0


def test_report_on_a_study_dir(
    write_study: Callable[..., Path], study_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = study_dir / "out"
    assert (
        main(["sweep", str(write_study(STUDY)), "--out", str(out), "--quiet", "--workers", "1"])
        == 0
    )
    assert is_study_dir(out)
    assert main(["report", str(out)]) == 0
    assert "report.html" in capsys.readouterr().out
    for name in ("pareto.png", "sensitivity.png", "distributions.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    page = (out / "report.html").read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "mini &lt;b&gt;report&lt;/b&gt;" in page
    assert "Pareto front" in page and "Sensitivity" in page and "95% CI of the mean" in page
    data = load_study_dir(out)
    assert data.x == "time_to_train_h" and len(data.ok) == 8
    swings = {(s["axis"], s["metric"]): s for s in sensitivity(data)}
    tp = swings[("parallelism.tp", "step_time_s")]
    means = dict(tp["levels"])
    ok = data.ok
    for level, mean in means.items():
        assert mean == pytest.approx(ok[ok["parallelism.tp"] == int(level)]["step_time_s"].mean())
    assert tp["swing"] == pytest.approx(
        (max(means.values()) - min(means.values())) / ok["step_time_s"].mean()
    )


def test_report_refuses_an_unfinished_study(study_dir: Path) -> None:
    (study_dir / "study.json").write_text('{"study": "x", "axes": []}')
    with pytest.raises(ScenarioError, match="has not finished"):
        load_study_dir(study_dir)
