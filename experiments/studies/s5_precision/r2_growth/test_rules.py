"""S5 round 2's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

from experiments.common.study import Runs


def test_s5_r2_growth_shape_and_rules():
    """S5 round 2's pre-registered measures on made-up residual profiles: the shape fit tells exponential from
    linear growth, and the verdicts follow the rules."""
    from experiments.studies.s5_precision.r2_growth import analyze as g

    assert g.shape([1.2 ** i for i in range(24)]) == "exponential"
    assert g.shape([1 + 0.5 * i for i in range(24)]) == "linear"
    assert g.shape([1.0] * 6) == "either"

    def run(placement, L, seed, end, early, loss, tune=False):
        curves = {f"layer/{i}/resid_rms": [(g.EARLY, early(i)), (400, end(i))] for i in range(L)}
        return {"placement": placement, "n_layers": L, "seed": seed, "lr": 3e-3, "final_val_loss": loss,
                "diverged": False, "loss_init": 4.5, "tags": ["growth_tune" if tune else f"growth_{placement}"],
                "curves": curves}

    def runs(pre_rate):
        out = [run(p, g.TUNE_DEPTH, g.TUNE_SEED, lambda i: 1.0, lambda i: 1.0, 2.5, tune=True) for p in g.PLACEMENTS]
        for L in g.DEPTHS:
            for s in g.SEEDS:
                out.append(run("pre", L, s, lambda i: pre_rate ** i, lambda i: 1 + 0.01 * i, 2.10))
                out.append(run("peri", L, s, lambda i: 1 + 0.1 * i, lambda i: 1 + 0.1 * i, 2.05))
                out.append(run("post", L, s, lambda i: 1.0 + 0.001 * i, lambda i: 1.0, 2.2))
        return Runs(out)

    res, md = g.analyze(runs(1.2))
    verdicts = {k: v for k, (v, _) in res["verdicts"].items()}
    assert verdicts == {"G1": "confirmed", "G2": "confirmed", "G3": "confirmed", "G4": "confirmed", "L": "confirmed",
                        "control": "holds"}, md
    assert res["precondition"][0]["status"] == "present" and res["precondition"][1]["status"] == "not recorded"
    assert "4 of 4 parts, Holm-adjusted" in res["verdicts"]["G4"][1]
    res, _ = g.analyze(runs(1.0))  # Pre-LN flat: nothing grows, so the premise of G1-G3 and L is absent
    verdicts = {k: v for k, (v, _) in res["verdicts"].items()}
    assert res["precondition"][0]["status"] == "absent"
    assert verdicts["G1"] == verdicts["G2"] == verdicts["G3"] == verdicts["L"] == "premise absent at this scale"
    assert "by its rule: not at this scale" in res["verdicts"]["G1"][1] and verdicts["G4"] == "not at this scale"
