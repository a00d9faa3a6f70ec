"""S13 round 2's pre-registered rules on made-up runs: each cell's lr chosen on the pilot seeds, the fixed-sequence
words and the speed-up reading for runs made to reach the target at some budgets and not at others, F1 on its own,
the pairing by seed, the gate when a chosen lr sits at its grid's edge, a crashed run counted at ln V, and the
analysis stopping on runs it cannot read; run.sh's grids are the rules' grids."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest

from experiments.common.reference import compose
from experiments.common.study import Runs
from experiments.studies.s13_ngpt.r2_steps_to_target import analyze as r2

BASE = 2.05


def _run(cell: str, lr: float, seed: int, loss: float | None) -> dict:
    ngpt, failed = cell != "baseline", loss is None
    steps = int(cell) if ngpt else r2.STEPS
    arm = {**r2.ARMS["ngpt"], "weight_decay": 0} if ngpt else r2.ARMS["baseline"]  # summary.json has nGPT's int 0
    return {**arm, "settings": {"model": {"ngpt": ngpt}},
            "tags": [r2.TAG], "lr": lr, "seed": seed, "max_steps": steps, "steps": steps,
            "final_val_loss": None if failed else loss, "diverged": failed,
            "status": "diverged" if failed else "completed",
            "unigram_loss": 3.26, "loss_init": 4.48, "run_dir": f"{cell}/{lr:g}/{seed}",
            "curves": {"val/loss": [] if failed else [[49, loss + 0.4], [steps - 1, loss]]}}


def _runs(gaps: dict[int, float], best: dict[str, float] | None = None, shared: float = 0.003) -> Runs:
    """Pilot bowls centred on ``best`` (cell -> lr; default inside both grids); judged baseline at BASE, nGPT at budget
    b at BASE + gaps[b], with a per-seed noise of scale ``shared`` that every cell of a seed shares and a little of
    each run's own."""
    best = {"baseline": 3e-3, **{str(b): 3e-2 for b in r2.BUDGETS}, **(best or {})}
    out = []
    for c in r2.CELLS:
        for lr in r2.grid(c):
            for s in r2.PILOT_SEEDS:
                out.append(_run(c, lr, s, BASE + 0.1 * abs(math.log10(lr / best[c])) + 0.01 * s))
        for s in r2.SEEDS:
            noise = shared * ((s * 3) % 5 - 2)
            gap = 0.0 if c == "baseline" else gaps[int(c)] + 0.002 * ((s * 2) % 3 - 1)
            out.append(_run(c, best[c], s, BASE + gap + noise))
    return Runs(out)


def words(res: dict) -> dict[str, str]:
    return {k: w for k, (w, _) in res["verdicts"].items()}


def _judged(runs: Runs, cell: str, seed: int = 21) -> dict:
    return next(r for r in runs if r["seed"] == seed and r2.cell_of(r) == cell)


def test_s13_r2_a_speed_up_bracketed_by_the_budgets_that_reach_the_target():
    res, md = r2.analyze(_runs({200: 0.20, 250: 0.10, 300: 0.03, 350: -0.02, 400: -0.05}))
    assert res["lr_choice"]["baseline"]["lr"] == 3e-3 and res["lr_choice"]["300"]["lr"] == 3e-2
    assert words(res) == {"R-200": "not at this scale", "R-250": "not at this scale", "R-300": "unresolved",
                          "R-350": "confirmed", "F1": "confirmed"}, md
    assert res["speed_up"] == "at least 1.14x; below 1.60x" and "**at least 1.14x; below 1.60x**" in md
    res, md = r2.analyze(_runs({200: -0.01, 250: -0.02, 300: -0.03, 350: -0.04, 400: 0.05}))
    assert words(res) == {**{f"R-{b}": "confirmed" for b in (200, 250, 300, 350)}, "F1": "not at this scale"}, md
    assert res["speed_up"] == "at least 2.00x; none excluded"
    res, _ = r2.analyze(_runs({200: 0.3, 250: 0.3, 300: 0.3, 350: 0.3, 400: 0.2}))
    assert res["speed_up"] == "no budget confirmed; below 1.14x"


def test_s13_r2_the_sequence_ends_at_the_first_budget_its_word_does_not_hold_for():
    """R-300 is wholly above the margin: the confirmations stop there, so R-250 and R-200, each of whose intervals
    alone lies below it, stay unresolved; and the exclusions never start, since R-200 is not excluded."""
    res, md = r2.analyze(_runs({200: 0.0, 250: 0.0, 300: 0.1, 350: 0.0, 400: -0.05}))
    assert {k: res["parts"][k]["reading"] for k in ("R-200", "R-250", "R-300")} == \
        {"R-200": "holds", "R-250": "holds", "R-300": "fails"}
    assert words(res) == {"R-200": "unresolved", "R-250": "unresolved", "R-300": "unresolved", "R-350": "confirmed",
                          "F1": "confirmed"}, md
    assert res["speed_up"] == "at least 1.14x; none excluded"
    assert r2.sequence_words({200: "fails", 250: "fails", 300: "holds", 350: "holds"}) == \
        {200: "not at this scale", 250: "not at this scale", 300: "confirmed", 350: "confirmed"}
    assert r2.sequence_words({200: "holds", 250: "fails", 300: "unresolved", 350: "holds"}) == \
        {200: "unresolved", 250: "unresolved", 300: "unresolved", 350: "confirmed"}


def test_s13_r2_f1_is_read_on_its_own_interval_against_its_threshold():
    assert words(r2.analyze(_runs({200: 0.3, 250: 0.3, 300: 0.3, 350: 0.3, 400: 0.0}))[0])["F1"] == \
        "not at this scale"  # the same loss is not better by 0.01
    assert words(r2.analyze(_runs({200: 0.3, 250: 0.3, 300: 0.3, 350: 0.3, 400: -0.01}))[0])["F1"] == "unresolved"
    assert words(r2.analyze(_runs({200: 0.3, 250: 0.3, 300: 0.3, 350: 0.3, 400: -0.03}))[0])["F1"] == "confirmed"


def _false_word_rates(trials: int) -> tuple[float, float]:
    """Every budget's true gap at +PARITY exactly, normal noise per run with the baseline's run shared by every gap
    of its seed: the share of trials in which the R-B family gives any word ("confirmed" or "not at this scale"; at
    the margin each is the limit of a false one), by the rule's fixed sequence and, for contrast, by each part's own
    interval. The intervals are computed for all trials at once, with the engine's t quantile (read off one interval it
    gives), and checked against precondition.against on the first trials."""
    import numpy as np

    from experiments.common import precondition as pre

    rng, n, budgets = np.random.default_rng(0), len(r2.SEEDS), r2.BUDGETS[:-1]
    gaps = r2.PARITY + 0.02 * (rng.normal(size=(trials, len(budgets), n)) - rng.normal(size=(trials, 1, n)))
    unit = [-1.0, 1.0] * (n // 2)  # mean 0, sd sqrt(n / (n - 1)): the engine's interval's half-width per standard error
    quantile = pre.against(unit, 0.0, "at most")["ci_high"] / (math.sqrt(n / (n - 1)) / math.sqrt(n))
    half = quantile * gaps.std(axis=2, ddof=1) / math.sqrt(n)
    low, high = gaps.mean(axis=2) - half, gaps.mean(axis=2) + half
    read = np.where(high <= r2.PARITY, "holds", np.where(low > r2.PARITY, "fails", "unresolved"))
    for t in range(20):
        assert [pre.against(g, r2.PARITY, "at most")["reading"] for g in gaps[t]] == list(read[t])
    by_sequence = sum(any(w != "unresolved" for w in r2.sequence_words(dict(zip(budgets, row, strict=True))).values())
                      for row in read)
    return by_sequence / trials, float((read != "unresolved").any(axis=1).mean())


def test_s13_r2_the_families_chance_of_a_false_word_is_at_most_5_percent_when_every_gap_sits_at_the_margin():
    """The hardest case of the fixed-sequence rule: each direction's first part is a one-sided 2.5% test, so the
    family's rate is about 5%; reading each part on its own interval would give a word far more often."""
    by_sequence, by_part = _false_word_rates(20000)
    assert 0.045 < by_sequence < 0.055, by_sequence  # 5% nominal; 20,000 trials: a standard error of 0.16%
    assert by_part > 0.09, by_part


def test_s13_r2_pairs_by_seed_so_noise_every_cell_of_a_seed_shares_cancels():
    res, md = r2.analyze(_runs({200: 0.20, 250: 0.10, 300: 0.03, 350: -0.02, 400: -0.05}, shared=0.05))
    assert max(res["val"]["baseline"].values()) - min(res["val"]["baseline"].values()) > 0.15
    assert words(res)["R-350"] == "confirmed" and words(res)["R-200"] == "not at this scale", md


def test_s13_r2_the_speed_up_reading_says_when_no_budget_has_a_premise():
    assert r2.speed_up({b: r2.ABSENT for b in (200, 250, 300, 350)}) == "premise absent at this scale"
    assert r2.speed_up({200: "unresolved", 250: "unresolved"}) == "no budget confirmed; none excluded"


def test_s13_r2_a_chosen_lr_at_its_grid_edge_leaves_its_parts_without_a_premise():
    res, md = r2.analyze(_runs({200: 0.2, 250: 0.1, 300: 0.0, 350: -0.02, 400: -0.05}, {"250": 1e-1}))
    assert res["lr_choice"]["250"]["edge"] and not res["lr_choice"]["300"]["edge"]
    assert words(res) == {"R-200": "not at this scale", "R-250": "premise absent at this scale",
                          "R-300": "confirmed", "R-350": "confirmed", "F1": "confirmed"}, md
    assert res["speed_up"] == "at least 1.33x; below 2.00x"
    res, _ = r2.analyze(_runs({200: 0.2, 250: 0.1, 300: 0.0, 350: -0.02, 400: -0.05}, {"baseline": 1e-3}))
    assert set(words(res).values()) == {"premise absent at this scale"}
    assert res["speed_up"] == "premise absent at this scale"


def test_s13_r2_a_failed_pilot_run_counts_at_ln_v():
    runs = _runs({b: 0.0 for b in r2.BUDGETS})
    for r in runs:  # nGPT's best pilot lr at 200 steps fails in one seed: the choice moves to a neighbour
        if r2.cell_of(r) == "200" and r["seed"] == 0 and r["lr"] == 3e-2:
            r.update(final_val_loss=None, diverged=True, status="diverged", steps=90)
    assert r2.choose_lr(runs)["200"]["lr"] in (2e-2, 5e-2) and r2.choose_lr(runs)["250"]["lr"] == 3e-2


def test_s13_r2_a_crashed_judged_run_counts_at_ln_v_not_at_its_last_validation():
    runs = _runs({200: 0.20, 250: 0.10, 300: 0.03, 350: -0.02, 400: -0.05})
    _judged(runs, "350").update(status="failed", steps=120, final_val_loss=2.4)  # crashed after a validation
    res, md = r2.analyze(runs)
    assert res["val"]["350"][21] == 4.48 and words(res)["R-350"] != "confirmed", md


def test_s13_r2_runs_it_cannot_read_stop_the_analysis():
    def stops(change, match: str, cell: str = "350") -> None:
        runs = _runs({b: 0.0 for b in r2.BUDGETS})
        change(runs, _judged(runs, cell))
        with pytest.raises(SystemExit, match=match):
            r2.analyze(runs)
    stops(lambda _, r: r.update(lr=1e-1), "chosen lr")
    stops(lambda rs, r: rs.remove(r), r"judged runs missing: 300 \(seeds \[21\]\)", "300")
    stops(lambda rs, r: rs.append({**r, "max_steps": 100, "steps": 100}), "budgets this round does not have: 100")
    stops(lambda _, r: r.update(status="preempted"), "1 run.s. have not ended .*350/0.03/21; run.sh again")
    stops(lambda _, r: r.update(steps=300), "have not ended")  # completed, yet short of its budget
    stops(lambda rs, r: rs.append(dict(r)), "more than one run of one cell, lr and seed: 350 lr 0.03 seed 21")
    stops(lambda _, r: r.update(weight_decay=0.1), r"weight_decay 0.1 \(its arm's: 0.0\)")
    stops(lambda _, r: r.update(warmup_steps=0), r"warmup_steps 0 \(its arm's: 40\)", "baseline")
    stops(lambda _, r: r.update(norm="none"), r"norm 'none' \(its arm's: 'rmsnorm'\)", "baseline")
    stops(lambda rs, r: rs.append({**r, "seed": 5}), r"seeds this round does not have: \[5\]")
    stops(lambda rs, r: rs.append({**r, "seed": 0, "lr": 3e-1}), "off their cell's grid: 350/0.03/21")
    runs = _runs({b: 0.0 for b in r2.BUDGETS})  # a diverged run need not reach its budget
    _judged(runs, "350").update(status="diverged", diverged=True, steps=180, final_val_loss=None)
    assert r2.analyze(runs)[0]["val"]["350"][21] == 4.48
    _judged(runs, "300").update(status="not_trained", final_val_loss=4.6)  # learned nothing: at ln V, not above
    assert r2.analyze(runs)[0]["val"]["300"][21] == 4.48


def _run_sh_sweeps() -> dict[str, list[str]]:
    """run.sh's sweeps as Hydra overrides (each sweep's first value), keyed by sweep folder; the judged ones with
    the lr their pilot chooses left out, as they are written."""
    text = (Path(r2.__file__).parent / "run.sh").read_text()
    shared = re.search(r'train\.py -m (.*?) \|\| rc', text, re.S).group(1).replace("\\\n", " ")
    arrays = {"NGPT": shlex.split(re.search(r"\nNGPT=\((.*?)\)", text).group(1)),
              "T": [shlex.split(re.search(r"\nT=(.*)", text).group(1))[0]]}
    out = {}
    for name, rest in re.findall(r"\nsweep (\w+) (.*)", text):
        args = []
        for token in shlex.split(shared.replace('"$@"', rest)):
            token = {"${NGPT[@]}": " ".join(arrays["NGPT"]), "$T": arrays["T"][0]}.get(token, token)
            args += [t if "[" in t else t.split(",")[0] for t in token.split(" ") if "$D" not in t and "JOBS" not in t]
        out[name] = args
    return out


def test_s13_r2_run_sh_composes_each_arms_settings_and_continues_where_it_stopped(tmp_path):
    """run.sh's pilot sweeps compose (as train.py composes them) to each arm's settings as ARMS checks them, with
    the tag, a checkpoint on a signal and ckpt_path=auto, each run in a folder named by its settings."""
    sweeps = _run_sh_sweeps()
    assert set(sweeps) == {"pilot_baseline", "pilot_ngpt"}
    cfgs = {k: compose(*v, f"paths.log_dir={tmp_path}", hydra=True) for k, v in sweeps.items()}
    for name, cfg in cfgs.items():
        arm = r2.ARMS["ngpt" if "ngpt" in name else "baseline"]
        assert cfg.model.norm == arm["norm"]
        assert (cfg.scheduler.warmup_steps, cfg.optimizer.weight_decay) == (arm["warmup_steps"], arm["weight_decay"])
        assert bool(cfg.model.get("ngpt")) == ("ngpt" in name) and list(cfg.tags) == [r2.TAG]
        assert cfg.ckpt_path == "auto" and cfg.callbacks.preemption._target_.endswith("PreemptionCheckpoint")
        assert cfg.hydra.sweep.subdir == f"lr{cfg.optimizer.lr:g}_steps{cfg.trainer.max_steps}_seed{cfg.seed}"
    assert cfgs["pilot_baseline"].trainer.max_steps == r2.STEPS


def test_s13_r2_run_sh_sweeps_the_rules_grids_budgets_and_seeds():
    text = (Path(r2.__file__).parent / "run.sh").read_text()
    values = lambda key: [m.split(",") for m in re.findall(rf"{re.escape(key)}=([0-9.e,-]+)", text)]  # noqa: E731
    assert [[float(v) for v in g] for g in values("optimizer.lr")] == [list(r2.BASE_LRS), list(r2.NGPT_LRS)]
    assert values("trainer.max_steps") == [[str(b) for b in r2.BUDGETS]]
    assert sorted([int(v) for v in g] for g in values("seed")) == [list(r2.PILOT_SEEDS)] * 2 + [list(r2.SEEDS)]


def _pilot_folder(folder: Path, best: dict[str, float]) -> Path:
    for i, r in enumerate(r for r in _runs({b: 0.0 for b in r2.BUDGETS}, best) if r["seed"] in r2.PILOT_SEEDS):
        (folder / str(i)).mkdir(parents=True)
        (folder / str(i) / "summary.json").write_text(json.dumps({k: v for k, v in r.items() if k != "curves"}))
    return folder


def test_s13_r2_choose_lr_reads_the_pilot_folders_and_prints_each_cells_lr(tmp_path, monkeypatch, capsys):
    """`--choose-lr SWEEP...` (what run.sh reads its lrs from): the pilot runs' summary.json files in, lr_choice.json
    and "baseline=<lr> 200=<lr> ... 400=<lr>" out; a chosen lr at its grid's edge stops run.sh before the judged
    runs."""
    monkeypatch.setattr(r2, "LR_FILE", tmp_path / "lr_choice.json")
    r2.main(["--choose-lr", str(_pilot_folder(tmp_path / "pilot", {"350": 1e-2}))])
    assert capsys.readouterr().out.split() == ["baseline=0.003", "200=0.03", "250=0.03", "300=0.03", "350=0.01",
                                               "400=0.03"]
    assert json.loads((tmp_path / "lr_choice.json").read_text())["350"]["lr"] == 1e-2
    with pytest.raises(SystemExit, match=r"grid's edge for nGPT, 350 steps 0.1 \(lr_choice.json\): widen"):
        r2.main(["--choose-lr", str(_pilot_folder(tmp_path / "edge", {"350": 1e-1}))])
    assert json.loads((tmp_path / "lr_choice.json").read_text())["350"] == \
        {"lr": 1e-1, "edge": True, "pilot": pytest.approx({f"{lr:g}": 2.055 + 0.1 * math.log10(1e-1 / lr)
                                                           for lr in r2.NGPT_LRS})}


def test_s13_r2_plot_and_engine_run_on_the_made_up_runs(tmp_path):
    runs = _runs({200: 0.2, 250: 0.1, 300: 0.03, 350: -0.02, 400: -0.05})
    r2.plot(runs, tmp_path)
    assert (tmp_path / "steps_to_target.png").stat().st_size > 10_000
    verdicts = r2.engine(runs)
    assert {c["arm"] for c in verdicts["comparisons"]} == {f"ngpt@{b}" for b in r2.BUDGETS}
