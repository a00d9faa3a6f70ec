"""S7 round 7's pre-registered rules on made-up runs: each arm's lr chosen on the pilot seeds (a failed or stalled
run at ln V), the words for runs made to confirm and to contradict each part, the Bonferroni interval, the two
premises (a chosen lr at its grid's edge, DeepNorm failing in its judged runs), a failed judged run leaving its
pair out, the analysis stopping on runs it cannot read, and the stages' sweeps composed through Hydra to each
arm's settings."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.reference import compose
from experiments.common.study import Runs, printed_sweeps
from experiments.studies.s7_depth.r7_own_lr import analyze as r7

BASE, LN_V, UNIGRAM = 1.78, 4.48, 3.26
BEST = {"post+rezero": 1.2e-2, "post+layerscale": 1.2e-2, "deepnorm": 3e-3}


def _run(arm: str, lr: float, seed: int, loss: float | None, status: str = "completed") -> dict:
    scalar = arm.split("+")[1] if "+" in arm else "none"
    return {"norm": "layernorm", "placement": "deepnorm" if arm == "deepnorm" else "post", "lr": lr, "seed": seed,
            "n_layers": r7.DEPTH, "max_steps": r7.STEPS, "steps": r7.STEPS, "warmup_steps": 40, "grad_clip": None,
            "tags": [r7.TAG], "settings": {"model": {"branch_scale": scalar, "branch_scale_init": None}},
            "status": status, "diverged": status == "diverged", "final_val_loss": loss, "unigram_loss": UNIGRAM,
            "loss_init": LN_V, "run_dir": f"{arm}/lr{lr:g}_seed{seed}", "curves": {}}


def _runs(gaps: dict[str, float], best: dict | None = None, deepnorm_fails: int = 0, steep: float = 0.05) -> Runs:
    """Pilot bowls around ``best`` (arm -> lr), ``steep`` nats per factor 2 away; the judged runs at BASE + gaps[arm]
    with a per-seed noise every arm of a seed shares and a little of each run's own; DeepNorm stalled (at the unigram
    loss) in its first ``deepnorm_fails`` judged seeds."""
    best, out = {**BEST, **(best or {})}, []
    for a in r7.ARMS:
        for lr in r7.LRS:
            far = abs(math.log2(lr / best[a]))
            out += [_run(a, lr, s, BASE + steep * far + 0.01 * (s - 40)) for s in r7.PILOT_SEEDS]
        for i, s in enumerate(r7.SEEDS):
            noise = 0.01 * ((s * 3) % 5 - 2) + 0.002 * ((s * 2 + len(a)) % 3 - 1)
            stalled = a == "deepnorm" and i < deepnorm_fails
            out.append(_run(a, best[a], s, UNIGRAM - 0.01 if stalled else BASE + gaps.get(a, 0.0) + noise))
    return Runs(out)


def words(res: dict) -> dict[str, str]:
    return {k: w for k, (w, _) in res["verdicts"].items()}


def _judged(runs: Runs, arm: str, seed: int = 51) -> dict:
    return next(r for r in runs if r["seed"] == seed and r7.arm_of(r) == arm)


def test_s7_r7_each_part_confirmed_and_not_at_this_scale():
    res, md = r7.analyze(_runs({}))
    assert {a: (c["lr"], c["edge"]) for a, c in res["choice"].items()} == {a: (lr, False) for a, lr in BEST.items()}
    assert words(res) == dict.fromkeys(r7.PARTS, "confirmed"), md
    assert "O-rezero: post+rezero - deepnorm (the 8 seed pairs where both trained), seed mean +0.000, 97.5% CI" in md
    assert "### Round 6, for context" in md and "| post+layerscale | 0.01 | 0/10 [0.00, 0.31] | 1.781 |" in md
    res, md = r7.analyze(_runs({"post+rezero": 0.06, "post+layerscale": 0.05}))
    assert words(res) == dict.fromkeys(r7.PARTS, "not at this scale"), md


def test_s7_r7_each_word_comes_from_the_bonferroni_interval():
    """O-rezero's gaps sit where the 95% interval lies below the margin but the 1 - 0.05/2 one crosses it."""
    runs = _runs({})
    for s in r7.SEEDS:
        _judged(runs, "post+rezero", s)["final_val_loss"] = (_judged(runs, "deepnorm", s)["final_val_loss"]
                                                            + 0.008 + 0.012 * (-1) ** s)
    res, md = r7.analyze(runs)
    gaps = prereg.diffs(res["val"]["post+rezero"], res["val"]["deepnorm"])
    assert pre.against(gaps, r7.MARGIN, "at most")["reading"] == "holds"
    assert res["parts"]["O-rezero"] == pre.against(gaps, r7.MARGIN, "at most", 0.05 / 2)
    assert words(res) == {"O-rezero": "unresolved", "O-layerscale": "confirmed"}, md


def test_s7_r7_deepnorm_failing_in_its_judged_runs_leaves_both_parts_without_a_premise():
    res, md = r7.analyze(_runs({}, deepnorm_fails=2))
    assert words(res) == dict.fromkeys(r7.PARTS, pre.PREMISE_ABSENT), md
    assert res["failed"]["deepnorm"] == 2 and sorted(res["val"]["deepnorm"]) == list(r7.SEEDS[2:])


def test_s7_r7_one_failed_deepnorm_run_leaves_its_pair_out_and_the_parts_read():
    """The one failure the gate allows: counted at ln V it would make a gap of about -2.7 nats and an interval about a
    nat wide, leaving both parts unresolved; left out, the other 7 pairs confirm."""
    res, md = r7.analyze(_runs({}, deepnorm_fails=1))
    assert res["failed"]["deepnorm"] == 1 and 50 not in res["val"]["deepnorm"], md
    assert words(res) == dict.fromkeys(r7.PARTS, "confirmed"), md
    assert "post+rezero - deepnorm (the 7 seed pairs where both trained)" in md
    assert "| deepnorm | 0.003 | 1/8 [0.00, 0.53] |" in md and "| failed / 1.7" in md


def test_s7_r7_a_chosen_lr_at_its_grids_edge_leaves_its_parts_without_a_premise():
    res, md = r7.analyze(_runs({}, best={"post+layerscale": 4.8e-2}))
    assert res["choice"]["post+layerscale"] | {"pilot": None, "failed": None, "eligible": None} == \
        {"lr": 4.8e-2, "edge": True, "pilot": None, "failed": None, "eligible": None}
    assert words(res) == {"O-rezero": "confirmed", "O-layerscale": pre.PREMISE_ABSENT}, md
    res, md = r7.analyze(_runs({}, best={"deepnorm": 1.5e-3}))
    assert words(res) == dict.fromkeys(r7.PARTS, pre.PREMISE_ABSENT), md


def test_s7_r7_a_failed_pilot_run_keeps_the_choice_a_grid_step_below_it():
    """DeepNorm's best pilot lr stalls in one seed, at 3.05 nats (within 0.25 of the unigram loss, below ln V, so
    prereg.ended_loss alone would take it as it ended): that lr and the one below are not eligible, and it counts at
    ln V in the reported mean. The scalar's best lr is fine but the next one up crashes and diverges: one step
    below the best is chosen. An arm whose every lr failed gets the grid's lowest, an edge."""
    runs = _runs({}, steep=0.2)
    stalled = next(r for r in runs if r7.arm_of(r) == "deepnorm" and r["seed"] == 40 and r["lr"] == 3e-3)
    stalled["final_val_loss"] = 3.05
    assert prereg.ended_loss(stalled) == 3.05 and r7.outcome(stalled) == LN_V
    chosen = r7.choose(runs)["deepnorm"]
    assert chosen["pilot"]["0.003"] == pytest.approx((LN_V + BASE + 0.01) / 2) and chosen["failed"]["0.003"] == [1, 2]
    assert chosen["eligible"] == ["0.006", "0.012", "0.024", "0.048"]
    assert (chosen["lr"], chosen["edge"]) == (6e-3, False)
    assert r7.choose(_runs({}, steep=0.2))["post+rezero"]["lr"] == 1.2e-2
    for r in runs:
        if r7.arm_of(r) == "post+rezero" and r["seed"] in r7.PILOT_SEEDS and r["lr"] == 2.4e-2:
            r.update(status="failed" if r["seed"] == 40 else "diverged", diverged=r["seed"] == 41, steps=300,
                     final_val_loss=1.0 if r["seed"] == 40 else None)  # crashed after a (made-up) low validation
    chosen = r7.choose(runs)["post+rezero"]
    assert chosen["pilot"]["0.024"] == LN_V and chosen["failed"]["0.024"] == [2, 2]
    assert chosen["eligible"] == ["0.0015", "0.003", "0.006", "0.048"] and chosen["lr"] == 6e-3
    for r in runs:
        if r7.arm_of(r) == "deepnorm" and r["seed"] == 41:
            r.update(status="diverged", diverged=True, steps=90, final_val_loss=None)
    chosen = r7.choose(runs)["deepnorm"]
    assert (chosen["eligible"], chosen["lr"], chosen["edge"]) == ([], 1.5e-3, True)
    del stalled["loss_init"]
    with pytest.raises(SystemExit, match=r"deepnorm/lr0.003_seed40: failed, and its summary has no loss_init"):
        r7.choose(runs)


def test_s7_r7_a_failed_judged_run_is_counted_and_leaves_its_pair_out():
    runs = _runs({})
    _judged(runs, "post+rezero").update(status="failed", steps=120, final_val_loss=2.2)  # crashed after a validation
    _judged(runs, "post+layerscale", 52).update(status="diverged", diverged=True, steps=90, final_val_loss=None)
    res, md = r7.analyze(runs)
    assert 51 not in res["val"]["post+rezero"] and 52 not in res["val"]["post+layerscale"]
    assert res["failed"] == {"post+rezero": 1, "post+layerscale": 1, "deepnorm": 0}
    assert words(res) == dict.fromkeys(r7.PARTS, "confirmed"), md
    _judged(runs, "deepnorm", 50).update(status="diverged", diverged=True, steps=90, final_val_loss=None)
    res, md = r7.analyze(runs)  # the fewest pairs the gates leave: 6
    assert words(res) == dict.fromkeys(r7.PARTS, "confirmed"), md
    assert "post+rezero - deepnorm (the 6 seed pairs where both trained)" in md


def test_s7_r7_a_scalar_failing_more_than_once_does_not_match_deepnorm():
    runs = _runs({})
    for s in r7.SEEDS[:2]:
        _judged(runs, "post+layerscale", s).update(status="diverged", diverged=True, steps=90, final_val_loss=None)
    res, md = r7.analyze(runs)
    assert words(res) == {"O-rezero": "confirmed", "O-layerscale": "not at this scale"}, md
    assert "O-layerscale: post+layerscale failed in 2 of its 8 judged runs (more than 1), DeepNorm in 0" in md
    for s in r7.SEEDS[2:4]:  # DeepNorm failing too: no premise, whichever arm failed
        _judged(runs, "deepnorm", s).update(status="diverged", diverged=True, steps=90, final_val_loss=None)
    res, md = r7.analyze(runs)
    assert words(res) == dict.fromkeys(r7.PARTS, pre.PREMISE_ABSENT), md


def test_s7_r7_runs_it_cannot_read_stop_the_analysis():
    def stops(change, match: str, arm: str = "post+rezero") -> None:
        runs = _runs({})
        change(runs, _judged(runs, arm))
        with pytest.raises(SystemExit, match=match):
            r7.analyze(runs)
    stops(lambda rs, r: rs.remove(r), r"judged runs missing: post\+rezero \(seeds \[51\]\)")
    stops(lambda _, r: r.update(lr=6e-3), r"1 run.s. lack the arm's chosen lr .*post\+rezero/lr0.012_seed51")
    stops(lambda _, r: r.update(status="preempted"), r"have not ended .*post\+rezero/lr0.012_seed51; run.sh")
    stops(lambda _, r: r.update(steps=600), "have not ended")
    stops(lambda rs, r: rs.append(dict(r)), r"more than one run .*: post\+rezero lr 0.012 seed 51")
    stops(lambda _, r: r.update(n_layers=24), r"n_layers 24 \(the round's: 48\)")
    stops(lambda _, r: r.update(max_steps=300, steps=300), r"max_steps 300 \(the round's: 900\)", "deepnorm")
    stops(lambda _, r: r.update(settings={"model": {"branch_scale": "rezero", "branch_scale_init": 0.1}}),
          r"branch_scale_init 0.1 \(the round's: None\)")
    stops(lambda _, r: r.update(settings={"model": {"branch_scale": "none"}}), "no arm of this round")
    stops(lambda _, r: r.update(placement="pre"), "no arm of this round")
    stops(lambda rs, r: rs.append({**r, "seed": 30}), r"seeds this round does not have: \[30\]")
    stops(lambda rs, r: rs.append({**r, "seed": 40, "lr": 1e-2}), "off the lr grid")
    stops(lambda rs, r: rs.remove(next(x for x in rs if x["seed"] == 41 and r7.arm_of(x) == "deepnorm")),
          r"the pilot lacks deepnorm at lr 0.0015 \(1 of 2 seeds\)")


def _compose(stage: str, tmp_path: Path) -> dict:
    """The stage's sweeps (--print-sweeps) composed as run.sh's train.py composes them (each sweep's first value)."""
    text = (Path(r7.__file__).parent / "run.sh").read_text()
    shared = ["experiment=s7_depth", "model.n_layers=48", "trainer.max_steps=900", "model.compile=true",
              f"tags=[{r7.TAG}]", "callbacks=[stability,preemption]", "callbacks.stability.every_n_steps=50",
              "ckpt_path=auto", "threads=1"]
    assert all(o in text for o in shared) and f"'tags=[{r7.TAG}]'" in text
    shared.append(re.search(r"'(hydra\.sweep\.subdir=[^']*)'", text).group(1))
    return {folder: (overrides, compose(*shared, *(o.split(",")[0] for o in overrides), f"paths.log_dir={tmp_path}",
                                        hydra=True))
            for folder, overrides in printed_sweeps(r7.main, stage).items()}


def test_s7_r7_the_pilots_sweeps_compose_to_each_arms_settings_on_the_grid(tmp_path):
    cfgs = _compose("pilot", tmp_path)
    run_sh = (Path(r7.__file__).parent / "run.sh").read_text()
    assert set(cfgs) == {"pilot_post_rezero", "pilot_post_layerscale", "pilot_deepnorm"}
    for folder, (overrides, cfg) in cfgs.items():
        arm = next(a for a in r7.ARMS if f"pilot_{a.replace('+', '_')}" == folder)
        record = {"norm": cfg.model.norm, "placement": cfg.model.placement,
                  "settings": {"model": {"branch_scale": cfg.model.branch_scale}}}
        assert r7.arm_of(record) == arm, folder
        assert (cfg.model.norm, cfg.model.n_layers, cfg.trainer.max_steps, cfg.scheduler.warmup_steps) == \
            ("layernorm", r7.DEPTH, r7.STEPS, 40)
        assert cfg.model.branch_scale_init is None and cfg.trainer.gradient_clip_val is None and cfg.model.compile
        assert list(cfg.tags) == [r7.TAG] and cfg.ckpt_path == "auto" and cfg.callbacks.stability.every_n_steps == 50
        assert cfg.callbacks.preemption._target_.endswith("PreemptionCheckpoint")
        values = dict(o.split("=", 1) for o in overrides)
        assert [float(v) for v in values["optimizer.lr"].split(",")] == list(r7.LRS)
        assert values["seed"] == ",".join(map(str, r7.PILOT_SEEDS))
        assert cfg.hydra.sweep.subdir == "lr0.0015_seed40"
        given = {o.split("=", 1)[0] for o in [*overrides, *re.findall(r"(?<=\s)([\w.]+)=", run_sh)]}
        assert set(cfg.hydra.sweeper.params) <= given, "a key the preset sweeps that run.sh does not set"


def test_s7_r7_choose_writes_each_arms_lr_and_the_judged_sweeps_read_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(r7, "CHOICE", tmp_path / "choice.json")
    with pytest.raises(SystemExit, match="no choice.json yet"):
        r7.main(["--print-sweeps", "judged"])
    pilot = tmp_path / "pilot"
    for i, r in enumerate(r for r in _runs({}) if r["seed"] in r7.PILOT_SEEDS):
        (pilot / str(i)).mkdir(parents=True)
        (pilot / str(i) / "summary.json").write_text(json.dumps({k: v for k, v in r.items() if k != "curves"}))
    r7.main(["--choose", str(pilot)])
    assert capsys.readouterr().out.split() == ["post+rezero=0.012", "post+layerscale=0.012", "deepnorm=0.003"]
    cfgs = _compose("judged", tmp_path)
    assert {f: (c.optimizer.lr, c.seed) for f, (_, c) in cfgs.items()} == \
        {"judged_post_rezero": (1.2e-2, 50), "judged_post_layerscale": (1.2e-2, 50), "judged_deepnorm": (3e-3, 50)}
    assert all(dict(o.split("=", 1) for o in ov)["seed"] == ",".join(map(str, r7.SEEDS)) for ov, _ in cfgs.values())
    for p in pilot.iterdir():  # DeepNorm's pilot now best at the grid's top: choose stops, the judged sweeps refuse
        s = json.loads((p / "summary.json").read_text())
        s["final_val_loss"] -= 0.5 * (s["placement"] == "deepnorm" and s["lr"] == 4.8e-2)
        (p / "summary.json").write_text(json.dumps(s))
    with pytest.raises(SystemExit, match=r"grid's edge for deepnorm 0.048 \(choice.json\): widen"):
        r7.main(["--choose", str(pilot)])
    with pytest.raises(SystemExit, match="deepnorm lies at its grid's edge: no judged run"):
        r7.main(["--print-sweeps", "judged"])


def test_s7_r7_plot_runs_on_the_made_up_runs(tmp_path):
    r7.plot(_runs({"post+rezero": 0.03}, deepnorm_fails=1), tmp_path)
    assert (tmp_path / "own_lr.png").stat().st_size > 10_000
