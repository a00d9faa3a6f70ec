"""S4 round 5's pre-registered rules on made-up runs (confirming, contradicting, the premise absent), and the
construction its GS arm rests on (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest
import torch

from experiments.common.study import Runs
from experiments.studies.s4_batchnorm.r5_powernorm_parts import analyze as s4

OPTIONS = {"PN-G": {"warmup_steps": 0, "alpha_fwd": 0.9, "alpha_bwd": 0.9},
           "GS+batch": {"warmup_steps": 400, "alpha_fwd": 0.9, "alpha_bwd": 0.9},
           "GS": {"warmup_steps": 0, "alpha_fwd": 1.0, "alpha_bwd": 1.0}}


def made_up(loss: dict[str, float], bn_fails: int = 5, fail: str | None = None) -> Runs:
    """Every cell of the round; ``loss`` per arm at batch 4 (batch 64: 1.9 for every arm), a per-seed wobble shared
    by the arms of a seed; BN's first ``bn_fails`` seeds diverge at batch 4; ``fail``: an arm whose seed 0 fails."""
    out = []
    for a in s4.ARMS:
        norm = {"BN": "batchnorm", "LN": "layernorm"}.get(a, "powernorm")
        options = {"group_scaling": 1, "stats": "pooled", **OPTIONS[a]} if norm == "powernorm" else {}
        for b, seeds in s4.SEEDS.items():
            for c in (False, True) if b == 4 and a in s4.CLIPPED else (False,):
                for s in seeds:
                    broken = (b == 4 and a == "BN" and s < bn_fails) or (b == 4 and a == fail and s == 0)
                    val = 1.9 if b == 64 else loss[a] + 0.01 * s + (0.002 * s if c else 0.0)
                    out.append({"norm": norm, "norm_options": options, "batch_size": b, "seed": s,
                                "grad_clip": s4.CLIP if c else None, "final_val_loss": None if broken else val,
                                "diverged": broken, "status": "diverged" if broken else "completed",
                                "loss_init": 4.48, "unigram_loss": 3.3, "max_grad_norm": 2.0})
    return Runs(out)


def words(runs: Runs) -> dict[str, str]:
    return {k: w for k, (w, _) in s4.analyze(runs)[0]["verdicts"].items()}


def test_s4_r5_rules():
    equal = {"BN": 2.3, "LN": 2.3, "PN-G": 2.31, "GS": 2.3, "GS+batch": 2.5}  # group scaling does it, batch stats cost
    res, md = s4.analyze(made_up(equal))
    assert res["precondition"][0]["status"] == "present", md
    assert words(made_up(equal)) == {"F1": "confirmed", "F2": "confirmed", "F3": "confirmed"}, md
    assert res["clip_effect"]["GS"]["diff"] == pytest.approx(0.004)  # clipped - unclipped, paired by seed
    apart = {"BN": 2.3, "LN": 2.3, "PN-G": 2.2, "GS": 2.4, "GS+batch": 2.1}  # the running mean matters
    assert words(made_up(apart)) == {"F1": "partly", "F2": "not at this scale", "F3": "not at this scale"}
    assert words(made_up(equal, fail="GS"))["F1"] == "not at this scale"
    assert set(words(made_up(equal, bn_fails=0)).values()) == {"premise absent at this scale"}
    assert set(words(made_up(equal, bn_fails=2)).values()) == {"premise absent at this scale"}  # fewer than 3 of 5
    stalled = made_up(equal)  # a run that completes but stalls above the unigram loss enters at ln V
    row = next(r for r in stalled if r["norm"] == "layernorm" and r["batch_size"] == 4 and r["seed"] == 1)
    row["final_val_loss"] = 3.5
    (ln,) = [c for c in s4.analyze(stalled)[0]["cells"] if (c["arm"], c["batch"], c["clipped"]) == ("LN", 4, False)]
    assert ln["value"][1] == 4.48 and ln["value"][2] == pytest.approx(2.32)
    runs = made_up(equal)
    runs[0].pop("max_grad_norm")
    with pytest.raises(SystemExit, match="max grad norm"):
        s4.analyze(runs)


def test_the_gs_arm_is_each_token_over_its_rms_times_weight_plus_bias():
    """alpha_fwd = alpha_bwd = 1: psi stays 1 and nu 0, so forward and backward are RMSNorm's with a bias (eps inside,
    over sqrt(1 + eps)), step after step."""
    from minillm.norms.batch import PowerNorm

    torch.manual_seed(0)
    pn = PowerNorm(8, alpha_fwd=1.0, alpha_bwd=1.0, group_scaling=1, stats="pooled").train()
    with torch.no_grad():
        pn.weight.uniform_(0.5, 1.5)
        pn.bias.uniform_(-0.1, 0.1)
    for step in range(3):
        x = (torch.randn(4, 5, 8) * (1 + step)).requires_grad_()
        g = torch.randn(4, 5, 8)
        pn(x).backward(g)
        x2 = x.detach().clone().requires_grad_()
        ref = x2 * torch.rsqrt(x2.pow(2).mean(-1, keepdim=True) + pn.eps) / (1 + pn.eps) ** 0.5 * pn.weight + pn.bias
        ref.backward(g)
        torch.testing.assert_close(pn(x.detach()), ref.detach(), rtol=0, atol=0)
        torch.testing.assert_close(x.grad, x2.grad, rtol=0, atol=0)
    assert pn.running_psi2.eq(1).all() and pn.running_nu.eq(0).all()
