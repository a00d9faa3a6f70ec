"""S10 round 3's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs


def test_s10_r3_lns_why_rules():
    """S10 round 3's pre-registered rules on made-up runs and measures; the deep input scale from a real model."""
    from experiments.studies.s10_mixln.r3_lns_why import analyze as lns_why
    from minillm.model import ModelConfig, Transformer

    def runs(unscaled_gap, long_gap, lns_scale, pre_deep=0.004):
        out = []
        for tags, gap in (([], 0.16), (["unscaled"], unscaled_gap), (["long"], long_gap)):
            for lns in (False, True):
                for seed in (0, 1):
                    deep = pre_deep * (1 + 0.1 * seed) if not lns else pre_deep * (0.8 if unscaled_gap < 0.05 else 0.1)
                    drop = [0.02] * 12 + [deep] * 12
                    scale = lns_scale if lns else 1.0
                    out.append({"placement": "pre", "tags": tags + (["lns"] if lns else []), "seed": seed,
                                "n_layers": 24, "final_val_loss": 2.2 + (gap if lns else 0.0), "diverged": False,
                                "status": "completed", "loss_init": 4.5, "unigram_loss": 3.3, "curves": {},
                                "measures": {"drop": drop, "deep_input_scale": scale}})
        return Runs(out)

    res, md = lns_why.analyze(runs(0.02, 0.05, 0.3))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"R1": "confirmed", "R2": "confirmed",
                                                               "R3": "observation"}, md
    assert "by its rule: confirmed" in res["verdicts"]["R3"][1] and res["precondition"][0]["status"] == "present"
    res, _ = lns_why.analyze(runs(0.15, 0.15, 0.9))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"R1": "not at this scale", "R2": "not at this scale",
                                                               "R3": "observation"}
    res, _ = lns_why.analyze(runs(0.02, 0.05, 0.3, pre_deep=0.02))  # Pre-LN's deep blocks as busy as its first
    assert res["verdicts"]["R1"][0] == res["verdicts"]["R2"][0] == "premise absent at this scale"
    from minillm.training.optim import lr_lambda

    assert lns_why.adam_bound(400) == pytest.approx(1 + 1e-3 * sum(lr_lambda("cosine", 40, 400, 0.1)(t)
                                                                   for t in range(400)))
    assert res["adam_bound"]["400"] == pytest.approx(0.235 * lns_why.adam_bound(400), rel=1e-3)
    assert max(res["adam_bound"].values()) < lns_why.SMALL  # R3 could not fail
    cfg = dict(vocab_size=16, dim=8, n_layers=4, n_heads=2, max_seq_len=8)
    plain, scaled = Transformer(ModelConfig(**cfg)), Transformer(ModelConfig(**cfg, layernorm_scaling=True))
    assert lns_why.deep_input_scale(plain) == pytest.approx(1.0)  # gains start at 1
    assert lns_why.deep_input_scale(scaled) == pytest.approx((3 ** -0.5 + 4 ** -0.5) / 2)  # blocks 3 and 4
