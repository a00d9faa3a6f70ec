"""S4 round 3's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

from experiments.common.study import Runs


def pn_runs(pn_offset: float, bn_fails: int, pn_fails: int = 0, pn_g_offset: float = 0.0) -> Runs:
    """S4 r3 runs at batch 4 and 64: LayerNorm at 2.35 / 1.87, BatchNorm failing in ``bn_fails`` seeds at batch 4,
    PowerNorm without group scaling ``pn_offset`` from LayerNorm (``pn_fails`` failed), with it ``pn_g_offset``."""
    from experiments.studies.s4_batchnorm.r3_powernorm_nogroup import analyze as r3

    out = []
    for norm, group, offset in (("layernorm", None, 0.0), ("batchnorm", None, 0.02), ("powernorm", 0, pn_offset),
                                ("powernorm", 1, pn_g_offset)):
        for batch in (4, 64):
            for s in r3.SEEDS:
                loss = (2.35 if batch == 4 else 1.87) + offset + 0.003 * ((s * 3) % 5 - 2)
                if batch == 4 and ((norm == "batchnorm" and s < bn_fails) or (norm, group) == ("powernorm", 0)
                                   and s < pn_fails):
                    loss = 3.5
                options = {} if group is None else {"group_scaling": group}
                out.append({"norm": norm, "norm_options": options, "batch_size": batch, "seed": s, "diverged": False,
                            "status": "completed", "final_val_loss": loss, "unigram_loss": 3.26, "loss_init": 4.48})
    return Runs(out)


def test_s4_r3_powernorm_nogroup_rules():
    from experiments.studies.s4_batchnorm.r3_powernorm_nogroup import analyze as r3

    words = lambda res: {k: w for k, (w, _) in res["verdicts"].items()}  # noqa: E731
    res, md = r3.analyze(pn_runs(-0.03, bn_fails=5))
    assert res["precondition"][0]["status"] == "present"
    assert words(res) == {"Q1": "confirmed", "Q2": "confirmed", "Q3": "confirmed"}, md
    res, md = r3.analyze(pn_runs(0.3, bn_fails=4, pn_fails=2))
    assert words(res)["Q1"] == "not at this scale" and words(res)["Q2"] == "not at this scale", md
    assert words(res)["Q3"] == "not at this scale"
    res, md = r3.analyze(pn_runs(0.3, bn_fails=0, pn_fails=2))
    assert res["precondition"][0]["status"] == "absent"
    assert words(res)["Q1"] == words(res)["Q2"] == "premise absent at this scale", md
    assert words(res)["Q3"] == "not at this scale"  # parity at batch 64 is not gated
