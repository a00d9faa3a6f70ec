"""S10 round 1's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs


def test_s10_r1_mixln_rules():
    """S10's pre-registered rules on made-up runs: gradient tilt, deep-layer importance and loss."""
    from experiments.studies.s10_mixln.r1_mixln import analyze as s10

    assert s10.tilt([4, 4, 3, 2, 1, 1, 1, 1]) == pytest.approx(4.0)

    def run(placement, L, seed, grad, drop, loss):
        curves = {f"layer/{i}/grad_norm": [(300, grad(i)), (400, grad(i))] for i in range(L)}
        return {"placement": placement, "n_layers": L, "seed": seed, "final_val_loss": loss, "diverged": False,
                "curves": curves, "layer_drop": {"loss": loss, "drop": [drop(i) for i in range(L)]}}

    idle = {12: lambda i: 0.04 if i < 6 else 0.005, 24: lambda i: 0.04 if i < 12 else 0.005}  # the curse of depth
    shapes = {"pre": (lambda i: 1.0 / (1 + i), None, 2.10),
              "post": (lambda i: 0.1 * (1 + i), lambda i: 0.05, 2.20),
              "mix": (lambda i: 1.0, lambda i: 0.03, 2.05)}

    def runs_of(shapes, pre_drop=None):
        return Runs(run(p, L, s, shapes[p][0], shapes[p][1] or (pre_drop or idle)[L], shapes[p][2])
                    for p in s10.PLACEMENTS for L in s10.DEPTHS for s in (0, 1))

    res, md = s10.analyze(runs_of(shapes))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"M1": "confirmed", "M2": "confirmed",
                                                              "M3": "confirmed"}, md
    assert res["precondition"][0]["status"] == "present" and "6 of 6 parts, Holm-adjusted" in res["verdicts"]["M1"][1]
    res, _ = s10.analyze(runs_of(shapes, {L: (lambda i: 0.01) for L in s10.DEPTHS}))  # deep layers not idle
    assert res["precondition"][0]["status"] == "absent" and res["verdicts"]["M1"][0] == "confirmed"
    assert res["verdicts"]["M2"][0] == res["verdicts"]["M3"][0] == "premise absent at this scale"
    assert "by its rule: confirmed" in res["verdicts"]["M2"][1]
    shapes["mix"] = (lambda i: 1.0 / (1 + i), lambda i: 0.005, 2.11)  # Mix-LN behaves as Pre-LN
    res, _ = s10.analyze(runs_of(shapes))
    assert res["verdicts"]["M1"][0] == "partly" and res["verdicts"]["M2"][0] == res["verdicts"]["M3"][0] == (
        "not at this scale")
