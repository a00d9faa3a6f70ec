"""S9 round 2's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

from experiments.common.study import Runs


def test_s9_r2_more_seeds_rules():
    """S9 round 2: S re-judged over seeds 0-15 of the one cell; other cells and seeds are ignored."""
    from experiments.studies.s9_scalenorm.r2_more_seeds import analyze as seeds

    def runs(gap, noise):
        out = []
        for norm in ("layernorm", "scalenorm"):
            for lr, seed in [(seeds.LR, s) for s in range(20)] + [(1e-3, 0)]:
                loss = 2.0 + (gap + noise * (-1) ** seed if norm == "scalenorm" else 0.0) + (lr != seeds.LR)
                out.append({"norm": norm, "warmup_steps": seeds.WARMUP, "lr": lr, "seed": seed,
                            "final_val_loss": loss, "diverged": False, "status": "completed", "unigram_loss": 3.2,
                            "loss_init": 4.5, "curves": {}})
        return Runs(out)

    res, md = seeds.analyze(runs(0.005, 0.002))
    assert res["verdict"] == "confirmed" and res["excludes_zero"] and res["seeds"] == list(range(16)), md
    assert seeds.analyze(runs(-0.01, 0.002))[0]["verdict"] == "confirmed (better)"
    assert seeds.analyze(runs(0.05, 0.002))[0]["verdict"] == "contradicted"
    res, _ = seeds.analyze(runs(0.0, 0.05))
    assert res["verdict"] == "unresolved" and not res["excludes_zero"]
