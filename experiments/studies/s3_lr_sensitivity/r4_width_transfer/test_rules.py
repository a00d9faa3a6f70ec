"""S3 round 4's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import math

import pytest

from experiments.common.study import Runs


def width_runs(slope_ln: float, slope_rms: float, edge: bool = False, lrs: tuple | None = None) -> Runs:
    """S3 r4 runs: loss = 2 + (log10 lr - c)^2 with the best log10 lr c = -2 + slope x log2(width / 32) (+ a seed
    jitter), so the transfer slope is the one given; ``edge``: every best lr beyond the grid; ``lrs``: the grid
    (round 4's by default)."""
    from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4

    out = []
    for norm, k in (("layernorm", slope_ln), ("rmsnorm", slope_rms)):
        for w in r4.WIDTHS:
            for s in r4.SEEDS:
                c = (0.5 if edge else -2.0) + k * math.log2(w / 32) + 0.01 * s
                for lr in lrs or r4.LRS:
                    out.append({"norm": norm, "dim": w, "lr": lr, "seed": s, "qk_norm": "none", "z_loss": 0.0,
                                "final_val_loss": 2.0 + (math.log10(lr) - c) ** 2, "diverged": False,
                                "status": "completed", "unigram_loss": 9.0, "loss_init": 9.5})
    return Runs(out)


def test_s3_r4_width_transfer_rules():
    from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4

    assert r4.best_log_lr([2 + (math.log10(lr) + 2.1) ** 2 for lr in r4.LRS]) == (pytest.approx(-2.1), True)
    assert r4.best_log_lr([2.0, 2.5, 3.0, 3.5, 4.0])[1] is False
    res, md = r4.analyze(width_runs(-0.25, -0.25))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words == {"T1 layernorm": "confirmed", "T1 rmsnorm": "confirmed", "T2": "confirmed"}, md
    assert res["slopes"]["layernorm"][0] == pytest.approx(-0.25, abs=1e-6)
    res, md = r4.analyze(width_runs(0.0, -0.3))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words["T1 layernorm"] == "not at this scale" and words["T2"] == "not at this scale", md
    res, md = r4.analyze(width_runs(-0.25, -0.25, edge=True))
    assert {w for w, _ in res["verdicts"].values()} == {"premise absent at this scale"}, md
