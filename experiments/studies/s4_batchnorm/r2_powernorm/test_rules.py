"""S4 round 2's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

from experiments.common.study import Runs


def test_s4_r2_powernorm_rules():
    """S4 round 2's pre-registered rules on made-up runs: fluctuation against the sampling null, PowerNorm
    against LayerNorm at both batch sizes."""
    from experiments.studies.s4_batchnorm.r2_powernorm import analyze as s4
    from minillm.training.callbacks import bn_sampling_null

    def run(norm, batch, seed, loss, z_ratio=1.0, failed=False):
        curves = {}
        if norm == "batchnorm":
            null = bn_sampling_null(batch, s4.MOMENTUM)
            curves = {"norm/layers.0.attn_norm/bn_mean_z": [(300, z_ratio * null[0])],
                      "norm/layers.0.attn_norm/bn_var_z": [(300, null[1])]}
        return {"norm": norm, "batch_size": batch, "seed": seed, "max_steps": 400, "final_val_loss": loss,
                "diverged": False, "status": "completed", "unigram_loss": 3.0 if not failed else 1.0,
                "curves": curves}

    def runs(z_small, pn_small, pn_fail):
        out = []
        for seed in range(3):
            out += [run("batchnorm", 4, seed, 3.5, z_small, failed=True), run("batchnorm", 64, seed, 1.9, 1.1),
                    run("layernorm", 4, seed, 2.35 + 0.005 * seed), run("layernorm", 64, seed, 1.87),
                    run("powernorm", 4, seed, pn_small, failed=pn_fail), run("powernorm", 64, seed, 1.88)]
        return Runs(out)

    res, md = s4.analyze(runs(3.0, 2.37, False))
    verdicts = {k: v for k, (v, _) in res["verdicts"].items()}
    # F and P2 could not fail: restated as observations, their rule's word in the text
    assert verdicts == {"F": "observation", "P1": "confirmed", "P2": "observation", "replication": "reproduced"}, md
    assert "by its rule: partly" in res["verdicts"]["F"][1] and "by its rule: confirmed" in res["verdicts"]["P2"][1]
    res, _ = s4.analyze(runs(1.2, 2.6, False))
    assert "by its rule: not at this scale" in res["verdicts"]["F"][1]
    assert "by its rule: partly" in res["verdicts"]["P2"][1]
    res, _ = s4.analyze(runs(1.2, 2.6, True))
    assert "by its rule: not at this scale" in res["verdicts"]["P2"][1] and res["precondition"][0]["status"] == "none"
