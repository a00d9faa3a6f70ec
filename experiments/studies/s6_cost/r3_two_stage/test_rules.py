"""S6 round 3's pre-registered rules on made-up runs, through the two-stage workflow as the round runs it: plan.yaml
recorded, a planted pilot frozen by minillm.analysis.plans.freeze_plan, judged runs at the frozen lrs; the words for
runs made to confirm parity, to contradict it, to lack the premise (an lr at the grid's edge), and a judged run
outside the frozen design (not pre-registered)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from experiments.common.study import Runs

UNIGRAM = 3.3
PLAN_AT, FROZEN_AT, JUDGED_AT = "2099-01-01T00:00:00+00:00", "2099-01-01T01:00:00+00:00", "2099-01-01T02:00:00+00:00"


def _run(norm: str, lr: float, seed: int, loss: float, started: str) -> dict:
    from experiments.studies.s6_cost.r3_two_stage import analyze as r3

    return {"name": r3.SWEEP, "norm": norm, "placement": "pre", "lr": lr, "seed": seed, "final_val_loss": loss,
            "best_val_loss": loss, "test_loss": None, "diverged": False, "failed": loss >= UNIGRAM,
            "status": "completed", "unigram_loss": UNIGRAM, "loss_init": 4.2, "vocab_size": 65, "started_at": started,
            "run_dir": f"logs/{r3.SWEEP}/multiruns/x/{norm}_{lr:g}_{seed}", "git_commit": "0" * 40,
            "git_dirty": False, "torch_version": "2.13.0+cpu", "cpu_capability": "AVX2", "curves": {}}


def _loss(norm: str, lr: float, seed: int, gap: float, best: dict[str, float]) -> float:
    noise = 0.003 * ((seed * 7) % 5 - 2) + 0.001 * ((seed * 3) % 4 - 1.5) * (norm == "rmsnorm")
    return 2.08 + 0.06 * abs(math.log10(lr / best[norm])) + (gap if norm == "rmsnorm" else 0.0) + noise


def _frozen(tmp_path: Path, monkeypatch, gap: float, best: dict[str, float]) -> tuple[Path, Runs]:
    """plan.json recorded from the committed plan.yaml and frozen on a planted pilot; (its path, the pilot runs)."""
    from experiments.studies.s6_cost.r3_two_stage import analyze as r3
    from minillm.analysis import design, plans

    monkeypatch.setattr(plans, "utc_now", lambda: PLAN_AT)
    path = plans.record_plan(r3.PLAN_YAML, r3.SWEEP, tmp_path / "logs")
    pilot = Runs(_run(n, lr, s, _loss(n, lr, s, gap, best), PLAN_AT)
                 for n in r3.NORMS for lr in r3.LRS for s in r3.PILOT_SEEDS)
    sweep = tmp_path / "logs" / r3.SWEEP / "multiruns" / "pilot"
    for i, r in enumerate(pilot):
        (sweep / str(i)).mkdir(parents=True)
        (sweep / str(i) / "summary.json").write_text(json.dumps({k: v for k, v in r.items() if k != "curves"}))
    monkeypatch.setattr(design, "utc_now", lambda: FROZEN_AT)
    plans.freeze_plan(r3.SWEEP, [sweep], tmp_path / "logs")
    shutil.copy(r3.PLAN_YAML, tmp_path / "plan.yaml")
    return path, pilot


def _judged(path: Path, gap: float, best: dict[str, float], lr_of: dict[str, float] | None = None) -> Runs:
    from experiments.studies.s6_cost.r3_two_stage import analyze as r3

    _, _, frozen = r3.record(path)
    lrs = {**frozen["lrs"], **(lr_of or {})}
    return Runs(_run(n, lrs[n], s, _loss(n, lrs[n], s, gap, best), JUDGED_AT)
                for n in r3.NORMS for s in frozen["judged_seeds"])


def _word(tmp_path, monkeypatch, gap: float, best: dict[str, float], lr_of=None) -> tuple[dict, str]:
    from experiments.studies.s6_cost.r3_two_stage import analyze as r3

    path, pilot = _frozen(tmp_path, monkeypatch, gap, best)
    return r3.analyze(Runs([*pilot, *_judged(path, gap, best, lr_of)]), path)


TUNED = {"layernorm": 3e-3, "rmsnorm": 3e-3}


def test_s6_r3_constants_are_the_plans():
    from experiments.studies.s6_cost.r3_two_stage import analyze as r3

    plan = yaml.safe_load(r3.PLAN_YAML.read_text())
    assert (plan["baseline"], plan["arms"], plan["margin"], tuple(plan["pilot_seeds"])) == (
        r3.BASELINE, [r3.ARM], r3.MARGIN, r3.PILOT_SEEDS)
    assert tuple(float(x) for x in plan["lr_grid"]) == r3.LRS and plan["expected"] == {r3.ARM: "equivalent"}
    assert not set(plan["seeds"]) & set(plan["pilot_seeds"]) and plan["design"] == "two-stage"


def test_s6_r3_parity_reads_equivalent(tmp_path, monkeypatch):
    res, md = _word(tmp_path, monkeypatch, 0.0, TUNED)
    assert res["freeze"]["lrs"] == TUNED and res["precondition"][0]["status"] == "present"
    assert (res["verdict"], res["engine"]["preregistered"], res["engine"]["as_expected"]) == ("equivalent", True,
                                                                                              True), md
    assert res["breaches"] == [] and res["pilot_runs_left_out"] == 18
    assert len(res["diffs"]) == len(res["freeze"]["judged_seeds"]) >= 3


def test_s6_r3_a_worse_rmsnorm_reads_worse(tmp_path, monkeypatch):
    res, md = _word(tmp_path, monkeypatch, 0.05, TUNED)
    assert res["verdict"] == "worse" and res["engine"]["as_expected"] is False, md
    assert res["engine"]["ci_low"] > 0.02


def test_s6_r3_an_lr_at_the_grid_edge_is_premise_absent(tmp_path, monkeypatch):
    res, md = _word(tmp_path, monkeypatch, 0.0, {"layernorm": 1e-2, "rmsnorm": 3e-3})
    assert res["freeze"]["lrs"]["layernorm"] == 1e-2
    assert res["verdict"] == "premise absent at this scale" and res["engine"]["verdict"] == "equivalent", md


def test_s6_r3_a_judged_run_off_the_frozen_lr_is_not_preregistered(tmp_path, monkeypatch):
    from experiments.studies.s6_cost.r3_two_stage import analyze as r3

    path, pilot = _frozen(tmp_path, monkeypatch, 0.0, TUNED)
    judged = _judged(path, 0.0, TUNED)
    extra = _run("rmsnorm", 1e-2, judged[0]["seed"], 2.1, JUDGED_AT)  # one more judged run, off its frozen lr
    res, md = r3.analyze(Runs([*pilot, *judged, extra]), path)
    assert res["engine"]["preregistered"] is False and "not frozen for rmsnorm" in res["breaches"][0]["message"], md


def test_s6_r3_an_unfrozen_plan_stops_the_analysis(tmp_path, monkeypatch):
    from experiments.studies.s6_cost.r3_two_stage import analyze as r3
    from minillm.analysis import plans

    monkeypatch.setattr(plans, "utc_now", lambda: PLAN_AT)
    path = plans.record_plan(r3.PLAN_YAML, r3.SWEEP, tmp_path / "logs")
    with pytest.raises(SystemExit, match="not frozen"):
        r3.analyze(Runs([_run("layernorm", 3e-3, 100, 2.08, JUDGED_AT)]), path)
