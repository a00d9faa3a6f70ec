"""S5 round 3's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs


def _peri_runs(pre_growth: float, peri_factor: float, peri_gap: float) -> Runs:
    """S5 r3 runs: Pre-LN's stream grows ``pre_growth`` over its 12 blocks, Peri-LN's ``peri_factor`` times that;
    Peri-LN ``peri_gap`` nats from Pre-LN; lr 1e-3 better than 3e-3 by 0.05 for both."""
    from experiments.studies.s5_precision.r3_peri_recipe import analyze as r3

    out = []
    for p in r3.PLACEMENTS:
        for lr in r3.LRS:
            for s in r3.SEEDS:
                growth = pre_growth * (peri_factor if p == "peri" else 1.0) * (1 + 0.03 * s)
                curves = {f"layer/{i}/resid_rms": [(r3.STEPS, 1.0 + (growth - 1.0) * i / (r3.DEPTH - 1))]
                          for i in range(r3.DEPTH)}
                loss = 1.9 + (peri_gap if p == "peri" else 0.0) + (0.05 if lr == 3e-3 else 0.0) + 0.003 * s
                out.append({"placement": p, "lr": lr, "seed": s, "n_layers": r3.DEPTH, "tags": [r3.TAG],
                            "final_val_loss": loss, "diverged": False, "status": "completed", "curves": curves,
                            "unigram_loss": 3.26, "loss_init": 4.48})
    return Runs(out)


def test_s5_r3_peri_recipe_rules():
    from experiments.studies.s5_precision.r3_peri_recipe import analyze as r3

    res, md = r3.analyze(_peri_runs(6.0, 0.3, -0.03))  # 6 >= sqrt(12): the premise
    assert res["precondition"][0]["status"] == "present" and res["chosen_lr"] == {"pre": 1e-3, "peri": 1e-3}, md
    assert {k: w for k, (w, _) in res["verdicts"].items()} == {"P1": "confirmed", "P2": "confirmed"}, md
    res, md = r3.analyze(_peri_runs(6.0, 1.0, 0.2))
    assert {k: w for k, (w, _) in res["verdicts"].items()} == {"P1": "not at this scale", "P2": "not at this scale"}
    res, md = r3.analyze(_peri_runs(2.0, 0.3, -0.03))  # Pre-LN's stream grows less than sqrt(12): the gate
    assert {w for w, _ in res["verdicts"].values()} == {"premise absent at this scale"}, md
    runs = _peri_runs(6.0, 0.3, -0.03)
    runs[0]["curves"] = {}
    with pytest.raises(SystemExit, match="residual RMS"):
        r3.analyze(runs)
