"""S2 round 2's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

from experiments.common.study import Runs


def test_s2_r2_xavier_rules():
    """S2 round 2's pre-registered rules on made-up runs: Post-LN needs warmup, Pre-LN does not."""
    from experiments.studies.s2_warmup.r2_xavier import analyze as xavier

    def runs(post_cold_penalty, pre_cold_penalty):
        out = []
        for p, penalty in (("pre", pre_cold_penalty), ("post", post_cold_penalty)):
            for lr in (1e-3, 3e-3, 1e-2):
                for w in (0, xavier.WARMUP):
                    for s in range(3):
                        loss = 2.0 + 0.01 * s + (penalty * (lr == 1e-2) if w == 0 else 0.0)
                        out.append({"placement": p, "lr": lr, "warmup_steps": w, "seed": s, "final_val_loss": loss,
                                    "diverged": False, "status": "completed", "unigram_loss": 3.2, "loss_init": 4.5})
        return Runs(out)

    res, md = xavier.analyze(runs(0.3, 0.01))
    assert res["verdicts"]["overall"][0] == "confirmed", md
    assert xavier.analyze(runs(0.3, 0.2))[0]["verdicts"]["overall"][0] == "partly"
    assert xavier.analyze(runs(0.01, 0.2))[0]["verdicts"]["overall"][0] == "not at this scale"
