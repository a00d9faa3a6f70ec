"""S3 round 2's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import math

from experiments.common.study import Runs


def test_s3_r2_olmo2_rules():
    """S3 round 2's pre-registered rules on made-up runs: sensitivity on seed means and per seed, stable lr."""
    from experiments.studies.s3_lr_sensitivity.r2_olmo2 import analyze as olmo2

    lrs = (1e-3, 1e-2, 1e-1)

    def runs(olmo_slope):
        out = []
        for placement, qk in (olmo2.BASELINE, *olmo2.PARTS.values(), olmo2.OLMO2):
            slope = olmo_slope if (placement, qk) == olmo2.OLMO2 else 1.0
            for lr in lrs:
                for seed in (0, 1):
                    loss = 2.0 + slope * abs(math.log10(lr / 1e-3)) * (1 + 0.1 * seed)
                    out.append({"placement": placement, "qk_norm": qk, "lr": lr, "seed": seed,
                                "final_val_loss": loss, "diverged": False, "status": "completed", "loss_init": 4.5,
                                "unigram_loss": 3.5, "curves": {}})
        return Runs(out)

    res, md = olmo2.analyze(runs(0.5))
    verdicts = {k: v for k, (v, _) in res["verdicts"].items()}
    assert verdicts["O1"] == "confirmed" and verdicts["O3"] == "confirmed" and verdicts["O4"] == "confirmed", md
    assert verdicts["O2 branch alone"] == "does not lower"
    res, _ = olmo2.analyze(runs(0.9))
    assert res["verdicts"]["O1"][0] == "not at this scale" and res["verdicts"]["O3"][0] == "not at this scale"
