"""S8 round 5's pre-registered rules on made-up runs: each arm's lr and alpha0 chosen on the pilot seeds, the words
for runs made to confirm and to contradict each part, the two gates (a cell at its grid's edge, a point-wise norm
that never saturates during training), the Bonferroni interval, a crashed run at ln V, the analysis stopping on
runs it cannot read, and the stages' sweeps composed through Hydra to each arm's settings."""

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
from experiments.studies.s8_dyt.r5_recipe import analyze as r5

BASE = 2.10
SITES = ("layers.0.attn_norm", "layers.0.ffn_norm", "final_norm")
BEST = {"rmsnorm": (3e-3, None), "dyt": (1e-2, 0.1), "dyt+scale": (3e-3, 2.0), "derf+scale": (3e-3, 2.0)}


def _run(arm: str, lr: float, alpha0: float | None, seed: int, loss: float, late: float = 0.05) -> dict:
    norm, scaled = r5.ARMS[arm]
    curves = {"val/loss": [[99, loss + 0.4], [399, loss]]}
    if arm != "rmsnorm":  # the share in the bend: 0.02 before step 300, ``late`` from step 300 on (three sites)
        for i, site in enumerate(SITES):
            curves[f"norm/{site}/saturation"] = [[s, 0.02 if s < 300 else late + 0.001 * (i - 1)]
                                                 for s in range(0, 400, 25)]
    return {"norm": norm, "norm_options": {} if alpha0 is None else {"alpha0": alpha0, "affine": True},
            "settings": {"model": {"embed_scale": scaled, "init": "gpt2"}}, "init": "gpt2", "warmup_steps": 40,
            "tags": [r5.TAG], "lr": lr, "seed": seed, "max_steps": r5.STEPS, "steps": r5.STEPS,
            "final_val_loss": loss, "diverged": False, "status": "completed", "unigram_loss": 3.26, "loss_init": 4.48,
            "run_dir": f"{arm}/{lr:g}/{alpha0}/{seed}", "curves": curves}


def _runs(gaps: dict[str, float], best: dict | None = None, late: dict[str, float] | None = None) -> Runs:
    """Pilot bowls centred on ``best`` (arm -> cell); the judged runs at BASE + gaps[arm] with a per-seed noise every
    arm of a seed shares and a little of each run's own; ``late``: an arm's saturation from step 300 on."""
    best, late = {**BEST, **(best or {})}, late or {}
    out = []
    for a in r5.ARMS:
        for lr, alpha0 in r5.grid(a):
            far = abs(math.log10(lr / best[a][0])) + (0 if alpha0 is None else abs(math.log2(alpha0 / best[a][1])))
            out += [_run(a, lr, alpha0, s, BASE + 0.1 * far + 0.01 * s) for s in r5.PILOT_SEEDS]
        for s in r5.SEEDS:
            noise = 0.01 * ((s * 3) % 5 - 2) + 0.002 * ((s * 2 + len(a)) % 3 - 1)
            out.append(_run(a, *best[a], s, BASE + gaps.get(a, 0.0) + noise, late.get(a, 0.05)))
    return Runs(out)


def words(res: dict) -> dict[str, str]:
    return {k: w for k, (w, _) in res["verdicts"].items()}


def _judged(runs: Runs, arm: str, seed: int = 21) -> dict:
    return next(r for r in runs if r["seed"] == seed and r5.arm_of(r) == arm)


def test_s8_r5_each_part_confirmed_and_not_at_this_scale():
    res, md = r5.analyze(_runs({"dyt": 0.10, "dyt+scale": 0.0, "derf+scale": -0.03}))
    assert res["choice"]["dyt+scale"] | {"pilot": None} == {"lr": 3e-3, "alpha0": 2.0, "edge": False, "pilot": None}
    assert words(res) == dict.fromkeys(r5.PARTS, "confirmed"), md
    res, md = r5.analyze(_runs({"dyt": 0.0, "dyt+scale": 0.10, "derf+scale": 0.15}))
    assert words(res) == dict.fromkeys(r5.PARTS, "not at this scale"), md
    assert "D3: Derf+scale - DyT+scale, seed mean +0.050, 98.75% CI" in md


def test_s8_r5_each_word_comes_from_the_bonferroni_interval():
    """D1's gap sits where the 95% interval lies below the margin but the 1 - 0.05/4 one crosses it: unresolved."""
    runs = _runs({"dyt+scale": 0.0})
    for s in r5.SEEDS:  # DyT+scale - RMSNorm: mean +0.020, sd 0.0107
        _judged(runs, "dyt+scale", s)["final_val_loss"] = _judged(runs, "rmsnorm", s)["final_val_loss"] + 0.02 + \
            0.01 * (-1) ** s
    res, md = r5.analyze(runs)
    gaps = prereg.diffs(res["val"]["dyt+scale"], res["val"]["rmsnorm"])
    assert pre.against(gaps, r5.PARITY, "at most")["reading"] == "holds"
    assert res["parts"]["D1"] == pre.against(gaps, r5.PARITY, "at most", 0.05 / 4)
    assert words(res)["D1"] == "unresolved", md


def test_s8_r5_a_norm_that_never_saturates_late_in_training_leaves_its_parts_without_a_premise():
    res, md = r5.analyze(_runs({"dyt+scale": 0.0}, late={"dyt+scale": 0.004}))
    assert words(res) == {"D1": pre.PREMISE_ABSENT, "D2": "confirmed", "D3": pre.PREMISE_ABSENT,
                          "E3": pre.PREMISE_ABSENT}, md
    assert res["saturation"]["first"]["dyt+scale"] == pytest.approx(0.02)
    assert res["saturation"]["late"]["dyt+scale"] == pytest.approx([0.004] * len(r5.SEEDS))
    # the unscaled DyT's saturation gates nothing: E3 is about what the scale does
    res, _ = r5.analyze(_runs({"dyt+scale": 0.0}, late={"dyt": 0.0}))
    assert "dyt" not in res["precondition"][-1]["cells"] and words(res)["E3"] != pre.PREMISE_ABSENT


def test_s8_r5_the_squashing_gate_mixed_not_recorded_and_missing():
    """Some seeds at 1% and some below: mixed, the words stand; an arm whose every judged run diverged before step
    300 has nothing recorded late: absent; a judged run that trained its budget without the metric stops."""
    runs = _runs({"dyt+scale": 0.0})
    for s in r5.SEEDS[:3]:
        for key, pts in _judged(runs, "dyt+scale", s)["curves"].items():
            if key.endswith("/saturation"):
                pts[:] = [[st, 0.002 if st >= 300 else v] for st, v in pts]
    res, md = r5.analyze(runs)
    assert res["precondition"][-1]["cells"]["dyt+scale"]["status"] == "mixed" and words(res)["D1"] == "confirmed", md
    runs = _runs({"derf+scale": 0.0})
    for s in r5.SEEDS:
        r = _judged(runs, "derf+scale", s)
        r.update(status="diverged", diverged=True, steps=250, final_val_loss=None)
        r["curves"] = {k: [p for p in v if p[0] < 250] for k, v in r["curves"].items()}
    res, md = r5.analyze(runs)
    assert words(res)["D2"] == pre.PREMISE_ABSENT and words(res)["D3"] == pre.PREMISE_ABSENT, md
    runs = _runs({})
    _judged(runs, "dyt+scale")["curves"] = {"val/loss": [[399, 2.1]]}
    with pytest.raises(SystemExit, match=r"1 run.s. lack the saturation late in training .*dyt\+scale/0.003/2.0/21"):
        r5.analyze(runs)


def test_s8_r5_a_chosen_cell_at_its_grids_edge_leaves_its_parts_without_a_premise():
    res, md = r5.analyze(_runs({}, best={"derf+scale": (3e-3, 8.0)}))
    assert res["choice"]["derf+scale"]["edge"] and res["choice"]["derf+scale"]["alpha0"] == 8.0
    assert words(res) == {"D1": "confirmed", "D2": pre.PREMISE_ABSENT, "D3": pre.PREMISE_ABSENT,
                          "E3": "not at this scale"}, md
    for arm, cell, absent in (("rmsnorm", (3e-2, None), ["D1", "D2"]), ("rmsnorm", (1e-3, None), ["D1", "D2"]),
                              ("dyt", (1e-2, 0.025), ["E3"]), ("dyt", (1e-2, 0.4), ["E3"]),
                              ("dyt+scale", (1e-3, 2.0), ["D1", "D3", "E3"]),
                              ("dyt+scale", (3e-3, 0.5), ["D1", "D3", "E3"])):
        res, md = r5.analyze(_runs({}, best={arm: cell}))
        assert [k for k, w in words(res).items() if w == pre.PREMISE_ABSENT] == absent, (arm, cell, md)
    res, _ = r5.analyze(_runs({}, best={"dyt": (3e-3, 0.2)}))  # inside both of the unscaled DyT's grids
    assert not res["choice"]["dyt"]["edge"]


def test_s8_r5_a_failed_run_counts_at_ln_v():
    runs = _runs({"dyt+scale": 0.0})
    _judged(runs, "dyt+scale").update(status="failed", steps=120, final_val_loss=2.2)  # crashed after a validation
    _judged(runs, "rmsnorm", 22).update(status="diverged", diverged=True, steps=90, final_val_loss=None)
    res, _ = r5.analyze(runs)
    assert res["val"]["dyt+scale"][21] == 4.48 and res["val"]["rmsnorm"][22] == 4.48
    runs = _runs({})
    for r in runs:  # the pilot's best scaled DyT cell diverged in both seeds: the next best is chosen
        if r5.arm_of(r) == "dyt+scale" and r["seed"] in r5.PILOT_SEEDS and (r["lr"], r5.alpha0_of(r)) == (3e-3, 2.0):
            r.update(status="diverged", diverged=True, final_val_loss=None, steps=50)
    chosen = r5.choose(runs)["dyt+scale"]
    assert (chosen["lr"], chosen["alpha0"]) == (1e-3, 2.0) and chosen["pilot"]["lr 0.003, alpha0 2"] == 4.48


def test_s8_r5_runs_it_cannot_read_stop_the_analysis():
    def stops(change, match: str, arm: str = "dyt+scale") -> None:
        runs = _runs({})
        change(runs, _judged(runs, arm))
        with pytest.raises(SystemExit, match=match):
            r5.analyze(runs)
    stops(lambda _, r: r.update(lr=1e-2), "chosen cell")
    stops(lambda _, r: r.update(norm_options={"alpha0": 4.0}), "chosen cell")
    stops(lambda rs, r: rs.remove(r), r"judged runs missing: dyt\+scale \(seeds \[21\]\)")
    stops(lambda _, r: r.update(status="preempted"), r"1 run.s. have not ended .*dyt\+scale/0.003/2.0/21; run.sh")
    stops(lambda _, r: r.update(steps=300), "have not ended")
    stops(lambda rs, r: rs.append(dict(r)), r"more than one run .*: dyt\+scale lr 0.003 alpha0 2 seed 21")
    stops(lambda _, r: r.update(settings={"model": {"embed_scale": True, "init": "xavier"}}),
          r"init 'xavier' \(the round's: 'gpt2'\)")
    stops(lambda _, r: r.update(warmup_steps=0), r"warmup_steps 0 \(the round's: 40\)", "rmsnorm")
    stops(lambda _, r: r.update(norm="layernorm"), "no arm of this round", "rmsnorm")
    stops(lambda rs, r: rs.append({**r, "seed": 5}), r"seeds this round does not have: \[5\]")
    stops(lambda rs, r: rs.append({**r, "seed": 0, "norm_options": {"alpha0": 3.0}}), "off their arm's grid")


def test_s8_r5_saturation_is_the_sites_mean_late_in_training_or_at_the_first_step():
    run = _run("dyt", 3e-3, 2.0, 20, 2.1, late=0.05)
    assert r5.saturation(run) == pytest.approx(0.05) and r5.saturation(run, late=False) == pytest.approx(0.02)
    for pts in (v for k, v in run["curves"].items() if k.endswith("/saturation")):  # step 300 is late, 275 is not
        pts[:] = [[s, 1.0 if s == 275 else 0.0 if s == 300 else v] for s, v in pts]
    assert r5.saturation(run) == pytest.approx(0.05 * 3 / 4)
    assert r5.saturation(_run("rmsnorm", 3e-3, None, 20, 2.1)) is None
    run["curves"]["norm/final_norm/saturation"] = [[0, 0.5], [100, 0.5]]  # a site not logged late: no value
    assert r5.saturation(run) is None


def _compose(stage: str, tmp_path: Path) -> dict:
    """The stage's sweeps (--print-sweeps) composed as run.sh's train.py composes them (each sweep's first value)."""
    text = (Path(r5.__file__).parent / "run.sh").read_text()
    shared = ["experiment=s8_dyt", "model.init=gpt2", f"tags=[{r5.TAG}]", "callbacks=[stability,preemption]",
              "callbacks.stability.every_n_steps=25", "ckpt_path=auto"]
    assert all(o in text for o in shared[:2] + shared[3:]) and f"'tags=[{r5.TAG}]'" in text
    shared.append(re.search(r"'(hydra\.sweep\.subdir=[^']*)'", text).group(1))
    return {folder: (overrides, compose(*shared, *(o.split(",")[0] for o in overrides), f"paths.log_dir={tmp_path}",
                                        hydra=True))
            for folder, overrides in printed_sweeps(r5.main, stage).items()}


def test_s8_r5_the_pilots_sweeps_compose_to_each_arms_settings_on_the_rules_grids(tmp_path):
    cfgs = _compose("pilot", tmp_path)
    assert set(cfgs) == {"pilot_rmsnorm", "pilot_dyt", "pilot_dyt_scale", "pilot_derf_scale"}
    for folder, (overrides, cfg) in cfgs.items():
        arm = next(a for a in r5.ARMS if f"pilot_{a.replace('+', '_')}" == folder)
        assert (cfg.model.norm, bool(cfg.model.embed_scale)) == r5.ARMS[arm]
        assert (cfg.model.init, cfg.scheduler.warmup_steps, cfg.trainer.max_steps) == ("gpt2", 40, r5.STEPS)
        assert list(cfg.tags) == [r5.TAG] and cfg.ckpt_path == "auto" and cfg.callbacks.stability.every_n_steps == 25
        assert cfg.callbacks.preemption._target_.endswith("PreemptionCheckpoint")
        values = dict(o.split("=", 1) for o in overrides)
        assert [float(v) for v in values["optimizer.lr"].split(",")] == list(r5.LRS_OF[arm])
        assert values["seed"] == ",".join(map(str, r5.PILOT_SEEDS))
        if arm != "rmsnorm":
            assert [float(v) for v in values["model.norm_options.alpha0"].split(",")] == list(r5.ALPHA0S[arm])
            assert cfg.hydra.sweep.subdir == f"lr{cfg.optimizer.lr:g}_alpha{cfg.model.norm_options.alpha0:g}_seed0"
        else:
            assert cfg.hydra.sweep.subdir == f"lr{cfg.optimizer.lr:g}_alphanone_seed0"


def test_s8_r5_choose_writes_each_arms_cell_and_the_judged_sweeps_read_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(r5, "CHOICE", tmp_path / "choice.json")
    pilot = tmp_path / "pilot"
    for i, r in enumerate(r for r in _runs({}, best={"dyt": (3e-3, 0.2)}) if r["seed"] in r5.PILOT_SEEDS):
        (pilot / str(i)).mkdir(parents=True)
        (pilot / str(i) / "summary.json").write_text(json.dumps({k: v for k, v in r.items() if k != "curves"}))
    r5.main(["--choose", str(pilot)])
    assert capsys.readouterr().out.split() == ["rmsnorm=lr", "0.003", "dyt=lr", "0.003,alpha0", "0.2",
                                               "dyt+scale=lr", "0.003,alpha0", "2", "derf+scale=lr", "0.003,alpha0",
                                               "2"]
    cfgs = _compose("judged", tmp_path)
    assert {f: (c.optimizer.lr, c.model.norm_options.get("alpha0"), c.seed) for f, (_, c) in cfgs.items()} == \
        {"judged_rmsnorm": (3e-3, None, 20), "judged_dyt": (3e-3, 0.2, 20), "judged_dyt_scale": (3e-3, 2.0, 20),
         "judged_derf_scale": (3e-3, 2.0, 20)}
    assert all(dict(o.split("=", 1) for o in ov)["seed"] == ",".join(map(str, r5.SEEDS)) for ov, _ in cfgs.values())
    with pytest.raises(SystemExit, match=r"grid's edge for dyt lr 0.3, alpha0 0.2 \(choice.json\): widen"):
        for r in (p / "summary.json" for p in pilot.iterdir()):
            s = json.loads(r.read_text())
            s["final_val_loss"] -= 0.5 * (s["norm"] == "dyt" and not s["settings"]["model"]["embed_scale"]
                                          and s["lr"] == 3e-1 and s["norm_options"]["alpha0"] == 0.2)
            r.write_text(json.dumps(s))
        r5.main(["--choose", str(pilot)])


def test_s8_r5_the_widened_grids_move_their_edges():
    """After the first pilot: DyT's lr grid reaches 3e-1 and DyT+scale's alpha0 grid 32, so their first grids' tops
    (3e-2, 8) are inside; the other arms keep their grids."""
    assert r5.LRS_OF["dyt"] == (*r5.LRS, 1e-1, 3e-1) and r5.ALPHA0S["dyt+scale"][-2:] == (16.0, 32.0)
    assert all(r5.LRS_OF[a] == r5.LRS for a in ("rmsnorm", "dyt+scale", "derf+scale"))
    assert r5.ALPHA0S["derf+scale"] == (0.5, 1.0, 2.0, 4.0, 8.0)
    choice = r5.choose(_runs({}, best={"dyt": (3e-2, 0.1), "dyt+scale": (3e-3, 8.0)}))
    assert {a: (c["lr"], c["alpha0"], c["edge"]) for a, c in choice.items() if a in ("dyt", "dyt+scale")} == \
        {"dyt": (3e-2, 0.1, False), "dyt+scale": (3e-3, 8.0, False)}
    choice = r5.choose(_runs({}, best={"dyt": (3e-1, 0.1), "dyt+scale": (3e-3, 32.0)}))
    assert choice["dyt"]["edge"] and choice["dyt+scale"]["edge"]


def test_s8_r5_plot_and_engine_run_on_the_made_up_runs(tmp_path):
    runs = _runs({"dyt": 0.1, "dyt+scale": 0.02, "derf+scale": 0.0})
    r5.plot(runs, tmp_path)
    assert (tmp_path / "recipe.png").stat().st_size > 10_000
    verdicts = r5.engine(runs)
    assert {c["arm"] for c in verdicts["comparisons"]} == {"dyt", "dyt+scale", "derf+scale"}
