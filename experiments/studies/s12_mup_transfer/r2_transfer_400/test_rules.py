"""S12 round 2's pre-registered rules on made-up runs: the words come out as the rules say for runs made to confirm
and to contradict each claim, with the premise absent, and with standard runs that this commit does not reproduce
(the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import math

import pytest

from experiments.common.study import Runs
from experiments.studies.s12_mup_transfer.r2_transfer_400 import analyze as s12


def parabolas(arm: str, slope: float, seeds: tuple[int, ...]) -> list[dict]:
    """One arm's runs: loss-vs-lr parabolas on log10(lr) whose vertex moves by ``slope`` (plus a little per seed)
    per doubling of width from 1e-2 at width 32; at width 32 the two arms are the same model (the same losses)."""
    out = []
    for w in s12.WIDTHS:
        for s in seeds:
            moved = 0.0 if w == s12.BASE else (slope + 0.01 * (s - 1)) * math.log2(w / s12.BASE)
            for lr in s12.LRS:
                loss = 2.0 + 0.3 * (1 + 0.05 * s) * (math.log10(lr) + 2 - moved) ** 2 - 0.01 * math.log2(w)
                out.append({"name": s12.TAG, "parametrization": None if arm == "standard" else "mup",
                            "norm": "rmsnorm", "qk_norm": "none", "z_loss": 0, "dim": w, "seed": s, "lr": lr,
                            "final_val_loss": loss, "diverged": False, "status": "completed", "loss_init": 4.48,
                            "unigram_loss": 3.3, "max_attn_logit": 10.0})
    return out


def judge(mup_slope: float, std_slope: float = -0.42, **kw) -> tuple[dict, dict, str]:
    res, md = s12.analyze(Runs(parabolas("mup", mup_slope, s12.SEEDS["mup"])),
                          Runs(parabolas("standard", std_slope, s12.SEEDS["standard"])), **kw)
    return {k: w for k, (w, _) in res["verdicts"].items()}, res, md


def test_s12_r2_rules():
    words, res, md = judge(0.0)
    assert [g["status"] for g in res["precondition"]] == ["present", "present", "present"], md
    assert words == {"T1": "confirmed", "T2": "confirmed"}, md
    words, _, md = judge(-0.4)  # muP drifts as standard does
    assert words == {"T1": "not at this scale", "T2": "not at this scale"}, md
    words, res, md = judge(0.0, std_slope=0.0)  # no standard drift to remove: the gate
    assert res["precondition"][1]["status"] == "absent" and set(words.values()) == {"premise absent at this scale"}
    mup = Runs(parabolas("mup", 0.0, s12.SEEDS["mup"]))
    next(r for r in mup if r["dim"] == 32 and r["seed"] == 1)["final_val_loss"] += 1e-3  # the training changed
    res, md = s12.analyze(mup, Runs(parabolas("standard", -0.42, s12.SEEDS["standard"])))
    assert res["precondition"][0]["status"] == "absent", md
    assert {w for w, _ in res["verdicts"].values()} == {"not run: the standard runs do not reproduce"}
    mup[0].pop("max_attn_logit")
    with pytest.raises(SystemExit, match="attention logit"):
        s12.analyze(mup)


def test_s12_r2_reads_s3s_committed_standard_runs_as_its_premise():
    """S3 rounds 4-5's RMSNorm runs at widths 32-128: 3 seeds x 6 lrs x 3 widths, their slope wholly below -0.1."""
    standard = s12.standard_runs()
    assert len(standard) == 54 and {r["dim"] for r in standard} == set(s12.WIDTHS)
    mup = Runs({**r, "parametrization": "mup"} for r in standard if r["dim"] == s12.BASE)  # muP at 32 = standard
    mup += Runs(parabolas("mup", 0.0, s12.SEEDS["mup"]))[len(s12.LRS) * 5:]  # the made-up runs above width 32
    res, md = s12.analyze(Runs(r for r in mup if r["dim"] != s12.BASE or r["seed"] in s12.SEEDS["standard"]))
    assert res["precondition"][0]["status"] == "present" and res["precondition"][1]["status"] == "present", md
    assert res["precondition"][1]["interval"][1] < -0.1, md
