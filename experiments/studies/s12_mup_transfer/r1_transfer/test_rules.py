"""S12 round 1's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import math

import pytest

from experiments.common.study import Runs


def _mup_runs(mup_slope: float, std_slope: float = -0.4, qk_flatter: float = 0.5, ln_gap: float = 0.0,
              logits_grow: bool = True) -> Runs:
    """S12 r1 runs: loss-vs-lr parabolas on log10(lr) whose vertex moves by the arm's slope per doubling of width
    from 1e-2 at width 32 (mup-ln: mup's slope + ``ln_gap``); mup+qk's curvature ``qk_flatter`` times mup's."""
    from experiments.studies.s12_mup_transfer.r1_transfer import analyze as s12

    slopes = {"standard": std_slope, "mup": mup_slope, "mup+qk": mup_slope, "mup-ln": mup_slope + ln_gap}
    out = []
    for arm, (param, norm, qk) in s12.ARMS.items():
        for w in s12.WIDTHS:
            for s in s12.SEEDS:
                vertex = -2 + (slopes[arm] + 0.01 * (s - 1)) * math.log2(w / 32)
                curv = 0.3 * (qk_flatter if arm == "mup+qk" else 1.0) * (1 + 0.05 * s)
                for lr in s12.LRS:
                    logit = 5.0 if arm == "mup+qk" or not logits_grow else 500.0
                    out.append({"parametrization": param, "norm": norm, "qk_norm": qk, "dim": w, "seed": s, "lr": lr,
                                "tags": [s12.TAG], "final_val_loss": 2.0 + curv * (math.log10(lr) - vertex) ** 2,
                                "diverged": False, "status": "completed", "loss_init": 4.48, "unigram_loss": 3.3,
                                "max_attn_logit": logit, "n_params": 1000 * w})
    return Runs(out)


def test_s12_r1_mup_transfer_rules():
    from experiments.studies.s12_mup_transfer.r1_transfer import analyze as s12

    res, md = s12.analyze(_mup_runs(0.0))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert res["precondition"][0]["status"] == "present", md
    assert words == {"T1": "confirmed", "N": "confirmed", "Q width 32": "confirmed", "Q width 64": "confirmed",
                     "Q width 128": "confirmed"}, md
    words = {k: w for k, (w, _) in s12.analyze(_mup_runs(-0.3, ln_gap=0.3, qk_flatter=1.5))[0]["verdicts"].items()}
    assert words["T1"] == words["N"] == "not at this scale" and words["Q width 64"] == "not at this scale"
    res, md = s12.analyze(_mup_runs(0.0, std_slope=0.0, logits_grow=False))  # standard transfers too: the gate
    assert {w for w, _ in res["verdicts"].values()} == {"premise absent at this scale"}, md
    runs = Runs(r for r in _mup_runs(0.0) if r["norm"] != "layernorm")  # the arm left out for the budget
    assert s12.analyze(runs)[0]["verdicts"]["N"][0] == "not run"
    words = {k: w for k, (w, _) in s12.analyze(Runs(r for r in runs if r["qk_norm"] == "none"))[0]["verdicts"].items()}
    assert words == {"T1": "confirmed", "N": "not run", "Q width 32": "not run", "Q width 64": "not run",
                     "Q width 128": "not run"}
    res, md = s12.analyze(Runs(r for r in runs if r["parametrization"] == "standard"))  # the gate alone
    assert res["precondition"][0]["status"] == "present" and set(w for w, _ in res["verdicts"].values()) == {
        "not run"}, md
    runs[0].pop("max_attn_logit")
    with pytest.raises(SystemExit, match="attention logit"):
        s12.analyze(runs)
