"""S8 round 1's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import math

from experiments.common.study import Runs


def test_s8_r1_grid_rules():
    """S8's pre-registered rules on made-up runs: parity, the alpha0-lr interaction and the budget growth."""
    from experiments.studies.s8_dyt.r1_grid import analyze as s8

    def run(norm, lr, seed, steps, loss, a0=None):
        opts = {"alpha0": a0} if norm == "dyt" else {}
        return {"norm": norm, "lr": lr, "seed": seed, "max_steps": steps, "final_val_loss": loss, "diverged": False,
                "loss_init": 4.2, "norm_options": opts, "curves": {}}

    def runs(gap_short, gap_long, best_at_high_lr):
        out = []
        for seed in s8.SEEDS:
            for lr in s8.LRS:
                out.append(run("rmsnorm", lr, seed, s8.SHORT, 2.0))
                best = best_at_high_lr if lr == max(s8.LRS) else max(s8.ALPHA0)
                slope = 0.5 if lr == max(s8.LRS) else 0.01
                out += [run("dyt", lr, seed, s8.SHORT, 2.0 + gap_short + slope * abs(math.log(a / best)), a)
                        for a in s8.ALPHA0]
            out.append(run("rmsnorm", s8.LONG_LR, seed, s8.LONG, 1.5))
            out.append(run("dyt", s8.LONG_LR, seed, s8.LONG, 1.5 + gap_long + 0.001 * seed, max(s8.ALPHA0)))
        return Runs(out)

    saturated = {f"gpt2/{a:g}": [0.05, 0.04, 0.06] for a in s8.ALPHA0}  # tanh leaves its linear range
    res, md = s8.analyze(runs(0.01, 0.02, min(s8.ALPHA0)), saturated)
    assert (res["h1"]["verdict"], res["h2"]["verdict"], res["h3"]["verdict"]) == ("confirmed", "confirmed",
                                                                                 "confirmed")
    assert res["h1"]["long_alpha0"] == max(s8.ALPHA0) and "**confirmed**" in md
    res, _ = s8.analyze(runs(0.05, 0.2, max(s8.ALPHA0)), saturated)
    assert (res["h1"]["verdict"], res["h2"]["verdict"], res["h3"]["verdict"]) == ("not at this scale", "partly",
                                                                                 "confirmed")
    res, _ = s8.analyze(runs(0.08, 0.0, max(s8.ALPHA0)), saturated)
    assert (res["h1"]["verdict"], res["h3"]["verdict"]) == ("partly", "contradicted")
    linear = {k: [0.0, 0.0, 0.0] for k in saturated}  # tanh stays linear: DyT is a scaled identity
    res, _ = s8.analyze(runs(0.08, 0.0, max(s8.ALPHA0)), linear)
    assert res["h3"]["verdict"] == "premise absent at this scale" and res["h3"]["rule_verdict"] == "contradicted"
    assert res["precondition"][0]["status"] == "absent"
