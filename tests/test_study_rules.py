"""Each study's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs made
to confirm and to contradict each claim (the committed runs are re-analyzed by tests/test_experiments.py)."""

from __future__ import annotations

import json
import math

import pytest

from experiments.common.layout import STUDIES


def test_s2_r2_xavier_rules():
    """S2 round 2's pre-registered rules on made-up runs: Post-LN needs warmup, Pre-LN does not."""
    from experiments.common.study import Runs
    from experiments.studies.s2_warmup.r2_xavier import analyze as xavier

    def runs(post_cold_penalty, pre_cold_penalty):
        out = []
        for p, penalty in (("pre", pre_cold_penalty), ("post", post_cold_penalty)):
            for lr in (1e-3, 3e-3, 1e-2):
                for w in (0, xavier.WARMUP):
                    for s in range(3):
                        loss = 2.0 + 0.01 * s + (penalty * (lr == 1e-2) if w == 0 else 0.0)
                        out.append({"placement": p, "lr": lr, "warmup_steps": w, "seed": s, "final_val_loss": loss,
                                    "diverged": False, "status": "completed", "unigram_loss": 3.2, "loss_init": 4.5})
        return Runs(out)

    res, md = xavier.analyze(runs(0.3, 0.01))
    assert res["verdicts"]["overall"][0] == "confirmed", md
    assert xavier.analyze(runs(0.3, 0.2))[0]["verdicts"]["overall"][0] == "partly"
    assert xavier.analyze(runs(0.01, 0.2))[0]["verdicts"]["overall"][0] == "not at this scale"



def test_s3_r2_olmo2_rules():
    """S3 round 2's pre-registered rules on made-up runs: sensitivity on seed means and per seed, stable lr."""
    from experiments.common.study import Runs
    from experiments.studies.s3_lr_sensitivity.r2_olmo2 import analyze as olmo2

    lrs = (1e-3, 1e-2, 1e-1)

    def runs(olmo_slope):
        out = []
        for placement, qk in (olmo2.BASELINE, *olmo2.PARTS.values(), olmo2.OLMO2):
            slope = olmo_slope if (placement, qk) == olmo2.OLMO2 else 1.0
            for lr in lrs:
                for seed in (0, 1):
                    loss = 2.0 + slope * abs(math.log10(lr / 1e-3)) * (1 + 0.1 * seed)
                    out.append({"placement": placement, "qk_norm": qk, "lr": lr, "seed": seed,
                                "final_val_loss": loss, "diverged": False, "status": "completed", "loss_init": 4.5,
                                "unigram_loss": 3.5, "curves": {}})
        return Runs(out)

    res, md = olmo2.analyze(runs(0.5))
    verdicts = {k: v for k, (v, _) in res["verdicts"].items()}
    assert verdicts["O1"] == "confirmed" and verdicts["O3"] == "confirmed" and verdicts["O4"] == "confirmed", md
    assert verdicts["O2 branch alone"] == "does not lower"
    res, _ = olmo2.analyze(runs(0.9))
    assert res["verdicts"]["O1"][0] == "not at this scale" and res["verdicts"]["O3"][0] == "not at this scale"


def test_s4_r2_powernorm_rules():
    """S4 round 2's pre-registered rules on made-up runs: fluctuation against the sampling null, PowerNorm
    against LayerNorm at both batch sizes."""
    from experiments.common.study import Runs
    from experiments.studies.s4_batchnorm.r2_powernorm import analyze as s4
    from minillm.training.callbacks import bn_sampling_null

    def run(norm, batch, seed, loss, z_ratio=1.0, failed=False):
        curves = {}
        if norm == "batchnorm":
            null = bn_sampling_null(batch, s4.MOMENTUM)
            curves = {"norm/layers.0.attn_norm/bn_mean_z": [(300, z_ratio * null[0])],
                      "norm/layers.0.attn_norm/bn_var_z": [(300, null[1])]}
        return {"norm": norm, "batch_size": batch, "seed": seed, "max_steps": 400, "final_val_loss": loss,
                "diverged": False, "status": "completed", "unigram_loss": 3.0 if not failed else 1.0,
                "curves": curves}

    def runs(z_small, pn_small, pn_fail):
        out = []
        for seed in range(3):
            out += [run("batchnorm", 4, seed, 3.5, z_small, failed=True), run("batchnorm", 64, seed, 1.9, 1.1),
                    run("layernorm", 4, seed, 2.35 + 0.005 * seed), run("layernorm", 64, seed, 1.87),
                    run("powernorm", 4, seed, pn_small, failed=pn_fail), run("powernorm", 64, seed, 1.88)]
        return Runs(out)

    res, md = s4.analyze(runs(3.0, 2.37, False))
    verdicts = {k: v for k, (v, _) in res["verdicts"].items()}
    # F and P2 could not fail: restated as observations, their rule's word in the text
    assert verdicts == {"F": "observation", "P1": "confirmed", "P2": "observation", "replication": "reproduced"}, md
    assert "by its rule: partly" in res["verdicts"]["F"][1] and "by its rule: confirmed" in res["verdicts"]["P2"][1]
    res, _ = s4.analyze(runs(1.2, 2.6, False))
    assert "by its rule: not at this scale" in res["verdicts"]["F"][1]
    assert "by its rule: partly" in res["verdicts"]["P2"][1]
    res, _ = s4.analyze(runs(1.2, 2.6, True))
    assert "by its rule: not at this scale" in res["verdicts"]["P2"][1] and res["precondition"][0]["status"] == "none"


def test_s5_r2_growth_shape_and_rules():
    """S5 round 2's pre-registered measures on made-up residual profiles: the shape fit tells exponential from
    linear growth, and the verdicts follow the rules."""
    from experiments.common.study import Runs
    from experiments.studies.s5_precision.r2_growth import analyze as g

    assert g.shape([1.2 ** i for i in range(24)]) == "exponential"
    assert g.shape([1 + 0.5 * i for i in range(24)]) == "linear"
    assert g.shape([1.0] * 6) == "either"

    def run(placement, L, seed, end, early, loss, tune=False):
        curves = {f"layer/{i}/resid_rms": [(g.EARLY, early(i)), (400, end(i))] for i in range(L)}
        return {"placement": placement, "n_layers": L, "seed": seed, "lr": 3e-3, "final_val_loss": loss,
                "diverged": False, "loss_init": 4.5, "tags": ["growth_tune" if tune else f"growth_{placement}"],
                "curves": curves}

    def runs(pre_rate):
        out = [run(p, g.TUNE_DEPTH, g.TUNE_SEED, lambda i: 1.0, lambda i: 1.0, 2.5, tune=True) for p in g.PLACEMENTS]
        for L in g.DEPTHS:
            for s in g.SEEDS:
                out.append(run("pre", L, s, lambda i: pre_rate ** i, lambda i: 1 + 0.01 * i, 2.10))
                out.append(run("peri", L, s, lambda i: 1 + 0.1 * i, lambda i: 1 + 0.1 * i, 2.05))
                out.append(run("post", L, s, lambda i: 1.0 + 0.001 * i, lambda i: 1.0, 2.2))
        return Runs(out)

    res, md = g.analyze(runs(1.2))
    verdicts = {k: v for k, (v, _) in res["verdicts"].items()}
    assert verdicts == {"G1": "confirmed", "G2": "confirmed", "G3": "confirmed", "G4": "confirmed", "L": "confirmed",
                        "control": "holds"}, md
    assert res["precondition"][0]["status"] == "present" and res["precondition"][1]["status"] == "not recorded"
    assert "4 of 4 parts, Holm-adjusted" in res["verdicts"]["G4"][1]
    res, _ = g.analyze(runs(1.0))  # Pre-LN flat: nothing grows, so the premise of G1-G3 and L is absent
    verdicts = {k: v for k, (v, _) in res["verdicts"].items()}
    assert res["precondition"][0]["status"] == "absent"
    assert verdicts["G1"] == verdicts["G2"] == verdicts["G3"] == verdicts["L"] == "premise absent at this scale"
    assert "by its rule: not at this scale" in res["verdicts"]["G1"][1] and verdicts["G4"] == "not at this scale"


def test_s6_quality_rules():
    """Both rounds' committed numbers come back from their runs; round 2's paired interval decides as written."""
    from experiments.studies.s6_cost.r1_cost import quality

    results = sorted(STUDIES.glob("s6_cost/r*/quality.json"))  # round 1's and round 2's
    assert results
    for path in results:
        committed = json.loads(path.read_text())
        again = quality.analyze(committed["runs"], committed["seeds"])
        assert again == {k: committed[k] for k in again}, path
        assert quality.verdicts(committed)["comparisons"][0]["verdict"] == committed["engine_verdict"]

    def verdict(diffs):
        runs = [dict(norm=n, seed=s, final_val_loss=2.0 + 0.01 * (s % 3) + (d if n == "rmsnorm" else 0.0))
                for s, d in enumerate(diffs) for n in quality.NORMS]
        return quality.analyze(runs, list(range(len(diffs))))["verdict"]

    assert verdict([0.001, -0.002, 0.003, -0.001, 0.0]) == "parity"
    assert verdict([-0.05, -0.06, -0.04, -0.05]) == "difference: rmsnorm better"
    assert verdict([0.004, 0.006, 0.005, 0.005]) == "parity (a difference inside the margin: layernorm better)"
    assert verdict([0.05, -0.06, 0.04, -0.03]) == "inconclusive"


def test_s8_r1_grid_rules():
    """S8's pre-registered rules on made-up runs: parity, the alpha0-lr interaction and the budget growth."""
    from experiments.common.study import Runs
    from experiments.studies.s8_dyt.r1_grid import analyze as s8

    def run(norm, lr, seed, steps, loss, a0=None):
        opts = {"alpha0": a0} if norm == "dyt" else {}
        return {"norm": norm, "lr": lr, "seed": seed, "max_steps": steps, "final_val_loss": loss, "diverged": False,
                "loss_init": 4.2, "norm_options": opts, "curves": {}}

    def runs(gap_short, gap_long, best_at_high_lr):
        out = []
        for seed in s8.SEEDS:
            for lr in s8.LRS:
                out.append(run("rmsnorm", lr, seed, s8.SHORT, 2.0))
                best = best_at_high_lr if lr == max(s8.LRS) else max(s8.ALPHA0)
                slope = 0.5 if lr == max(s8.LRS) else 0.01
                out += [run("dyt", lr, seed, s8.SHORT, 2.0 + gap_short + slope * abs(math.log(a / best)), a)
                        for a in s8.ALPHA0]
            out.append(run("rmsnorm", s8.LONG_LR, seed, s8.LONG, 1.5))
            out.append(run("dyt", s8.LONG_LR, seed, s8.LONG, 1.5 + gap_long + 0.001 * seed, max(s8.ALPHA0)))
        return Runs(out)

    saturated = {f"gpt2/{a:g}": [0.05, 0.04, 0.06] for a in s8.ALPHA0}  # tanh leaves its linear range
    res, md = s8.analyze(runs(0.01, 0.02, min(s8.ALPHA0)), saturated)
    assert (res["h1"]["verdict"], res["h2"]["verdict"], res["h3"]["verdict"]) == ("confirmed", "confirmed",
                                                                                 "confirmed")
    assert res["h1"]["long_alpha0"] == max(s8.ALPHA0) and "**confirmed**" in md
    res, _ = s8.analyze(runs(0.05, 0.2, max(s8.ALPHA0)), saturated)
    assert (res["h1"]["verdict"], res["h2"]["verdict"], res["h3"]["verdict"]) == ("not at this scale", "partly",
                                                                                 "confirmed")
    res, _ = s8.analyze(runs(0.08, 0.0, max(s8.ALPHA0)), saturated)
    assert (res["h1"]["verdict"], res["h3"]["verdict"]) == ("partly", "contradicted")
    linear = {k: [0.0, 0.0, 0.0] for k in saturated}  # tanh stays linear: DyT is a scaled identity
    res, _ = s8.analyze(runs(0.08, 0.0, max(s8.ALPHA0)), linear)
    assert res["h3"]["verdict"] == "premise absent at this scale" and res["h3"]["rule_verdict"] == "contradicted"
    assert res["precondition"][0]["status"] == "absent"


def test_s8_r2_alpha0_init_rules():
    """S8 round 2's pre-registered rules on made-up runs: the alpha0 bracket and the unit-scale-input gap."""
    from experiments.common.study import Runs
    from experiments.studies.s8_dyt.r1_grid import analyze as s8
    from experiments.studies.s8_dyt.r2_alpha0_init import analyze as round2

    def run(norm, lr, seed, loss, a0=None, tags=()):
        return {"norm": norm, "lr": lr, "seed": seed, "max_steps": s8.SHORT, "final_val_loss": loss,
                "diverged": False, "loss_init": 4.5, "norm_options": {"alpha0": a0} if norm == "dyt" else {},
                "tags": list(tags)}

    def runs(best_a0, xavier_gap):
        out = [run("dyt", lr, s, 2.0 + abs(math.log(a / best_a0)), a) for lr in s8.LRS for s in s8.SEEDS
               for a in (*round2.SMALL_ALPHA0, *s8.ALPHA0)]
        out += [run("dyt", round2.LR, s, 2.0 + xavier_gap + 0.1 * abs(math.log(a / 0.25)), a, ["xavier"])
                for s in s8.SEEDS for a in round2.XAVIER_ALPHA0]
        out += [run("rmsnorm", round2.LR, s, 2.0, tags=["xavier"]) for s in s8.SEEDS]
        return Runs(out)

    saturated = {**{f"gpt2/{a:g}": [0.0] * 3 for a in (*round2.SMALL_ALPHA0, *s8.ALPHA0)},
                 **{f"xavier/{a:g}": [0.05] * 3 for a in round2.XAVIER_ALPHA0}}
    res, md = round2.analyze(runs(0.1, 0.05), saturated)
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"D1": "bracketed", "D2": "confirmed"}, md
    res, _ = round2.analyze(runs(0.05, 0.5), saturated)
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"D1": "not bracketed", "D2": "partly"}
    res, _ = round2.analyze(runs(0.05, 0.8), saturated)
    assert res["verdicts"]["D2"][0] == "not at this scale"
    res, _ = round2.analyze(runs(0.1, 0.05), {**saturated, **{f"xavier/{a:g}": [0.0] * 3
                                                              for a in round2.XAVIER_ALPHA0}})
    assert res["verdicts"]["D2"][0] == "premise absent at this scale"

    def noisy(gap_by_seed):  # the seed mean under NEAR, the interval across it: the word the interval supports
        out = [r for r in runs(0.1, 0.0) if not (xavier_dyt(r) and r["seed"] in gap_by_seed)]
        for r in runs(0.1, 0.0):
            if xavier_dyt(r):
                out.append({**r, "final_val_loss": r["final_val_loss"] + gap_by_seed[r["seed"]]})
        return Runs(out)

    def xavier_dyt(r):
        return "xavier" in r["tags"] and r["norm"] == "dyt"

    res, _ = round2.analyze(noisy({0: 0.105, 1: 0.061, 2: 0.071}), saturated)
    assert res["verdicts"]["D2"][0] == "partly" and "by its rule (seed mean): confirmed" in res["verdicts"]["D2"][1]


def test_s9_r1_grid_rules():
    """S9's pre-registered rules on made-up runs: warmup-free training per norm, and the paired parity interval."""
    from experiments.common.study import Runs
    from experiments.studies.s9_scalenorm.r1_grid import analyze as s9

    def runs(no_warmup_cost, scale_minus_ln):
        out = []
        for norm in s9.NORMS:
            for w in s9.WARMUPS:
                for lr in (1e-3, 3e-3, 1e-2):
                    for seed in range(4):
                        loss = 2.0 + abs(math.log10(lr / 3e-3)) * 0.1 + (0 if w else no_warmup_cost) + 0.003 * seed
                        loss += (scale_minus_ln + 0.002 * (seed % 2)) if norm == "scalenorm" else 0.0
                        out.append({"norm": norm, "warmup_steps": w, "lr": lr, "seed": seed, "final_val_loss": loss,
                                    "diverged": False, "status": "completed", "unigram_loss": 3.2, "loss_init": 4.5,
                                    "curves": {}})
        return Runs(out)

    res, md = s9.analyze(runs(0.01, -0.01))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"W": "confirmed", "S": "confirmed (better)"}, md
    res, _ = s9.analyze(runs(0.2, 0.1))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"W": "not at this scale", "S": "contradicted"}


def test_s9_r2_more_seeds_rules():
    """S9 round 2: S re-judged over seeds 0-15 of the one cell; other cells and seeds are ignored."""
    from experiments.common.study import Runs
    from experiments.studies.s9_scalenorm.r2_more_seeds import analyze as seeds

    def runs(gap, noise):
        out = []
        for norm in ("layernorm", "scalenorm"):
            for lr, seed in [(seeds.LR, s) for s in range(20)] + [(1e-3, 0)]:
                loss = 2.0 + (gap + noise * (-1) ** seed if norm == "scalenorm" else 0.0) + (lr != seeds.LR)
                out.append({"norm": norm, "warmup_steps": seeds.WARMUP, "lr": lr, "seed": seed,
                            "final_val_loss": loss, "diverged": False, "status": "completed", "unigram_loss": 3.2,
                            "loss_init": 4.5, "curves": {}})
        return Runs(out)

    res, md = seeds.analyze(runs(0.005, 0.002))
    assert res["verdict"] == "confirmed" and res["excludes_zero"] and res["seeds"] == list(range(16)), md
    assert seeds.analyze(runs(-0.01, 0.002))[0]["verdict"] == "confirmed (better)"
    assert seeds.analyze(runs(0.05, 0.002))[0]["verdict"] == "contradicted"
    res, _ = seeds.analyze(runs(0.0, 0.05))
    assert res["verdict"] == "unresolved" and not res["excludes_zero"]


def test_s10_r1_mixln_rules():
    """S10's pre-registered rules on made-up runs: gradient tilt, deep-layer importance and loss."""
    from experiments.common.study import Runs
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


def test_s10_r2_lns_rules():
    """S10 round 2's pre-registered rules on made-up runs: LayerNorm Scaling against Pre-LN."""
    from experiments.common.study import Runs
    from experiments.studies.s10_mixln.r2_lns import analyze as lns

    def run(placement, L, seed, resid, drop, loss, tags=()):
        curves = {f"layer/{i}/resid_rms": [(400, resid(i))] for i in range(L)}
        curves |= {f"layer/{i}/grad_norm": [(400, 1.0)] for i in range(L)}
        drops = drop if isinstance(drop, list) else [drop] * L
        return {"placement": placement, "n_layers": L, "seed": seed, "final_val_loss": loss, "diverged": False,
                "tags": list(tags), "curves": curves, "layer_drop": {"loss": loss, "drop": drops}}

    def runs(lns_growth, lns_drop, lns_loss, pre_idle=True):
        out = []
        for L in (12, 24):
            pre_drop = [0.04] * (L // 2) + [0.005] * (L // 2) if pre_idle else 0.01
            for s in (0, 1):
                out += [run("pre", L, s, lambda i: 1.2 ** i, pre_drop, 2.10),
                        run("mix", L, s, lambda i: 1.0, 0.02, 2.08),
                        run("pre", L, s, lambda i: lns_growth ** i, lns_drop, lns_loss, tags=["lns"])]
        return Runs(out)

    res, md = lns.analyze(runs(1.05, 0.02, 2.05))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"C1": "observation", "C2": "confirmed",
                                                              "C3": "confirmed"}, md
    assert [g["status"] for g in res["precondition"]] == ["present", "present"]
    res, _ = lns.analyze(runs(1.2, 0.005, 2.10))
    assert {k: v for k, (v, _) in res["verdicts"].items()} == {"C1": "observation", "C2": "not at this scale",
                                                              "C3": "not at this scale"}
    res, _ = lns.analyze(runs(1.05, 0.02, 2.05, pre_idle=False))  # Pre-LN's deep layers work: no premise
    assert res["verdicts"]["C2"][0] == res["verdicts"]["C3"][0] == "premise absent at this scale"
    assert "by its rule: confirmed" in res["verdicts"]["C3"][1]


def test_s10_r3_lns_why_rules():
    """S10 round 3's pre-registered rules on made-up runs and measures; the deep input scale from a real model."""
    from experiments.common.study import Runs
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


def test_precondition_gate_rule():
    """experiments.common.precondition: a premise's status counts seeds (present: every seed meets the threshold,
    absent: none, mixed: some), an absent premise turns a verdict word into PREMISE_ABSENT, and a multi-part
    verdict is counted with Holm's adjustment across its parts."""
    from experiments.common import precondition as pre

    assert set(pre.PREMISES) == {"idle_deep_layers", "stream_growth", "massive_activations", "tanh_saturation"}
    idle = pre.measure("idle_deep_layers", {"L=12": [0.1, 0.2], "L=24": [0.3, 0.5], "L=48": [0.2, 0.4]}, "made up")
    assert [c["status"] for c in idle["cells"].values()] == ["present", "absent", "mixed"]
    assert idle["status"] == "mixed" and idle["rule"] == "at most 0.25"
    assert pre.measure("stream_growth", {"L=6": [0.6, 0.7]}, "x")["status"] == "absent"
    assert pre.measure("tanh_saturation", {"a": [0.05, 0.02]}, "x")["status"] == "present"
    absent = pre.measure("stream_growth", {"L=6": [0.6, 0.7], "L=12": []}, "x")
    assert absent["status"] == "absent" and absent["cells"]["L=12"]["status"] == "not recorded"
    assert pre.gate("not at this scale", absent) == pre.PREMISE_ABSENT == "premise absent at this scale"
    assert pre.gate("confirmed", idle) == "confirmed"  # mixed: the rule's word stands
    assert pre.gate("partly", pre.cell(idle, "L=24")) == pre.PREMISE_ABSENT
    assert pre.gate("partly", pre.cell(idle, "L=12"), pre.none("x")) == "partly"
    missing = pre.not_recorded("massive_activations", "median not logged", {"L=6": 7.3}, "max / RMS")
    assert missing["status"] == "not recorded" and pre.gate("reversed", missing) == "reversed"
    assert "not recorded" in pre.line(missing) and "deciding nothing" in pre.line(missing)
    assert "none beyond the setting" in pre.line(pre.none("a cost"))
    with pytest.raises(ValueError, match="status"):
        pre.reported("p", "q", "at least 1", {"a": 1}, "maybe", "s")

    # a seed mean against a threshold, read with its interval
    assert pre.against([0.079, 0.080, 0.081], 0.10, "at most")["reading"] == "holds"
    assert pre.against([0.105, 0.061, 0.071], 0.10, "at most")["reading"] == "unresolved"
    assert pre.against([0.2, 0.21, 0.19], 0.10, "at most")["reading"] == "fails"
    ratio = pre.against([4.0, 4.4], 2.0, "at least", log=True)
    assert ratio["mean"] == pytest.approx(math.sqrt(4.0 * 4.4)) and ratio["ci_low"] > 0
    # Holm across parts: three parts hold on the seed means; only the clear one survives the adjustment
    parts = pre.parts({"a": ([3.0, 3.01, 2.99, 3.0], 2.0, "at least"), "b": ([2.1, 1.95, 2.3], 2.0, "at least"),
                       "c": ([2.5, 1.6], 2.0, "at least"), "d": ([1.0, 1.1], 2.0, "at least")})
    assert (parts["on_means"], parts["holm"], parts["n"]) == (3, 1, 4)
    assert parts["text"] == "1 of 4 parts, Holm-adjusted (3 of 4 on the seed means)"
    assert pre.count(parts, "a") == "1 of 1 parts, Holm-adjusted (1 on the seed means)"
    assert parts["parts"]["a"]["p_holm"] >= parts["parts"]["a"]["p"]


def test_tanh_saturation_and_provenance():
    """The DyT premise's quantity on a real model: with tiny inputs (GPT-2's N(0, 0.02) embeddings) tanh stays
    linear; with unit-scale ones and alpha0 0.5 about 5% of the first site's inputs reach |alpha x| >= 1. And the
    provenance line names each arm's commit, kernels and torch."""
    import torch

    from experiments.common.machine import provenance
    from experiments.common.precondition import tanh_saturation
    from minillm.model import ModelConfig, Transformer

    cfg = dict(vocab_size=50, dim=64, n_layers=1, n_heads=4, max_seq_len=16, norm="dyt")
    torch.manual_seed(0)
    idx = torch.randint(0, 50, (8, 16))
    small = Transformer(ModelConfig(**cfg, norm_options={"alpha0": 2.0}))
    assert tanh_saturation(small, idx) == 0.0
    unit = Transformer(ModelConfig(**cfg, init="xavier", norm_options={"alpha0": 0.5}))
    assert 0.01 < tanh_saturation(unit, idx) < 0.1
    runs = [{"arm": "a", "git_commit": "0123456789", "git_dirty": True}, {"arm": "b", "git_commit": "abcdef0123",
                                                                         "cpu_capability": "AVX2",
                                                                         "torch_version": "2.13.0+cpu"}]
    line = provenance(runs, lambda r: r["arm"])
    assert "the arms differ" in line and "0123456+dirty, unrecorded kernels" in line and "abcdef0, AVX2" in line
    assert "the same for every arm" in provenance(runs[:1] * 2, lambda r: r["arm"])
