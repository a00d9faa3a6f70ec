"""S3 round 5's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs
from experiments.studies.s3_lr_sensitivity.r4_width_transfer.test_rules import width_runs


def test_s3_r5_is_round_4s_analysis_on_the_six_point_grid():
    """A best lr of 10^-3.2 at width 256 (slope -0.4) is a grid edge for round 4 (precondition mixed) and inside
    round 5's grid (present), with round 4's words; round 4's own grid is left as it was."""
    from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4
    from experiments.studies.s3_lr_sensitivity.r5_width_low_lr import analyze as r5

    runs = width_runs(-0.4, -0.4, lrs=r5.LRS)
    r4_res, _ = r4.analyze(Runs(r for r in runs if r["lr"] in r4.LRS))
    res, md = r5.analyze(runs)
    assert r4_res["precondition"][0]["status"] == "mixed" and res["precondition"][0]["status"] == "present", md
    assert {k: w for k, (w, _) in res["verdicts"].items()} == {
        "T1 layernorm": "confirmed", "T1 rmsnorm": "confirmed", "T2": "confirmed"}, md
    assert res["slopes"]["rmsnorm"][0] == pytest.approx(-0.4, abs=1e-6) and res["lrs"][0] == 3e-4
    assert r4.LRS == (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
