"""S6 round 4's pre-registered rules on made-up runs: plan.yaml recorded, runs of its 31 seeds at lr 3e-3; the words
for runs made to confirm parity, to contradict it, and to lack the premise (runs that do not train)."""

from __future__ import annotations

import pytest
import yaml

from experiments.common.study import Runs

UNIGRAM = 3.3
PLAN_AT, RUN_AT = "2099-01-01T00:00:00+00:00", "2099-01-01T01:00:00+00:00"


def _run(norm: str, seed: int, loss: float) -> dict:
    from experiments.studies.s6_cost.r4_more_pairs import analyze as r4

    return {"name": r4.SWEEP, "norm": norm, "placement": "pre", "lr": r4.LR, "seed": seed, "final_val_loss": loss,
            "best_val_loss": loss, "test_loss": None, "diverged": False, "failed": loss >= UNIGRAM,
            "status": "completed", "unigram_loss": UNIGRAM, "loss_init": 4.2, "vocab_size": 65, "started_at": RUN_AT,
            "run_dir": f"logs/{r4.SWEEP}/multiruns/x/{norm}_{seed}", "git_commit": "0" * 40, "git_dirty": False,
            "torch_version": "2.13.0+cpu", "cpu_capability": "AVX2", "curves": {}}


def _runs(gap: float, base: float = 2.08) -> Runs:
    from experiments.studies.s6_cost.r4_more_pairs import analyze as r4

    out = []
    for s in r4.SEEDS:
        noise = 0.02 * ((s * 7) % 5 - 2) / 2
        out.append(_run("layernorm", s, base + noise))
        out.append(_run("rmsnorm", s, base + noise + gap + 0.008 * ((s * 3) % 5 - 2) / 2))
    return Runs(out)


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    from experiments.studies.s6_cost.r4_more_pairs import analyze as r4
    from minillm.analysis import plans

    monkeypatch.setattr(plans, "utc_now", lambda: PLAN_AT)
    return plans.record_plan(r4.PLAN_YAML, r4.SWEEP, tmp_path / "logs")


def test_s6_r4_constants_are_the_plans():
    from experiments.studies.s6_cost.r4_more_pairs import analyze as r4

    plan = yaml.safe_load(r4.PLAN_YAML.read_text())
    assert (plan["baseline"], plan["margin"], float(plan["lr"]), tuple(plan["seeds"])) == (
        r4.BASELINE, r4.MARGIN, r4.LR, r4.SEEDS)
    assert plan["expected"] == {r4.ARM: "equivalent"} and plan["design"] == "single-stage" and len(r4.SEEDS) == 31


def test_s6_r4_parity_reads_equivalent(recorded):
    from experiments.studies.s6_cost.r4_more_pairs import analyze as r4

    res, md = r4.analyze(_runs(0.0), recorded)
    assert (res["verdict"], res["engine"]["as_expected"], res["engine"]["n_pairs"]) == ("equivalent", True, 31), md
    assert res["engine"]["exploratory"] is False and res["runs_before_plan"] == 0


def test_s6_r4_a_worse_rmsnorm_reads_worse(recorded):
    from experiments.studies.s6_cost.r4_more_pairs import analyze as r4

    res, md = r4.analyze(_runs(0.05), recorded)
    assert res["verdict"] == "worse" and res["engine"]["ci_low"] > 0.02, md


def test_s6_r4_untrained_runs_are_premise_absent(recorded):
    from experiments.studies.s6_cost.r4_more_pairs import analyze as r4

    res, md = r4.analyze(_runs(0.0, base=3.4), recorded)
    assert res["verdict"] == "premise absent at this scale", md
