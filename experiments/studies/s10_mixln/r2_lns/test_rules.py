"""S10 round 2's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

from experiments.common.study import Runs


def test_s10_r2_lns_rules():
    """S10 round 2's pre-registered rules on made-up runs: LayerNorm Scaling against Pre-LN."""
    from experiments.studies.s10_mixln.r2_lns import analyze as lns

    def run(placement, L, seed, resid, drop, loss, tags=()):
        curves = {f"layer/{i}/resid_rms": [(400, resid(i))] for i in range(L)}
        curves |= {f"layer/{i}/grad_norm": [(400, 1.0)] for i in range(L)}
        drops = drop if isinstance(drop, list) else [drop] * L
        return {"placement": placement, "n_layers": L, "seed": seed, "final_val_loss": loss, "diverged": False,
                "tags": list(tags), "curves": curves, "layer_drop": {"loss": loss, "drop": drops}}

    def runs(lns_growth, lns_drop, lns_loss, pre_idle=True):
        out = []
        for L in (12, 24):
            pre_drop = [0.04] * (L // 2) + [0.005] * (L // 2) if pre_idle else 0.01
            for s in (0, 1):
                out += [run("pre", L, s, lambda i: 1.2 ** i, pre_drop, 2.10),
                        run("mix", L, s, lambda i: 1.0, 0.02, 2.08),
                        run("pre", L, s, lambda i: lns_growth ** i, lns_drop, lns_loss, tags=["lns"])]
        return Runs(out)

    res, md = lns.analyze(runs(1.05, 0.02, 2.05))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"C1": "observation", "C2": "confirmed",
                                                              "C3": "confirmed"}, md
    assert [g["status"] for g in res["precondition"]] == ["present", "present"]
    res, _ = lns.analyze(runs(1.2, 0.005, 2.10))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"C1": "observation", "C2": "not at this scale",
                                                              "C3": "not at this scale"}
    res, _ = lns.analyze(runs(1.05, 0.02, 2.05, pre_idle=False))  # Pre-LN's deep layers work: no premise
    assert res["verdicts"]["C2"][0] == res["verdicts"]["C3"][0] == "premise absent at this scale"
    assert "by its rule: confirmed" in res["verdicts"]["C3"][1]
