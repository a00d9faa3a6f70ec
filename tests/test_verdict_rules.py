"""The rules that make a verdict one a statistician would sign (minillm/analysis/compare.py, lr_choice.py,
lr_curves.py):
failed runs count, the lr is chosen on other seeds than it is judged on, the words control the family-wise error,
equivalence is the two one-sided tests, and the data a verdict reads is each run once, split on every setting that
varies, read from the folder it is in. Each test plants sweeps on which the rules before them gave the wrong word."""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil

import numpy as np
import pytest
from test_report import report_main
from test_verdicts import LOSS_INIT, run, write_sweep

from minillm.analysis.compare import compare
from minillm.analysis.runs import find_runs

SEEDS = range(8)


def only(result: dict, arm: str | None = None) -> dict:
    comps = [c for c in result["comparisons"] if arm is None or c["arm"] == arm]
    assert len(comps) == 1, comps
    return comps[0]


# --- failed runs are outcomes ----------------------------------------------------------------------------------------


def test_an_arm_that_fails_more_often_is_worse_not_better():
    """dyt diverges in 5 of 8 seeds (layernorm in none) and its 3 survivors are 0.03 lower: it is worse."""
    runs = [run("layernorm", 1e-3, s, 2.0 + 0.01 * s) for s in SEEDS]
    runs += [run("dyt", 1e-3, s, None if s < 5 else 2.0 + 0.01 * s - 0.03 + 0.001 * (s - 6)) for s in SEEDS]
    c = only(compare(runs, "norm", "layernorm"))
    assert c["verdict"] == "worse" and c["n_pairs"] == 8 and c["informative"]
    assert (c["fail_arm"], c["fail_baseline"]) == (5, 0) and c["fisher_p"] == pytest.approx(0.0256, abs=1e-4)
    expected = np.mean([LOSS_INIT - (2.0 + 0.01 * s) for s in range(5)] + [-0.031, -0.03, -0.029])
    assert c["diff"] == pytest.approx(expected)
    assert c["trained_pairs"] == 3 and c["diff_trained"] == pytest.approx(-0.03)
    # survivors only, as asked: the lower loss of the 3 survivors cannot make it better than a baseline that never
    # fails significantly less often
    dropped = only(compare(runs, "norm", "layernorm", failures="drop"))
    assert dropped["verdict"] == "inconclusive" and dropped["n_pairs"] == 3
    assert any("fails significantly more often (5 of 8 against 0 of 8" in w for w in dropped["warnings"])


def test_an_arm_whose_every_run_failed_against_a_baseline_that_trains_is_worse():
    runs = [run("layernorm", 1e-3, s, 2.0 + 0.01 * s) for s in range(4)]
    runs += [run("dyt", 1e-3, s, None) for s in range(4)]
    c = only(compare(runs, "norm", "layernorm"))
    assert c["verdict"] == "worse" and c["informative"] and c["fail_arm"] == 4


# --- the lr is not chosen on the runs that judge it --------------------------------------------------------------


def lucky_halves() -> list[dict]:
    """layernorm best at 3e-3 (0.1 worse elsewhere); rmsnorm as good at every lr, but lucky (0.05 lower) at 1e-3 in
    the even seeds and at 1e-2 in the odd ones: luck of its runs, not of the arm."""
    noise = np.random.default_rng(1).normal(0, 0.001, size=(2, 3, 8))
    runs = []
    for i, lr in enumerate((1e-3, 3e-3, 1e-2)):
        for s in SEEDS:
            base = 2.0 + 0.02 * s
            runs.append(run("layernorm", lr, s, base + (0.0 if lr == 3e-3 else 0.1) + noise[0, i, s]))
            luck = -0.05 if (lr == 1e-3 and s % 2 == 0) or (lr == 1e-2 and s % 2 == 1) else 0.0
            runs.append(run("rmsnorm", lr, s, base + luck + noise[1, i, s]))
    return runs


def test_cross_fitting_judges_each_half_at_the_lr_the_other_half_chose():
    """Chosen on the judging runs, the lucky lr makes rmsnorm better by 0.025 (p < 0.05); cross-fitted, each half is
    judged at the lr the other half chose, where it had no luck: equivalent."""
    c = only(compare(lucky_halves(), "norm", "layernorm", lr_choice="crossfit"))
    assert c["verdict"] == "equivalent"
    assert c["lr_choice"]["how"] == "cross-fit" and c["lr_choice"]["chosen_on"] == "final_val_loss"
    folds = c["lr_choice"]["folds"]
    assert [f["chosen_on_seeds"] for f in folds] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [f["lrs"]["rmsnorm"] for f in folds] == [1e-3, 1e-2] and c["arm_lr"] == [1e-3, 1e-2]
    assert [f["lrs"]["layernorm"] for f in folds] == [3e-3, 3e-3] and c["baseline_lr"] == 3e-3
    assert c["diff"] == pytest.approx(0.0, abs=0.002) and c["verdict"] == "equivalent"
    same = only(compare(lucky_halves(), "norm", "layernorm"))  # the default without test losses: the same runs
    assert same["lr_choice"]["how"] == "same data" and same["verdict"] == "better"
    assert same["diff"] == pytest.approx(-0.025, abs=0.002)
    assert any("chosen on the runs that judge the verdict" in w for w in same["warnings"])


def test_the_lr_is_chosen_on_validation_and_judged_on_the_test_loss():
    """By default the lr is chosen on the final val loss and the verdict reads test_loss (auto), with a warning that
    a run's own luck is in both."""
    runs = []
    for s in range(3):
        for lr, val, test in ((1e-3, 2.00, 2.10), (1e-2, 2.05, 1.95)):  # val prefers 1e-3, test 1e-2
            runs.append(run("layernorm", lr, s, 2.0 + 0.01 * s, test_loss=2.0 + 0.01 * s))
            runs.append(run("rmsnorm", lr, s, val + 0.01 * s, test_loss=test + 0.01 * s))
    result = compare(runs, "norm", "layernorm")
    c = only(result)
    assert c["arm_lr"] == 1e-3 and c["diff"] == pytest.approx(0.10)  # chosen on val, judged on test
    assert result["metric"] == "test_loss" and result["metric_rule"] == "auto"
    assert c["lr_choice"] == {"how": "validation", "chosen_on": "final_val_loss"} and c["arm_lr"] == 1e-3
    assert c["diff"] == pytest.approx(0.10) and any("own luck" in w for w in c["warnings"])
    no_test = only(compare([{**r, "test_loss": None} for r in runs], "norm", "layernorm"))
    assert no_test["lr_choice"]["how"] == "same data"  # nothing else to choose on, and it says so
    assert any("chosen on the runs that judge the verdict" in w for w in no_test["warnings"])


# --- the words control the error rate ------------------------------------------------------------------------------


def five_arms(lucky: list[float]) -> list[dict]:
    """A baseline and 5 arms; arms a-d equal to it (differences of sd 0.01 around 0), arm e with ``lucky`` ones."""
    rng = np.random.default_rng(2)
    runs = [run("layernorm", 1e-3, s, 2.0 + 0.05 * s) for s in SEEDS]
    for arm in "abcd":
        d = rng.normal(0, 0.01, 8)
        runs += [run(arm, 1e-3, s, 2.0 + 0.05 * s + d[s] - d.mean()) for s in SEEDS]
    runs += [run("e", 1e-3, s, 2.0 + 0.05 * s + lucky[s]) for s in SEEDS]
    return runs


LUCKY = [-0.03, -0.005, -0.02, -0.025, 0.01, -0.015, -0.02, 0.004]  # mean -0.0126, p 0.040 alone


def test_one_lucky_interval_among_five_arms_is_not_a_word():
    result = compare(five_arms(LUCKY), "norm", "layernorm")
    e = only(result, "e")
    assert e["verdict"] == "inconclusive"
    assert e["p"] == pytest.approx(0.040, abs=0.001) and e["ci_high"] < 0  # the unadjusted interval excludes 0
    assert e["p_adjusted"] > 0.05 and e["verdict"] == "inconclusive" and result["family"] == 5
    alone = only(compare(five_arms(LUCKY), "norm", "layernorm", adjust="none"), "e")
    assert alone["verdict"] == "better" and alone["p_adjusted"] == alone["p"]


def test_equivalence_is_the_two_one_sided_tests_at_alpha():
    """+0.011 with sd 0.012 over 8 pairs, margin 0.02: the 90% interval lies inside the margin (equivalent by TOST
    at 5%); the 95% interval does not (the rule before called it worse)."""
    d = np.array([0.011, 0.027, -0.004, 0.02, 0.002, 0.018, 0.0, 0.014])
    runs = [run("layernorm", 1e-3, s, 2.0 + 0.05 * s) for s in SEEDS]
    runs += [run("rmsnorm", 1e-3, s, 2.0 + 0.05 * s + d[s]) for s in SEEDS]
    c = only(compare(runs, "norm", "layernorm"))
    assert c["verdict"] == "equivalent"
    assert c["ci_high"] > 0.02 and c["p_equivalent"] < 0.05
    strict = only(compare(runs, "norm", "layernorm", equivalence="interval", adjust="none"))
    assert strict["verdict"] == "worse"


# --- the data a verdict reads -----------------------------------------------------------------------------------


def test_runs_listed_twice_count_once(tmp_path, capsys):
    sweep = write_sweep(tmp_path / "s", [run(n, 1e-3, s, 2.0 + 0.05 * s + 0.01 * (n == "rmsnorm"))
                                         for n in ("layernorm", "rmsnorm") for s in range(4)])
    once = only(compare(find_runs(sweep), "norm", "layernorm", paired_by="none"))
    twice = compare(find_runs(sweep) + find_runs(sweep / "0") + find_runs(tmp_path), "norm", "layernorm",
                    paired_by="none")
    assert (only(twice)["ci_low"], only(twice)["ci_high"]) == (once["ci_low"], once["ci_high"])
    assert len(twice["duplicates"]) == 9 and twice["n_runs"] == 8
    code, out, err = report_main([sweep, sweep / "0", "--compare", "norm", "--baseline", "layernorm"], capsys)
    assert code == 0, err
    assert json.loads((sweep / "report" / "verdicts.json").read_text())["duplicates"] == [str(sweep / "0")]
    assert "| layernorm | pre | 0.001 | 4 |" in (sweep / "report" / "report.md").read_text()


def test_a_setting_outside_the_usual_keys_that_varies_splits_strata():
    """Half the runs of each arm used another scheduler (summary.json's settings): two strata, not one pool."""
    runs = [run(n, 1e-3, s, 2.0 + 0.01 * s + (0.05 * (sch == "wsd") + 0.001 * (s - 1.5)) * (n == "rmsnorm"),
                settings={"scheduler": {"name": sch, "warmup_steps": 40}, "optimizer": {"lr": 1e-3}})
            for n in ("layernorm", "rmsnorm") for sch in ("cosine", "wsd") for s in range(4)]
    result = compare(runs, "norm", "layernorm")
    assert result["strata_keys"] == ["settings.scheduler.name"]
    assert [(c["stratum"], c["verdict"]) for c in result["comparisons"]] == [
        ({"settings.scheduler.name": "cosine"}, "equivalent"), ({"settings.scheduler.name": "wsd"}, "worse")]


def test_a_moved_sweep_reads_its_own_window_files(tmp_path):
    """summary.json records the absolute run_dir; a copied sweep must read the copy's val_windows.npy, whatever
    is (or is no longer) at the recorded place."""
    rng = np.random.default_rng(3)
    runs = []
    for n in ("layernorm", "rmsnorm"):
        for s in range(4):
            runs.append(run(n, 1e-3, s, 2.0 + 0.01 * s + 0.01 * (n == "rmsnorm")))
    original = write_sweep(tmp_path / "original", runs)
    for i, _ in enumerate(runs):
        folder = original / str(i)
        summary = json.loads((folder / "summary.json").read_text())
        (folder / "summary.json").write_text(json.dumps({**summary, "run_dir": str(folder)}))
        np.save(folder / "val_windows.npy", rng.normal(summary["final_val_loss"], 0.3, 64))
    before = only(compare(find_runs(original), "norm", "layernorm", window_error=True))
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    for npy in original.rglob("val_windows.npy"):
        np.save(npy, rng.normal(9.0, 3.0, 64))  # the original place now holds other numbers
    after = only(compare(find_runs(copy), "norm", "layernorm", window_error=True))
    assert after["ci_method"] == "paired t + windows"
    assert (after["ci_low"], after["ci_high"]) == (before["ci_low"], before["ci_high"])


def test_runs_that_have_not_ended_are_flagged(tmp_path, capsys):
    sweep = write_sweep(tmp_path / "s", [run(n, 1e-3, s, 2.0 + 0.01 * s) for n in ("layernorm", "rmsnorm")
                                         for s in range(4)])
    (sweep / "8").mkdir()
    (sweep / "8" / ".lock").write_text("1234")  # a run that started and has no summary yet
    (sweep / "0" / ".lock").write_text("")
    fd = os.open(sweep / "0" / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a resumed run training now in a folder with a summary
    try:
        code, out, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm"], capsys)
    finally:
        os.close(fd)
    assert code == 0, err
    assert "warning: 2 run(s) have not ended" in err
    data = json.loads((sweep / "report" / "verdicts.json").read_text())
    assert data["unfinished"] == [str(sweep / "0"), str(sweep / "8")]
    assert any("2 run(s) of the sweep have not ended" in w for w in only(data)["warnings"])
    assert "**2 run(s) of the sweep have not ended**" in (sweep / "report" / "verdicts.md").read_text()
    assert "**2 run(s) have not ended**" in (sweep / "report" / "report.md").read_text()


def test_a_corrupt_summary_is_one_line_naming_the_file(tmp_path, capsys):
    sweep = write_sweep(tmp_path / "s", [run(n, 1e-3, s, 2.0 + 0.01 * s) for n in ("layernorm", "rmsnorm")
                                         for s in range(4)])
    (sweep / "3" / "summary.json").write_text('{"norm": "layer')  # truncated
    code, out, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm"], capsys)
    assert code == 2 and "Traceback" not in err
    (line,) = [x for x in err.strip().splitlines() if x.startswith("minillm-report: error:")]
    assert f"{sweep / '3' / 'summary.json'}: not a readable summary.json (JSONDecodeError" in line
    assert "or pass --skip-bad" in line and not (sweep / "report").exists()
    code, out, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm", "--skip-bad"], capsys)
    assert code == 0 and f"warning: skipped {sweep / '3' / 'summary.json'}: not a readable summary.json" in err
    assert json.loads((sweep / "report" / "verdicts.json").read_text())["n_runs"] == 7


# --- the stability verdict -------------------------------------------------------------------------------------


def lr_grid(seeds: int = 6) -> list[dict]:
    """6 seeds over 5 lrs: layernorm's curve is sharp and diverges at the top lr; qk's is flat and never fails."""
    lrs = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
    sharp = {1e-3: 0.3, 3e-3: 0.08, 1e-2: 0.0, 3e-2: 0.25, 1e-1: None}
    flat = {1e-3: 0.2, 3e-3: 0.05, 1e-2: 0.0, 3e-2: 0.03, 1e-1: 0.08}
    rng = np.random.default_rng(4)
    runs = []
    for s in range(seeds):
        for lr in lrs:
            e = rng.normal(0, 0.005, 2)
            runs.append(run("layernorm", lr, s, None if sharp[lr] is None else 2.0 + sharp[lr] + e[0],
                            qk_norm=None))
            runs.append(run("qk", lr, s, 2.0 + flat[lr] + e[1], qk_norm=None))
    return runs


def test_the_stability_verdict_compares_lr_curves_seed_by_seed(tmp_path, capsys):
    result = compare(lr_grid(), "norm", "layernorm", stability=True, version=2)  # the measures of version 2
    stab = result["stability_verdict"]
    (c,) = stab["comparisons"]
    assert c["arm"] == "qk" and c["n_pairs"] == 6 and c["grid"] == [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
    sens = c["measures"]["lr_sensitivity"]
    expected_base = np.mean([0.3, 0.08, 0.0, 0.25, LOSS_INIT - 2.0])
    assert sens["baseline_mean"] == pytest.approx(expected_base, abs=0.01)
    assert sens["arm_mean"] == pytest.approx(np.mean([0.2, 0.05, 0.0, 0.03, 0.08]), abs=0.01)
    assert sens["verdict"] == "better"
    width = c["measures"]["lr_range_decades"]  # within 0.1 nats of the best: 3e-3..1e-1 against 3e-3..1e-2
    assert width["arm_mean"] == pytest.approx(math.log10(1e-1 / 3e-3)) and width["verdict"] == "better"
    assert width["baseline_mean"] == pytest.approx(math.log10(1e-2 / 3e-3))
    rate = c["measures"]["failure_rate"]
    assert (rate["arm_mean"], rate["baseline_mean"], rate["diff"]) == pytest.approx((0.0, 0.2, -0.2))
    assert rate["verdict"] == "better" and stab["family"] == 3
    sweep = write_sweep(tmp_path / "grid", lr_grid())
    code, out, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm", "--stability"], capsys)
    assert code == 0, err
    md = (sweep / "report" / "verdicts.md").read_text()
    assert "## Stability over the lr grid" in md and "| qk | - | 6 | lr_sensitivity |" in md
    assert (sweep / "report" / "loss_vs_lr.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("option", "message"), [
    (["--lr-choice", "maybe"], "argument --lr-choice: invalid choice: 'maybe'"),
    (["--failures", "ignore"], "argument --failures: invalid choice: 'ignore'"),
    (["--tolerance", "0"], "--tolerance: 0.0 is invalid; allowed: a number > 0"),
    (["--range-margin", "-1"], "--range-margin: -1.0 is invalid; allowed: a number > 0"),
])
def test_the_new_options_refuse_bad_values_in_one_line(tmp_path, capsys, option, message):
    sweep = write_sweep(tmp_path / "s", [run(n, 1e-3, s, 2.0 + 0.01 * s) for n in ("layernorm", "rmsnorm")
                                         for s in range(4)])
    code, _, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm", *option], capsys)
    assert code == 2 and message in err and not (sweep / "report").exists()


def test_crossfit_asked_for_without_enough_seeds_names_the_option():
    runs = [run(n, lr, s, 2.0 + lr) for n in ("layernorm", "rmsnorm") for lr in (1e-3, 1e-2) for s in range(3)]
    with pytest.raises(ValueError, match=r"^--lr-choice: crossfit needs 2 seeds of every value in each half"):
        compare(runs, "norm", "layernorm", lr_choice="crossfit")


def test_an_unchanged_sweep_reads_the_same_from_its_old_and_its_moved_folder(tmp_path):
    sweep = write_sweep(tmp_path / "a", lr_grid())
    first = compare(find_runs(sweep), "norm", "layernorm", stability=True)
    shutil.move(sweep, tmp_path / "b")
    again = compare(find_runs(tmp_path / "b"), "norm", "layernorm", stability=True)
    strip = lambda r: json.dumps({k: v for k, v in r.items() if k not in ("comparisons",)}, default=str)  # noqa
    assert strip(first) == strip(again)
    assert [c["verdict"] for c in first["comparisons"]] == [c["verdict"] for c in again["comparisons"]]
