"""S3 round 6's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import math

import pytest

from experiments.common.study import Runs


def _qk_width_runs(benefit_growth: float, logits_grow: bool = True) -> Runs:
    """S3 r6 runs: loss-vs-lr parabolas on log10(lr) around lr 3e-3; without QK-norm the curvature grows by
    ``benefit_growth`` per doubling of width, with QK-norm it is a third of width 32's; attention logits 1e4 without
    QK-norm when ``logits_grow`` (else 200), 100 with it."""
    from experiments.studies.s3_lr_sensitivity.r6_qk_width import analyze as r6

    out = []
    for i, w in enumerate(r6.WIDTHS):
        for qk in r6.QK:
            for s in r6.SEEDS:
                curv = 0.15 if qk == "layernorm" else 0.45 + benefit_growth * i + 0.01 * s
                for lr in r6.LRS:
                    x = math.log10(lr) - math.log10(3e-3) + 0.05 * s
                    out.append({"norm": "rmsnorm", "dim": w, "qk_norm": qk, "seed": s, "lr": lr, "z_loss": 0.0,
                                "tags": ["qk_width"], "final_val_loss": 2.0 + curv * x * x, "diverged": False,
                                "status": "completed", "loss_init": 4.48,
                                "max_attn_logit": 100.0 if qk == "layernorm" else 1e4 if logits_grow else 200.0})
    return Runs(out)


def test_s3_r6_qk_width_rules():
    from experiments.studies.s3_lr_sensitivity.r6_qk_width import analyze as r6

    res, md = r6.analyze(_qk_width_runs(0.2))  # QK-norm lowers the sensitivity 3x+, more at every width
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert res["precondition"][0]["status"] == "present", md
    assert words == {**{f"Q1 width {w}": "confirmed" for w in r6.WIDTHS}, "Q2": "confirmed"}, md
    assert res["best_log10_lr"]["32/none"][0] == pytest.approx(math.log10(3e-3), abs=1e-6)
    res, md = r6.analyze(_qk_width_runs(-0.1))  # the benefit shrinks with width: Q2 not at this scale
    assert {k: w for k, (w, _) in res["verdicts"].items()}["Q2"] == "not at this scale", md
    res, md = r6.analyze(_qk_width_runs(0.2, logits_grow=False))  # no logit growth: the gate
    assert res["precondition"][0]["status"] == "absent"
    assert all(w == "premise absent at this scale" for w, _ in res["verdicts"].values()), md
    runs = _qk_width_runs(0.2)
    del runs[0]["max_attn_logit"]
    with pytest.raises(SystemExit, match="max attention logit"):
        r6.analyze(runs)
