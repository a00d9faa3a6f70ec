"""S9 round 1's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import math

from experiments.common.study import Runs


def test_s9_r1_grid_rules():
    """S9's pre-registered rules on made-up runs: warmup-free training per norm, and the paired parity interval."""
    from experiments.studies.s9_scalenorm.r1_grid import analyze as s9

    def runs(no_warmup_cost, scale_minus_ln):
        out = []
        for norm in s9.NORMS:
            for w in s9.WARMUPS:
                for lr in (1e-3, 3e-3, 1e-2):
                    for seed in range(4):
                        loss = 2.0 + abs(math.log10(lr / 3e-3)) * 0.1 + (0 if w else no_warmup_cost) + 0.003 * seed
                        loss += (scale_minus_ln + 0.002 * (seed % 2)) if norm == "scalenorm" else 0.0
                        out.append({"norm": norm, "warmup_steps": w, "lr": lr, "seed": seed, "final_val_loss": loss,
                                    "diverged": False, "status": "completed", "unigram_loss": 3.2, "loss_init": 4.5,
                                    "curves": {}})
        return Runs(out)

    res, md = s9.analyze(runs(0.01, -0.01))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"W": "confirmed", "S": "confirmed (better)"}, md
    res, _ = s9.analyze(runs(0.2, 0.1))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"W": "not at this scale", "S": "contradicted"}
