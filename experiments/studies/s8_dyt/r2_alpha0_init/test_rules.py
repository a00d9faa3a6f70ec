"""S8 round 2's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import math

from experiments.common.study import Runs


def test_s8_r2_alpha0_init_rules():
    """S8 round 2's pre-registered rules on made-up runs: the alpha0 bracket and the unit-scale-input gap."""
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
