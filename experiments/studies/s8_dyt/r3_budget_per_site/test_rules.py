"""S8 round 3's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs


def _dyt_runs(gap: float, per_site: float, saturated: float = 0.05) -> tuple[Runs, dict]:
    """S8 r3 runs: RMSNorm, uniform DyT ``gap`` behind it, the per-site arms ``per_site`` from uniform DyT; every DyT
    run's end-of-training saturation ``saturated``."""
    from experiments.studies.s8_dyt.r3_budget_per_site import analyze as r3

    out, sat = [], {}
    for _name, tag, norm, offset in (("rmsnorm", [], "rmsnorm", 0.0), ("uniform", [], "dyt", gap),
                                    ("attn 1.0", ["attn1"], "dyt", gap + per_site),
                                    ("attn 2.0", ["attn2"], "dyt", gap + per_site)):
        for s in r3.SEEDS:
            run = {"norm": norm, "seed": s, "tags": ["budget", *tag], "max_steps": r3.STEPS, "diverged": False,
                   "status": "completed", "final_val_loss": 1.7 + offset + 0.002 * ((s * 3) % 5 - 2),
                   "unigram_loss": 3.26, "loss_init": 4.48}
            out.append(run)
            if norm == "dyt":
                sat[r3.key(run)] = saturated
    return Runs(out), sat


def test_s8_r3_budget_per_site_rules():
    from experiments.studies.s8_dyt.r3_budget_per_site import analyze as r3

    res, md = r3.analyze(*_dyt_runs(0.005, -0.03))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words["D3"] == "confirmed" and words["D4a"] == "confirmed" and words["D4b"] == "confirmed", md
    assert words["D5"] == "contradicted", md  # the gap shrank from round 2's ~0.08 to ~0.005
    res, md = r3.analyze(*_dyt_runs(0.2, 0.02))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words["D3"] == "not at this scale" and words["D4a"] == "not at this scale" and words["D5"] == "confirmed"
    res, md = r3.analyze(*_dyt_runs(0.2, 0.02, saturated=0.001))
    assert all(w == "premise absent at this scale" for w, _ in res["verdicts"].values()), md
    runs, sat = _dyt_runs(0.005, -0.03)
    with pytest.raises(SystemExit, match="saturation"):
        r3.analyze(runs, {})
