"""S10 round 4's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import math

import pytest

from experiments.common.study import Runs


def _lns_runs(lns_gain: float, deep_drop_pre: float, lns_deep_factor: float) -> Runs:
    """S10 r4 runs: Pre-LN, Mix-LN and LNS over 5 seeds; LNS better than both by ``lns_gain``; Pre-LN's deep blocks
    cost ``deep_drop_pre`` (early ones 0.1); LNS's deep blocks cost ``lns_deep_factor`` times Pre-LN's."""
    from experiments.studies.s10_mixln.r4_lns_budget import analyze as r4

    out = []
    for variant in r4.VARIANTS:
        for s in r4.SEEDS:
            noise = 0.002 * ((s * 7) % 5 - 2)
            loss = 1.60 + noise - (lns_gain if variant == "pre+LNS" else 0.0) + (0.01 if variant == "mix" else 0.0)
            deep = deep_drop_pre * (lns_deep_factor if variant == "pre+LNS" else 1.0) * (1 + 0.02 * s)
            drops = [0.1] * 6 + [deep] * 6
            curves = {f"layer/{i}/resid_rms": [(6700, 1.0 + 0.5 * i)] for i in range(r4.DEPTH)}
            out.append({"placement": "mix" if variant == "mix" else "pre", "n_layers": r4.DEPTH, "seed": s,
                        "tags": ["plain", *(["lns"] if variant == "pre+LNS" else [])], "final_val_loss": loss,
                        "diverged": False, "status": "completed", "unigram_loss": 3.26, "loss_init": 4.48,
                        "n_params": 341_424, "layer_drop": {"drop": drops}, "curves": curves})
    return Runs(out)


def test_s10_r4_lns_budget_rules():
    from experiments.studies.s10_mixln.r4_lns_budget import analyze as r4

    res, md = r4.analyze(_lns_runs(0.05, 0.01, 3.0))  # idle deep layers (0.1 of the early ones), LNS wins
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert res["precondition"][0]["status"] == "present", md
    assert words == {"B1": "confirmed", "B2": "confirmed", "B3": "confirmed", "overall": "3 of 3 parts"}, md
    assert res["precondition"][1]["status"] == "present"  # r_L / r_1 = 6.5 >= sqrt(12)
    res, md = r4.analyze(_lns_runs(-0.05, 0.01, 0.2))  # premise present, LNS worse: not at this scale
    assert {k: w for k, (w, _) in res["verdicts"].items()}["B1"] == "not at this scale", md
    res, md = r4.analyze(_lns_runs(-0.05, 0.08, 0.2))  # deep blocks not idle: the gate
    assert res["precondition"][0]["status"] == "absent"
    assert all(w == "premise absent at this scale" for w, _ in res["verdicts"].values()), md
    runs = _lns_runs(0.05, 0.01, 3.0)
    runs[0]["layer_drop"] = None
    with pytest.raises(SystemExit, match="layer drop"):
        r4.analyze(runs)
    assert math.isfinite(res["cells"]["pre"]["val"][0])
