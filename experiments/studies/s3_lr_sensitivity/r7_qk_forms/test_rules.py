"""S3 round 7's pre-registered rules on made-up runs: the arms read from the runs' settings, the verdict words as
the rules say for runs made to confirm and to contradict each claim, and the gate on attention-logit growth."""

from __future__ import annotations

import math

from experiments.common.study import Runs


def _runs(width: dict[str, float], logit_none: float = 1e3) -> Runs:
    """Loss-vs-lr bowls around 1e-2, their walls ``width[arm]`` nats per decade; max logit 10 with QK-norm."""
    from experiments.studies.s3_lr_sensitivity.r7_qk_forms import analyze as r7

    spec = {"none": ("none", "head"), "head": ("rmsnorm", "head"), "flat": ("rmsnorm", "flat"), "l2": ("l2", "head")}
    out = []
    for a, (qk, axis) in spec.items():
        for s in r7.SEEDS:
            for lr in r7.LRS:
                loss = 1.8 + width[a] * (1 + 0.05 * s) * abs(math.log10(lr / 1e-2))
                out.append({"qk_norm": qk, "settings": {"model": {"qk_norm_axis": axis}}, "tags": [r7.TAG],
                            "lr": lr, "seed": s, "final_val_loss": loss, "diverged": False, "status": "completed",
                            "unigram_loss": 3.26, "loss_init": 4.48, "norm": "rmsnorm", "max_steps": 400,
                            "max_attn_logit": logit_none if a == "none" else 10.0})
    return Runs(out)


def _words(res: dict) -> dict[str, str]:
    return {k: w for k, (w, _) in res["verdicts"].items()}


def test_s3_r7_rules():
    from experiments.studies.s3_lr_sensitivity.r7_qk_forms import analyze as r7

    res, md = r7.analyze(_runs({"none": 0.3, "head": 0.1, "flat": 0.1, "l2": 0.11}))
    assert _words(res) == {"R": "confirmed", "A": "confirmed", "L": "confirmed", "LH": "confirmed"}, md
    res, md = r7.analyze(_runs({"none": 0.3, "head": 0.1, "flat": 0.2, "l2": 0.3}))
    assert _words(res) == {"R": "confirmed", "A": "not at this scale", "L": "not at this scale",
                           "LH": "not at this scale"}, md
    res, md = r7.analyze(_runs({"none": 0.3, "head": 0.1, "flat": 0.1, "l2": 0.1}, logit_none=50.0))
    assert set(_words(res).values()) == {"premise absent at this scale"}, md
    verdicts = r7.engine(_runs({"none": 0.3, "head": 0.1, "flat": 0.1, "l2": 0.11}))
    assert {c["arm"] for c in verdicts["comparisons"]} == {"none", "flat", "l2"}
    assert verdicts.get("stability")
