"""The rounds pre-registered with a precondition gate, on made-up runs (PREREGISTERED: those not yet run): each
analysis gives the words its rules say for runs made to confirm a claim, to contradict it and to lack its premise,
and stops when a run lacks what the rules read (tests/test_study_rules.py does the same for the earlier rounds)."""

from __future__ import annotations

import json
import math

import pytest

from experiments.common import prereg
from experiments.common.layout import STUDIES, analyses
from experiments.common.study import Runs

PREREGISTERED: tuple[str, ...] = ("s8_dyt/r4_derf",)


def test_preregistered_rounds_say_so_and_are_not_analyses_yet():
    """The rounds whose verdict.json says "pre-registered, not yet run" are exactly PREREGISTERED (a round run since
    leaves the list with its data commit); each has its analyze.py and no committed runs (so the slow regenerate
    test does not look for results that cannot exist yet)."""
    saying_so = {str(v.parent.relative_to(STUDIES)) for v in STUDIES.glob("*/*/verdict.json")
                 if json.loads(v.read_text())["verdict"].startswith(f"**{prereg.NOT_RUN}**")}
    assert saying_so == set(PREREGISTERED)
    found = {str(r.relative_to(STUDIES)) for r in analyses()}
    for name in PREREGISTERED:
        folder = STUDIES / name
        assert json.loads((folder / "verdict.json").read_text())["verdict"].startswith(f"**{prereg.NOT_RUN}**")
        assert (folder / "analyze.py").exists() and name not in found


def test_prereg_helpers():
    assert prereg.steps_for(20, 341_424) == 6700
    assert prereg.tokens_per_parameter(6700, 341_424) == pytest.approx(20.1, abs=0.05)
    est = prereg.estimate(15, 6.9e6, 7000, extra_s=900)
    assert est["hours"] == pytest.approx((8 * 6.9e6 / 7000 + 900) / 3600)
    assert prereg.diffs({0: 2.0, 1: 2.1, 2: 5.0}, {0: 1.0, 1: 1.0}) == pytest.approx([1.0, 1.1])
    with pytest.raises(SystemExit, match="lack the metric"):
        prereg.require([{"seed": 0}], "the metric", lambda r: "x" in r)


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


def _dyt_runs(gap: float, per_site: float, saturated: float = 0.05) -> tuple[Runs, dict]:
    """S8 r3 runs: RMSNorm, uniform DyT ``gap`` behind it, the per-site arms ``per_site`` from uniform DyT; every DyT
    run's end-of-training saturation ``saturated``."""
    from experiments.studies.s8_dyt.r3_budget_per_site import analyze as r3

    out, sat = [], {}
    for _name, tag, norm, offset in (("rmsnorm", [], "rmsnorm", 0.0), ("uniform", [], "dyt", gap),
                                    ("attn 1.0", ["attn1"], "dyt", gap + per_site),
                                    ("attn 2.0", ["attn2"], "dyt", gap + per_site)):
        for s in r3.SEEDS:
            run = {"norm": norm, "seed": s, "tags": ["budget", *tag], "max_steps": r3.STEPS, "diverged": False,
                   "status": "completed", "final_val_loss": 1.7 + offset + 0.002 * ((s * 3) % 5 - 2),
                   "unigram_loss": 3.26, "loss_init": 4.48}
            out.append(run)
            if norm == "dyt":
                sat[r3.key(run)] = saturated
    return Runs(out), sat


def test_s8_r3_budget_per_site_rules():
    from experiments.studies.s8_dyt.r3_budget_per_site import analyze as r3

    res, md = r3.analyze(*_dyt_runs(0.005, -0.03))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words["D3"] == "confirmed" and words["D4a"] == "confirmed" and words["D4b"] == "confirmed", md
    assert words["D5"] == "contradicted", md  # the gap shrank from round 2's ~0.08 to ~0.005
    res, md = r3.analyze(*_dyt_runs(0.2, 0.02))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words["D3"] == "not at this scale" and words["D4a"] == "not at this scale" and words["D5"] == "confirmed"
    res, md = r3.analyze(*_dyt_runs(0.2, 0.02, saturated=0.001))
    assert all(w == "premise absent at this scale" for w, _ in res["verdicts"].values()), md
    runs, sat = _dyt_runs(0.005, -0.03)
    with pytest.raises(SystemExit, match="saturation"):
        r3.analyze(runs, {})


def _pn_runs(pn_offset: float, bn_fails: int, pn_fails: int = 0, pn_g_offset: float = 0.0) -> Runs:
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
    res, md = r3.analyze(_pn_runs(-0.03, bn_fails=5))
    assert res["precondition"][0]["status"] == "present"
    assert words(res) == {"Q1": "confirmed", "Q2": "confirmed", "Q3": "confirmed"}, md
    res, md = r3.analyze(_pn_runs(0.3, bn_fails=4, pn_fails=2))
    assert words(res)["Q1"] == "not at this scale" and words(res)["Q2"] == "not at this scale", md
    assert words(res)["Q3"] == "not at this scale"
    res, md = r3.analyze(_pn_runs(0.3, bn_fails=0, pn_fails=2))
    assert res["precondition"][0]["status"] == "absent"
    assert words(res)["Q1"] == words(res)["Q2"] == "premise absent at this scale", md
    assert words(res)["Q3"] == "not at this scale"  # parity at batch 64 is not gated


def _entropy_runs(collapsed: float, kept: float, logit_growth: float = 100.0, with_metric: bool = True) -> Runs:
    """S3 r3 runs: without QK-norm the final min entropy ``collapsed`` at lr 3e-1 (2.0 below), with it ``kept``;
    max attention logits 10 with QK-norm and 10 x ``logit_growth`` without."""
    from experiments.studies.s3_lr_sensitivity.r3_attn_entropy import analyze as r3

    out = []
    for norm in r3.NORMS:
        for qk in ("none", "layernorm"):
            for lr in r3.LRS:
                for s in r3.SEEDS:
                    e = (kept if qk != "none" else collapsed if lr == r3.TOP_LR else 2.0) * (1 + 0.05 * s)
                    curves = {f"layer/{i}/attn_entropy_min": [(390, e + i)] for i in range(4)} if with_metric else {}
                    out.append({"norm": norm, "qk_norm": qk, "lr": lr, "seed": s, "z_loss": 0.0, "diverged": False,
                                "status": "completed", "final_val_loss": 2.1, "unigram_loss": 3.26, "loss_init": 4.48,
                                "max_attn_logit": 10.0 * (logit_growth if qk == "none" else 1.0), "curves": curves})
    return Runs(out)


def test_s3_r3_attn_entropy_rules():
    from experiments.studies.s3_lr_sensitivity.r3_attn_entropy import analyze as r3

    res, md = r3.analyze(_entropy_runs(0.1, 1.5))
    assert res["precondition"][0]["status"] == "present"
    assert {w for w, _ in res["verdicts"].values()} == {"confirmed"}, md
    res, md = r3.analyze(_entropy_runs(1.5, 1.6))
    assert {w for w, _ in res["verdicts"].values()} == {"not at this scale"}, md
    res, md = r3.analyze(_entropy_runs(0.1, 1.5, logit_growth=2.0))
    assert {w for w, _ in res["verdicts"].values()} == {"premise absent at this scale"}, md
    with pytest.raises(SystemExit, match="attn_entropy_min"):
        r3.analyze(_entropy_runs(0.1, 1.5, with_metric=False))


def _width_runs(slope_ln: float, slope_rms: float, edge: bool = False, lrs: tuple | None = None) -> Runs:
    """S3 r4 runs: loss = 2 + (log10 lr - c)^2 with the best log10 lr c = -2 + slope x log2(width / 32) (+ a seed
    jitter), so the transfer slope is the one given; ``edge``: every best lr beyond the grid; ``lrs``: the grid
    (round 4's by default)."""
    from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4

    out = []
    for norm, k in (("layernorm", slope_ln), ("rmsnorm", slope_rms)):
        for w in r4.WIDTHS:
            for s in r4.SEEDS:
                c = (0.5 if edge else -2.0) + k * math.log2(w / 32) + 0.01 * s
                for lr in lrs or r4.LRS:
                    out.append({"norm": norm, "dim": w, "lr": lr, "seed": s, "qk_norm": "none", "z_loss": 0.0,
                                "final_val_loss": 2.0 + (math.log10(lr) - c) ** 2, "diverged": False,
                                "status": "completed", "unigram_loss": 9.0, "loss_init": 9.5})
    return Runs(out)


def test_s3_r4_width_transfer_rules():
    from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4

    assert r4.best_log_lr([2 + (math.log10(lr) + 2.1) ** 2 for lr in r4.LRS]) == (pytest.approx(-2.1), True)
    assert r4.best_log_lr([2.0, 2.5, 3.0, 3.5, 4.0])[1] is False
    res, md = r4.analyze(_width_runs(-0.25, -0.25))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words == {"T1 layernorm": "confirmed", "T1 rmsnorm": "confirmed", "T2": "confirmed"}, md
    assert res["slopes"]["layernorm"][0] == pytest.approx(-0.25, abs=1e-6)
    res, md = r4.analyze(_width_runs(0.0, -0.3))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words["T1 layernorm"] == "not at this scale" and words["T2"] == "not at this scale", md
    res, md = r4.analyze(_width_runs(-0.25, -0.25, edge=True))
    assert {w for w, _ in res["verdicts"].values()} == {"premise absent at this scale"}, md


def test_s3_r5_is_round_4s_analysis_on_the_six_point_grid():
    """A best lr of 10^-3.2 at width 256 (slope -0.4) is a grid edge for round 4 (precondition mixed) and inside
    round 5's grid (present), with round 4's words; round 4's own grid is left as it was."""
    from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4
    from experiments.studies.s3_lr_sensitivity.r5_width_low_lr import analyze as r5

    runs = _width_runs(-0.4, -0.4, lrs=r5.LRS)
    r4_res, _ = r4.analyze(Runs(r for r in runs if r["lr"] in r4.LRS))
    res, md = r5.analyze(runs)
    assert r4_res["precondition"][0]["status"] == "mixed" and res["precondition"][0]["status"] == "present", md
    assert {k: w for k, (w, _) in res["verdicts"].items()} == {
        "T1 layernorm": "confirmed", "T1 rmsnorm": "confirmed", "T2": "confirmed"}, md
    assert res["slopes"]["rmsnorm"][0] == pytest.approx(-0.4, abs=1e-6) and res["lrs"][0] == 3e-4
    assert r4.LRS == (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


def _gain_runs(decay_cost: float, zc_cost: float, shrink: float = 0.7) -> tuple[Runs, dict]:
    """S11 r1 runs: decay costs ``decay_cost`` with standard gains and ``zc_cost`` with zero-centered ones; decay
    leaves the standard gains at ``shrink`` of their RMS."""
    from experiments.studies.s11_gain_decay.r1_prereg import analyze as r1

    out, gains = [], {}
    for lr in r1.LRS:
        for zc in (False, True):
            for dec in (False, True):
                for s in r1.SEEDS:
                    cost = (zc_cost if zc else decay_cost) if dec else 0.0
                    run = {"lr": lr, "seed": s, "tags": ["gains", *(["decay"] if dec else [])], "max_steps": r1.STEPS,
                           "norm_options": {"zero_centered": zc}, "final_val_loss": 1.8 + cost + 0.003 * ((3 * s) % 5),
                           "diverged": False, "status": "completed", "unigram_loss": 3.26, "loss_init": 4.48}
                    out.append(run)
                    gains[r1.key(run)] = 1.2 * (shrink if dec and not zc else 1.0)
    return Runs(out), gains


def test_s11_r1_gain_decay_rules():
    from experiments.studies.s11_gain_decay.r1_prereg import analyze as r1
    from minillm.model import ModelConfig, Transformer

    words = lambda res: {k: w for k, (w, _) in res["verdicts"].items()}  # noqa: E731
    res, md = r1.analyze(*_gain_runs(0.05, 0.0))
    assert set(words(res).values()) == {"confirmed"}, md
    res, md = r1.analyze(*_gain_runs(0.0, 0.05))
    assert set(words(res).values()) == {"not at this scale"}, md
    res, md = r1.analyze(*_gain_runs(0.05, 0.0, shrink=0.98))
    assert set(words(res).values()) == {"premise absent at this scale"}, md
    with pytest.raises(SystemExit, match="gain RMS"):
        r1.analyze(_gain_runs(0.05, 0.0)[0], {})
    model = Transformer(ModelConfig(vocab_size=20, dim=16, n_layers=1, n_heads=2, norm_options={"zero_centered": True}))
    assert r1.gain_rms(model) == pytest.approx(1.0)  # stored 0, effective 1


def _qk_width_runs(benefit_growth: float, logits_grow: bool = True) -> Runs:
    """S3 r6 runs: loss-vs-lr parabolas on log10(lr) around lr 3e-3; without QK-norm the curvature grows by
    ``benefit_growth`` per doubling of width, with QK-norm it is a third of width 32's; attention logits 1e4 without
    QK-norm when ``logits_grow`` (else 200), 100 with it."""
    from experiments.studies.s3_lr_sensitivity.r6_qk_width import analyze as r6

    out = []
    for i, w in enumerate(r6.WIDTHS):
        for qk in r6.QK:
            for s in r6.SEEDS:
                curv = 0.15 if qk == "layernorm" else 0.45 + benefit_growth * i + 0.01 * s
                for lr in r6.LRS:
                    x = math.log10(lr) - math.log10(3e-3) + 0.05 * s
                    out.append({"norm": "rmsnorm", "dim": w, "qk_norm": qk, "seed": s, "lr": lr, "z_loss": 0.0,
                                "tags": ["qk_width"], "final_val_loss": 2.0 + curv * x * x, "diverged": False,
                                "status": "completed", "loss_init": 4.48,
                                "max_attn_logit": 100.0 if qk == "layernorm" else 1e4 if logits_grow else 200.0})
    return Runs(out)


def test_s3_r6_qk_width_rules():
    from experiments.studies.s3_lr_sensitivity.r6_qk_width import analyze as r6

    res, md = r6.analyze(_qk_width_runs(0.2))  # QK-norm lowers the sensitivity 3x+, more at every width
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert res["precondition"][0]["status"] == "present", md
    assert words == {**{f"Q1 width {w}": "confirmed" for w in r6.WIDTHS}, "Q2": "confirmed"}, md
    assert res["best_log10_lr"]["32/none"][0] == pytest.approx(math.log10(3e-3), abs=1e-6)
    res, md = r6.analyze(_qk_width_runs(-0.1))  # the benefit shrinks with width: Q2 not at this scale
    assert {k: w for k, (w, _) in res["verdicts"].items()}["Q2"] == "not at this scale", md
    res, md = r6.analyze(_qk_width_runs(0.2, logits_grow=False))  # no logit growth: the gate
    assert res["precondition"][0]["status"] == "absent"
    assert all(w == "premise absent at this scale" for w, _ in res["verdicts"].values()), md
    runs = _qk_width_runs(0.2)
    del runs[0]["max_attn_logit"]
    with pytest.raises(SystemExit, match="max attention logit"):
        r6.analyze(runs)


def _decay2_runs(cost: float, shrink: float = 0.7) -> tuple[Runs, dict]:
    """S11 r2 runs: LNS and DyT arms, decay costs ``cost`` nats; the decayed parameter ``shrink`` x its value."""
    from experiments.studies.s11_gain_decay.r2_lns_dyt import analyze as r2

    out, params = [], {}
    for a in r2.ARMS:
        for lr in r2.LRS:
            for dec in (False, True):
                for s in r2.SEEDS:
                    run = {"tags": ["decay2", a, *(["decay"] if dec else [])], "lr": lr, "seed": s,
                           "max_steps": r2.STEPS, "diverged": False, "status": "completed", "loss_init": 4.48,
                           "final_val_loss": 1.9 + (cost if dec else 0.0) + 0.003 * ((s * 3) % 5 - 2) * (1 + dec)}
                    out.append(run)
                    params[r2.key(run)] = (shrink if dec else 1.0) * (0.5 if a == "dyt" else 1.0)
    return Runs(out), params


def test_s11_r2_lns_dyt_rules():
    from experiments.studies.s11_gain_decay.r2_lns_dyt import analyze as r2

    res, md = r2.analyze(*_decay2_runs(0.05))
    assert res["precondition"][0]["status"] == "present", md
    assert {w for w, _ in res["verdicts"].values()} == {"confirmed"} and len(res["verdicts"]) == 4, md
    res, md = r2.analyze(*_decay2_runs(-0.01))  # decay helps a little: not at this scale
    assert {w for w, _ in res["verdicts"].values()} == {"not at this scale"}, md
    res, md = r2.analyze(*_decay2_runs(0.05, shrink=0.97))  # decay does not move the parameters: the gate
    assert res["precondition"][0]["status"] == "absent"
    assert {w for w, _ in res["verdicts"].values()} == {"premise absent at this scale"}, md
    runs, params = _decay2_runs(0.05)
    del params[r2.key(runs[0])]
    with pytest.raises(SystemExit, match="decayed parameter"):
        r2.analyze(runs, params)


def _decay3_runs(cost: float, shrink: float = 0.7, val: float = 2.2) -> tuple[Runs, dict]:
    """S11 r3 runs (DyT): decay costs ``cost`` nats, alpha ``shrink`` x its value, no-decay val loss ``val``."""
    from experiments.studies.s11_gain_decay.r3_dyt_trained import analyze as r3

    out, params = [], {}
    for lr in r3.LRS:
        for dec in (False, True):
            for s in r3.SEEDS:
                run = {"tags": [r3.TAG, "dyt", *(["decay"] if dec else [])], "lr": lr, "seed": s,
                       "max_steps": r3.STEPS, "diverged": False, "status": "completed", "loss_init": 4.48,
                       "unigram_loss": 3.26,
                       "final_val_loss": val + (cost if dec else 0.0) + 0.003 * ((s * 3) % 5 - 2) * (1 + dec)}
                out.append(run)
                params[r3.key(run)] = (shrink if dec else 1.0) * 0.5
    return Runs(out), params


def test_s11_r3_dyt_trained_rules():
    from experiments.studies.s11_gain_decay.r3_dyt_trained import analyze as r3

    res, md = r3.analyze(*_decay3_runs(0.05))
    assert [g["status"] for g in res["precondition"]] == ["present", "present"], md
    assert {w for w, _ in res["verdicts"].values()} == {"confirmed"} and len(res["verdicts"]) == 2, md
    res, md = r3.analyze(*_decay3_runs(-0.01))  # decay helps a little: not at this scale
    assert {w for w, _ in res["verdicts"].values()} == {"not at this scale"}, md
    for absent in (dict(shrink=0.97), dict(val=3.1)):  # alpha unmoved; DyT stuck near the unigram loss
        res, md = r3.analyze(*_decay3_runs(0.05, **absent))
        assert "absent" in [g["status"] for g in res["precondition"]], md
        assert {w for w, _ in res["verdicts"].values()} == {"premise absent at this scale"}, md
    runs, params = _decay3_runs(0.05)
    del params[r3.key(runs[0])]
    with pytest.raises(SystemExit, match="mean alpha"):
        r3.analyze(runs, params)


def _derf_runs(derf_gap: float, scale_gain: float, saturated: float = 0.05) -> tuple[Runs, dict]:
    """S8 r4 runs: RMSNorm at 1.62, DyT 0.08 above it, Derf ``derf_gap`` above it; the embedding scale lowers DyT and
    Derf by ``scale_gain``; the premise ``saturated`` for every point-wise arm and seed."""
    from experiments.studies.s8_dyt.r4_derf import analyze as r4

    offsets = {"rmsnorm": 0.0, "dyt": 0.08, "derf": derf_gap, "dyt+scale": 0.08 - scale_gain,
               "derf+scale": derf_gap - scale_gain}
    out = []
    for a, offset in offsets.items():
        norm, scaled = a.split("+")[0], a.endswith("+scale")
        for s in r4.SEEDS:
            out.append({"norm": norm, "tags": ["derf", *(["embscale"] if scaled else [])], "seed": s,
                        "max_steps": r4.STEPS, "final_val_loss": 1.62 + offset + 0.002 * ((s * 3) % 5 - 2),
                        "diverged": False, "status": "completed", "unigram_loss": 3.26, "loss_init": 4.48})
    return Runs(out), {a: [saturated] * len(r4.SEEDS) for a in r4.POINTWISE}


def test_s8_r4_derf_rules():
    from experiments.studies.s8_dyt.r4_derf import analyze as r4

    res, md = r4.analyze(*_derf_runs(0.0, 0.05))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words == {"E1": "confirmed", "E2": "confirmed", "E3a": "confirmed", "E3b": "confirmed"}, md
    res, md = r4.analyze(*_derf_runs(0.09, -0.05))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert set(words.values()) == {"not at this scale"}, md
    res, md = r4.analyze(*_derf_runs(0.0, 0.05, saturated=0.001))
    assert all(w == "premise absent at this scale" for w, _ in res["verdicts"].values()), md
    runs, _ = _derf_runs(0.0, 0.05)
    with pytest.raises(SystemExit, match="premise"):
        r4.analyze(runs, {})
    verdicts = r4.engine(runs)
    assert {c["arm"] for c in verdicts["comparisons"]} == set(r4.POINTWISE)
