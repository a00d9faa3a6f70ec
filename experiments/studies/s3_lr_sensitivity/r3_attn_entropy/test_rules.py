"""S3 round 3's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs


def _entropy_runs(collapsed: float, kept: float, logit_growth: float = 100.0, with_metric: bool = True) -> Runs:
    """S3 r3 runs: without QK-norm the final min entropy ``collapsed`` at lr 3e-1 (2.0 below), with it ``kept``;
    max attention logits 10 with QK-norm and 10 x ``logit_growth`` without."""
    from experiments.studies.s3_lr_sensitivity.r3_attn_entropy import analyze as r3

    out = []
    for norm in r3.NORMS:
        for qk in ("none", "layernorm"):
            for lr in r3.LRS:
                for s in r3.SEEDS:
                    e = (kept if qk != "none" else collapsed if lr == r3.TOP_LR else 2.0) * (1 + 0.05 * s)
                    curves = {f"layer/{i}/attn_entropy_min": [(390, e + i)] for i in range(4)} if with_metric else {}
                    out.append({"norm": norm, "qk_norm": qk, "lr": lr, "seed": s, "z_loss": 0.0, "diverged": False,
                                "status": "completed", "final_val_loss": 2.1, "unigram_loss": 3.26, "loss_init": 4.48,
                                "max_attn_logit": 10.0 * (logit_growth if qk == "none" else 1.0), "curves": curves})
    return Runs(out)


def test_s3_r3_attn_entropy_rules():
    from experiments.studies.s3_lr_sensitivity.r3_attn_entropy import analyze as r3

    res, md = r3.analyze(_entropy_runs(0.1, 1.5))
    assert res["precondition"][0]["status"] == "present"
    assert {w for w, _ in res["verdicts"].values()} == {"confirmed"}, md
    res, md = r3.analyze(_entropy_runs(1.5, 1.6))
    assert {w for w, _ in res["verdicts"].values()} == {"not at this scale"}, md
    res, md = r3.analyze(_entropy_runs(0.1, 1.5, logit_growth=2.0))
    assert {w for w, _ in res["verdicts"].values()} == {"premise absent at this scale"}, md
    with pytest.raises(SystemExit, match="attn_entropy_min"):
        r3.analyze(_entropy_runs(0.1, 1.5, with_metric=False))
