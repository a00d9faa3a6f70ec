"""S4 round 4's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs
from experiments.studies.s4_batchnorm.r3_powernorm_nogroup.test_rules import pn_runs


def test_s4_r4_powernorm_paper_rules():
    """Round 3's made-up runs, clipped: the gates read first, the isolation said only with both gates and R1."""
    from experiments.studies.s4_batchnorm.r4_powernorm_paper import analyze as r4

    def clipped(runs: Runs, pn64: float = 0.0) -> Runs:
        for r in runs:
            r.update(grad_clip=r4.CLIP, max_grad_norm=3.0)
            if r["norm"] == "powernorm" and not r["norm_options"]["group_scaling"] and r["batch_size"] == 64:
                r["final_val_loss"] += pn64
        return runs

    def words(res: dict) -> dict:
        return {k: w for k, (w, _) in res["verdicts"].items()}

    res, md = r4.analyze(clipped(pn_runs(-0.03, bn_fails=5)))
    assert [g["status"] for g in res["precondition"]] == ["present", "present"], md
    assert words(res) == {"C": "clipping does not remove it", "R1": "confirmed", "R2": "confirmed", "R3": "confirmed",
                          "isolation": "isolated"}, md
    res, md = r4.analyze(clipped(pn_runs(-0.03, bn_fails=5), pn64=0.5))  # PN does not train at batch 64: G1
    assert res["precondition"][0]["status"] == "absent" and words(res)["isolation"] == "not isolated", md
    assert words(res)["R1"] == words(res)["R2"] == "premise absent at this scale"
    res, md = r4.analyze(clipped(pn_runs(-0.03, bn_fails=0)))  # clipping alone removes BatchNorm's failure
    assert words(res)["C"] == "clipping removes it" and words(res)["R1"] == "premise absent at this scale", md
    with pytest.raises(SystemExit, match="clipped"):  # unclipped runs (round 3's) are not this round's
        r4.analyze(pn_runs(-0.03, bn_fails=5))
    runs = clipped(pn_runs(-0.03, bn_fails=5))
    runs[0].pop("max_grad_norm")
    with pytest.raises(SystemExit, match="max grad norm"):
        r4.analyze(runs)
