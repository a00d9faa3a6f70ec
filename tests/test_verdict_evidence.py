"""Rules version 3 of the comparison engine (minillm/analysis/family.py, exact.py, lr_curves.py): every word of a
report in one family, no evidence from a spread that does not vary, exact tests for the discrete measures, stability
measures read around each arm's own best lr over the lrs that trained, failures with a word of their own, plans from
the spread of the runs that trained, and the shares under their names. Each test plants a sweep on which the rules of
version 2 (kept for the studies registered under them) say a word these rules do not, or miss one they say."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats
from test_report import report_main
from test_verdicts import run, write_sweep

from minillm.analysis.compare import compare

LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
BOWL = {lr: 0.05 * (i - 2) ** 2 for i, lr in enumerate(LRS)}  # best at 1e-2, in the middle of the grid
SHIFTED = {lr: 0.05 * (i - 3) ** 2 for i, lr in enumerate(LRS)}  # the same curve, one grid step higher


def only(result: dict) -> dict:
    (c,) = result["comparisons"]
    return c


def curves(base: dict, arm: dict, seeds: int = 8, noise: float = 0.005) -> list[dict]:
    """layernorm's and qk's runs over the grid: 2.0 + a seed effect + the curve (None: the run diverges) + noise."""
    rng = np.random.default_rng(7)
    runs = []
    for s in range(seeds):
        for lr in LRS:
            e = rng.normal(0, noise, 2)
            runs.append(run("layernorm", lr, s, None if base[lr] is None else 2.0 + 0.01 * s + base[lr] + e[0]))
            runs.append(run("qk", lr, s, None if arm[lr] is None else 2.0 + 0.01 * s + arm[lr] + e[1]))
    return runs


def measures(result: dict) -> dict:
    (c,) = result["stability_verdict"]["comparisons"]
    return c["measures"]


# --- one family per report --------------------------------------------------------------------------------------


LUCKY = [-0.03, -0.005, -0.02, -0.025, 0.01, -0.015, -0.02, 0.004]  # mean -0.0126, p 0.040 alone


def lucky_with_stability() -> list[dict]:
    """qk lucky by LUCKY at every lr (the loss alone: p 0.040), its loss away from the best lr noisier (a stability
    test that decides nothing)."""
    rng = np.random.default_rng(8)
    runs = []
    for s in range(8):
        for lr, shape in ((1e-3, 0.3), (3e-3, 0.0), (1e-2, 0.3)):
            runs.append(run("layernorm", lr, s, 2.0 + 0.05 * s + shape))
            runs.append(run("qk", lr, s, 2.0 + 0.05 * s + LUCKY[s] + shape + (rng.normal(0, 0.05) if shape else 0)))
    return runs


def test_the_loss_and_the_stability_words_are_one_family():
    """Version 2 read the loss word at alpha and the stability table as a second family; now one step-down holds
    both, the family's size is stated, and a loss p of 0.040 among the stability tests is no word."""
    before = compare(lucky_with_stability(), "norm", "layernorm", stability=True, version=2)
    assert only(before)["p"] == pytest.approx(0.040, abs=0.001) and only(before)["verdict"] == "better"
    assert before["family"] == 1 and before["stability_verdict"]["family"] == 3
    result = compare(lucky_with_stability(), "norm", "layernorm", stability=True)
    c, m = only(result), measures(result)
    assert c["p"] == pytest.approx(0.040, abs=0.001) and c["verdict"] == "inconclusive"
    assert result["family"] == result["stability_verdict"]["family"] == 4
    assert result["family_tests"] == {"loss": 1, "failures": 0, "stability": 3}
    from minillm.analysis.stats import step_down
    tests = [(c["p"], c["p_equivalent"]), (None, None)] + [(m[k]["p"], m[k]["p_equivalent"]) for k in m]
    adjusted = step_down(tests)
    assert (c["p_adjusted"], c["p_equivalent_adjusted"]) == adjusted[0]
    assert [(m[k]["p_adjusted"], m[k]["p_equivalent_adjusted"]) for k in m] == adjusted[2:]
    assert c["p_adjusted"] > 0.05


def test_verdicts_md_states_the_one_family(tmp_path, capsys):
    sweep = write_sweep(tmp_path / "s", lucky_with_stability())
    code, _, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm", "--stability"], capsys)
    assert code == 0, err
    md = (sweep / "report" / "verdicts.md").read_text()
    assert "over one family of 4 tests (1 loss comparison, 3 stability measures)" in md
    assert "words adjusted in the report's one family of 4 tests" in md
    assert json.loads((sweep / "report" / "verdicts.json").read_text())["family"] == 4


# --- a spread that does not vary is no evidence --------------------------------------------------------------------


def test_differences_that_do_not_vary_are_no_evidence():
    """+0.03 at each of 3 seeds: the float spread is 1.3e-16 (not 0), and version 2's t test said worse with
    p 6e-30; now: no test, inconclusive, and a warning."""
    base = [1.9, 2.05, 2.2]
    runs = [run("layernorm", 1e-3, s, v) for s, v in enumerate(base)]
    runs += [run("rmsnorm", 1e-3, s, v + 0.03) for s, v in enumerate(base)]
    before = only(compare(runs, "norm", "layernorm", version=2))
    assert 0 < before["sd"] < 1e-15 and before["p"] < 1e-20 and before["verdict"] == "worse"
    c = only(compare(runs, "norm", "layernorm"))
    assert c["verdict"] == "inconclusive" and c["p"] is None and c["p_equivalent"] is None
    assert c["ci_low"] is None and c["seeds_needed"] is None
    assert any("the differences do not vary" in w and "no evidence" in w for w in c["warnings"])
    equal = [run(n, 1e-3, s, v) for n in ("layernorm", "rmsnorm") for s, v in enumerate(base)]  # sd exactly 0
    assert compare(equal, "norm", "layernorm", version=2)["comparisons"][0]["verdict"] == "equivalent"
    assert only(compare(equal, "norm", "layernorm"))["verdict"] == "inconclusive"


def test_the_discrete_stability_measures_get_exact_tests():
    """3 seeds whose trainable range is one grid step wider in every seed (a zero spread): version 2 said better with
    p 0; the sign test's p is 2 / 2^3 = 0.25, no word. The failure share (qk never fails, layernorm at the top lr in
    every seed): the exact test stratified by seed, not a t test of identical shares."""
    flat = {**BOWL, 1e-1: 0.05}  # within the tolerance at 1e-1: one step more of trainable range
    sharp = {**BOWL, 1e-1: None}
    before = measures(compare(curves(sharp, flat, seeds=3), "norm", "layernorm", stability=True, version=2))
    assert before["lr_range_decades"]["p"] == 0.0 and before["lr_range_decades"]["verdict"] == "better"
    assert 0 < before["failure_rate"]["sd"] < 1e-16  # 3.4e-17: the float spread of identical shares
    assert before["failure_rate"]["p"] < 1e-30 and before["failure_rate"]["verdict"] == "better"
    m = measures(compare(curves(sharp, flat, seeds=3), "norm", "layernorm", stability=True))
    assert m["lr_range_decades"]["test"] == "sign test" and m["lr_range_decades"]["p"] == pytest.approx(0.25)
    assert m["lr_range_decades"]["verdict"] == "inconclusive"
    assert m["failure_rate"]["p"] == pytest.approx(2 / 2 ** 3)  # each seed's one failure fell on layernorm
    assert m["failure_rate"]["verdict"] == "inconclusive"
    many = measures(compare(curves(sharp, flat, seeds=12), "norm", "layernorm", stability=True))
    assert many["lr_range_decades"]["verdict"] == "better" and many["failure_rate"]["verdict"] == "better"


def test_exact_tests_known_answers():
    from minillm.analysis.exact import degenerate, failure_test, sign_tests, stratified_exact_p

    assert sign_tests([0.5, 0.5, 0.5], 0.25) == {"p": 0.25, "p_equivalent": 1.0, "lower": 0, "higher": 3,
                                                 "ties": 0}
    assert sign_tests([0.0] * 8, 0.25)["p"] is None and sign_tests([0.0] * 8, 0.25)["p_equivalent"] == 2 ** -8
    # one stratum: Fisher's exact test; identical strata: the convolution of their hypergeometrics
    assert stratified_exact_p([(6, 8, 1, 8)]) == pytest.approx(stats.fisher_exact([[6, 2], [1, 7]]).pvalue)
    assert stratified_exact_p([(0, 5, 1, 5)] * 6) == pytest.approx(2 / 2 ** 6)
    assert stratified_exact_p([(0, 5, 0, 5), (5, 5, 5, 5)]) is None  # nothing can differ
    assert failure_test(6, 8, 1, 8) == pytest.approx(stats.boschloo_exact([[6, 2], [1, 7]]).pvalue)
    assert failure_test(0, 8, 0, 8) is None
    assert degenerate(1.3e-16, [2.2]) and degenerate(0.0, [2.0]) and not degenerate(1e-6, [2.0])
    assert degenerate(5e-7, [1000.0]) and not degenerate(None, [2.0])


# --- stability measures that mean what they say ------------------------------------------------------------------


def test_the_same_curve_shifted_one_grid_step_is_not_worse_lr_sensitivity():
    """Version 2 read the sensitivity over the whole grid, so the shifted curve, cut off at the top, was "worse"; read
    around each arm's own best it is the same curve, and a warning says the optima differ."""
    before = measures(compare(curves(BOWL, SHIFTED), "norm", "layernorm", stability=True, version=2))
    assert before["lr_sensitivity"]["verdict"] == "worse"
    result = compare(curves(BOWL, SHIFTED), "norm", "layernorm", stability=True)
    m = measures(result)
    assert m["lr_sensitivity"]["verdict"] not in ("worse", "better")
    assert m["lr_sensitivity"]["diff"] == pytest.approx(0.0, abs=0.005)
    assert m["lr_range_decades"]["verdict"] not in ("worse", "better")
    (c,) = result["stability_verdict"]["comparisons"]
    assert any("best lrs differ (arm 0.03, baseline 0.01)" in w and "each run's own best lr" in w
               for w in c["warnings"])
    from minillm.analysis.verdict_files import markdown
    assert "- qk (-): the arms' best lrs differ (arm 0.03, baseline 0.01)" in markdown(result)
    (c,) = compare(curves(BOWL, SHIFTED), "norm", "layernorm", stability=True, version=3)[
        "stability_verdict"]["comparisons"]
    assert any("best lrs differ" in w and "-2 to +1" in w for w in c["warnings"])  # version 3 kept for its plans


def test_a_chance_best_in_a_few_seeds_does_not_move_every_seeds_reading():
    """Both arms have the same curve and fail alike at the top lr; two of the arm's 8 seeds had a lucky 3e-3, enough
    to move the best of its seeds' mean there. Version 3 read every seed of the arm around that best (a window whose
    far end, where the baseline failed, was cut off for both), so all 8 differences were positive: "worse". Read
    around each run's own best, the 6 ordinary seeds differ by noise only, and no word follows."""
    fails_top = {**BOWL, 1e-1: None}
    runs = curves(fails_top, fails_top)
    for r in runs:
        if r["norm"] == "qk" and r["lr"] == 3e-3 and r["seed"] in (0, 1):
            r["final_val_loss"] = r["best_val_loss"] = r["final_val_loss"] - 0.25
    before = measures(compare(runs, "norm", "layernorm", stability=True, version=3))["lr_sensitivity"]
    assert before["verdict"] == "worse" and before["diff"] > 0.05
    after = measures(compare(runs, "norm", "layernorm", stability=True))["lr_sensitivity"]
    assert after["verdict"] == "inconclusive" and after["p"] > 0.05


def test_the_report_decides_by_the_rules_version_asked_for(tmp_path, capsys):
    """minillm-report --rules-version: 4 by default, 3 for the stability reading of version 3, one line otherwise."""
    fails_top = {**BOWL, 1e-1: None}
    runs = curves(fails_top, fails_top)
    for r in runs:
        if r["norm"] == "qk" and r["lr"] == 3e-3 and r["seed"] in (0, 1):
            r["final_val_loss"] = r["best_val_loss"] = r["final_val_loss"] - 0.25
    sweep = write_sweep(tmp_path / "s", runs)
    words = {}
    for version in (None, 3):
        extra = [] if version is None else ["--rules-version", str(version)]
        code, _, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm", "--stability", *extra],
                                   capsys)
        assert code == 0, err
        verdicts = json.loads((sweep / "report" / "verdicts.json").read_text())
        (c,) = verdicts["stability_verdict"]["comparisons"]
        words[verdicts["version"]] = c["measures"]["lr_sensitivity"]["verdict"]
    assert words == {4: "inconclusive", 3: "worse"}
    code, _, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm", "--rules-version", "7"], capsys)
    assert code == 2 and "--rules-version: 7 is invalid; allowed: 2, 3, 4" in err.strip().splitlines()[-1]


def test_a_failure_is_the_failure_rates_not_a_high_sensitivity():
    """qk's curve is layernorm's but it diverges at the top lr: version 2 counted that as 2.2 nats of sensitivity
    too (worse twice for one fact); now the sensitivity is read where both trained, the failure rate carries it."""
    fails_top = {**BOWL, 1e-1: None}
    before = measures(compare(curves(BOWL, fails_top), "norm", "layernorm", stability=True, version=2))
    assert before["lr_sensitivity"]["verdict"] == "worse" and before["failure_rate"]["verdict"] == "worse"
    m = measures(compare(curves(BOWL, fails_top), "norm", "layernorm", stability=True))
    assert m["lr_sensitivity"]["verdict"] not in ("worse", "better")
    assert m["lr_sensitivity"]["diff"] == pytest.approx(0.0, abs=0.005)
    assert m["failure_rate"]["verdict"] == "worse" and m["failure_rate"]["p"] == pytest.approx(2 / 2 ** 8)


def test_an_arm_that_failed_at_every_lr_has_no_range_or_sensitivity():
    """Version 2 gave it the whole grid as its trainable range (better) and a sensitivity of 0 (better)."""
    never = {lr: None for lr in LRS}
    before = measures(compare(curves(BOWL, never), "norm", "layernorm", stability=True, version=2))
    assert before["lr_range_decades"]["verdict"] == "better" and before["lr_sensitivity"]["verdict"] == "better"
    result = compare(curves(BOWL, never), "norm", "layernorm", stability=True)
    m = measures(result)
    assert m["lr_range_decades"]["arm_mean"] is None and m["lr_range_decades"]["verdict"] == "inconclusive"
    assert m["lr_sensitivity"]["p"] is None and m["lr_sensitivity"]["verdict"] == "inconclusive"
    assert m["failure_rate"]["verdict"] == "worse"
    (c,) = result["stability_verdict"]["comparisons"]
    assert any("the arm trained at no lr of the grid" in w for w in c["warnings"])


def test_a_best_lr_at_the_grids_edge_is_a_warning():
    edge = {lr: 0.05 * (i - 4) ** 2 for i, lr in enumerate(LRS)}  # best at the top lr
    (c,) = compare(curves(BOWL, edge), "norm", "layernorm", stability=True, version=3)["stability_verdict"][
        "comparisons"]
    assert any("the arm's best lr 0.1 sits at the grid's edge" in w for w in c["warnings"])
    (c,) = compare(curves(BOWL, edge), "norm", "layernorm", stability=True)["stability_verdict"]["comparisons"]
    assert any("the arm's own best lr sits at the grid's edge in 8 of 8 runs" in w for w in c["warnings"])


def test_version_4_warns_of_runs_whose_own_best_is_at_the_edge_when_the_seeds_mean_best_is_not():
    """Version 4 reads each run around its own best, so the edge that bounds its measures is each run's: a curve
    flat between the top two lrs puts some runs' own best at the top while the seeds' mean best is inside."""
    flat_top = {lr: [0.3, 0.2, 0.1, 0.0, 0.002][i] for i, lr in enumerate(LRS)}
    runs = curves(BOWL, flat_top)
    own_top = sum(min((r for r in runs if r["norm"] == "qk" and r["seed"] == s), key=lambda r: r["final_val_loss"])
                  ["lr"] == LRS[-1] for s in range(8))
    assert 0 < own_top < 8
    (c,) = compare(runs, "norm", "layernorm", stability=True, version=3)["stability_verdict"]["comparisons"]
    assert not any("edge" in w for w in c["warnings"])
    (c,) = compare(runs, "norm", "layernorm", stability=True)["stability_verdict"]["comparisons"]
    assert any(f"the arm's own best lr sits at the grid's edge in {own_top} of 8 runs" in w for w in c["warnings"])


# --- failures get a word of their own ------------------------------------------------------------------------------


def six_of_eight() -> list[dict]:
    rng = np.random.default_rng(5)
    runs = [run("layernorm", 1e-3, s, None if s == 7 else 2.0 + 0.01 * s + rng.normal(0, 0.005)) for s in range(8)]
    return runs + [run("dyt", 1e-3, s, None if s < 6 else 2.0 + 0.01 * s + rng.normal(0, 0.005)) for s in range(8)]


def test_an_arm_that_fails_6_of_8_against_1_of_8_fails_more_often():
    """Fisher p 0.041; the loss of the survivors (1 pair) cannot decide, and version 2 had no word for it. Boschloo's
    exact test (p 0.016) gives the word "fails more often", in the report's family."""
    before = only(compare(six_of_eight(), "norm", "layernorm", failures="drop", version=2))
    assert before["fisher_p"] == pytest.approx(0.0406, abs=1e-4) and before["verdict"] == "inconclusive"
    assert "failure_verdict" not in before
    c = only(compare(six_of_eight(), "norm", "layernorm", failures="drop"))
    assert c["failure_p"] == pytest.approx(stats.boschloo_exact([[6, 2], [1, 7]]).pvalue)
    assert c["failure_verdict"] == "fails more often" and c["failure_p_adjusted"] <= 0.05
    assert c["verdict"] == "inconclusive"  # the loss word stays the loss's
    penalized = compare(six_of_eight(), "norm", "layernorm")
    assert only(penalized)["failure_verdict"] == "fails more often" and penalized["family"] == 2
    assert "**it fails more often** (6 of 8 runs against 1 of 8, Boschloo p 0.016, adjusted 0.031" in \
        __import__("minillm.analysis.verdict_files", fromlist=["markdown"]).markdown(penalized)


def one_failure_in_eight() -> list[dict]:
    rng = np.random.default_rng(6)
    runs = [run("layernorm", 1e-3, s, 2.0 + 0.01 * s + rng.normal(0, 0.004)) for s in range(8)]
    return runs + [run("rmsnorm", 1e-3, s, None if s == 3 else 2.0 + 0.01 * s + 0.003 + rng.normal(0, 0.004))
                   for s in range(8)]


def test_seeds_needed_comes_from_the_runs_that_trained_and_the_failure_rates_power():
    """One failure in 8 makes the penalized differences a two-point mixture (sd 0.76): version 2 planned 118 pairs
    from it. Now the loss plan reads the 7 pairs that trained, and the failures get their own plan."""
    from minillm.analysis.exact import pairs_for_margin, seeds_for_failures

    before = only(compare(one_failure_in_eight(), "norm", "layernorm", version=2))
    assert before["verdict"] == "inconclusive" and before["seeds_needed"] > 100
    result = compare(one_failure_in_eight(), "norm", "layernorm")
    c = only(result)
    assert c["verdict"] == "inconclusive" and c["failure_verdict"] == "no difference shown"
    trained = [r["final_val_loss"] for r in one_failure_in_eight()]
    diffs = [trained[8 + s] - trained[s] for s in range(8) if s != 3]
    assert c["seeds_needed"] == pairs_for_margin(np.std(diffs, ddof=1), 7, 0.02, tests=2) < 10
    assert c["seeds_needed_failures"] == seeds_for_failures(1 / 8, 0, tests=2)


def test_pairs_for_margin_decides_both_ways_with_its_power():
    """At the planned N (the spread taken as given: sd_confidence 0.5 with many pairs), simulated sweeps pass the
    equivalence test at a true 0 and reject at a true margin in about 80% of cases each."""
    from minillm.analysis.exact import pairs_for_margin

    sd, margin = 0.01, 0.02
    n = pairs_for_margin(sd, 10 ** 6, margin, sd_confidence=0.5)
    rng = np.random.default_rng(0)
    for true, field in ((0.0, "equivalent"), (margin, "differs")):
        d = rng.normal(true, sd, size=(4000, n))
        se = d.std(ddof=1, axis=1) / math.sqrt(n)
        mean = d.mean(axis=1)
        if field == "equivalent":
            crit = stats.t.ppf(0.95, n - 1)
            passed = (mean - crit * se > -margin) & (mean + crit * se < margin)
        else:
            passed = np.abs(mean / se) > stats.t.ppf(0.975, n - 1)
        assert passed.mean() >= 0.78, (field, n, passed.mean())


# --- words and names ---------------------------------------------------------------------------------------------


def test_the_share_of_pairs_better_and_the_probability_of_improvement_are_named_apart():
    """Version 2's p_improvement, said to be rliable's, was the paired sign share; now share_better is that share,
    and prob_improvement is rliable's P(arm run better than baseline run) over all run pairs, with an interval."""
    from minillm.analysis.exact import probability_of_improvement

    runs = [run("layernorm", 1e-3, s, 2.0 + 0.1 * s) for s in range(4)]
    runs += [run("rmsnorm", 1e-3, s, 2.0 + 0.1 * s + d) for s, d in enumerate((-0.01, -0.02, 0.005, -0.015))]
    before = only(compare(runs, "norm", "layernorm", version=2))
    assert before["p_improvement"] == 0.75
    c = only(compare(runs, "norm", "layernorm"))
    assert "p_improvement" not in c and c["share_better"] == 0.75
    a, b = [2.0 + 0.1 * s + d for s, d in enumerate((-0.01, -0.02, 0.005, -0.015))], [2.0 + 0.1 * s for s in range(4)]
    all_pairs = np.mean([[x < y for y in b] for x in a])
    assert c["prob_improvement"]["value"] == pytest.approx(all_pairs) == pytest.approx(9 / 16)
    assert c["prob_improvement"]["ci_low"] <= all_pairs <= c["prob_improvement"]["ci_high"]
    assert probability_of_improvement([1.0, 2.0], [1.5, 3.0])["value"] == 0.75
    assert probability_of_improvement([1.0], [1.0])["value"] == 0.5  # a tie counts half


def test_the_inconclusive_sentence_asks_for_seeds_at_the_fixed_margin():
    from minillm.analysis.verdict_files import markdown

    result = compare(one_failure_in_eight(), "norm", "layernorm")
    md = markdown(result)
    assert "more seeds are needed to decide at the fixed margin ±0.02 (about" in md
    assert "share of pairs better" in md and "probability of improvement (an arm run beats a baseline run)" in md
    assert "or a larger margin" not in md and "A margin chosen after seeing the runs" in md
    assert "the held-out test split contains the validation windows" in md
    old = markdown(compare(one_failure_in_eight(), "norm", "layernorm", version=2))
    assert "or a larger margin" in old and "better in 62% of the pairs" in old  # version 2's words stay


def test_the_selection_aware_test_takes_no_evidence_from_differences_that_do_not_vary():
    """An arm exactly 0.03 below the baseline at every seed and lr: the per-lr cells have no spread, so the
    selection-aware test decides nothing (before: better, p 1e-73, beside the warning that there is no evidence),
    and the sentence does not ask for more seeds (none would decide)."""
    runs = [run(n, lr, s, 2.0 + 0.01 * s + 0.1 * (lr == 1e-3) - 0.03 * (n == "rmsnorm"))
            for n in ("layernorm", "rmsnorm") for lr in (1e-3, 3e-3) for s in range(6)]
    result = compare(runs, "norm", "layernorm", lr_choice="selection-aware")
    (c,) = result["comparisons"]
    assert c["verdict"] == "inconclusive" and c["p"] == 1.0 and c["no_spread"], (c["verdict"], c["p"])
    from minillm.analysis.verdict_files import sentence

    assert "more seeds are needed" not in sentence(c, result)


def test_selection_aware_is_a_rule_of_version_3_only():
    from minillm.analysis.rules import CompareError

    runs = [run(n, lr, s, 2.0 + 0.001 * s * (n == "rmsnorm")) for n in ("layernorm", "rmsnorm") for lr in (1e-3, 3e-3)
            for s in range(4)]
    with pytest.raises(CompareError, match="--lr-choice: selection-aware is a rule of version 3"):
        compare(runs, "norm", "layernorm", lr_choice="selection-aware", version=2)


def test_the_failure_veto_says_its_p_is_unadjusted():
    """Survivors better, 4 of 8 failed against 0 of 8: the failure word (adjusted p 0.057) says no difference shown,
    and the veto that withholds `better` (unadjusted p 0.029) says it read the unadjusted p, not the contradiction
    "fails significantly more often" beside "no difference shown"."""
    noise = [0.001, -0.002, 0.0015, -0.0005, 0.002, -0.001, 0.0, 0.0007]
    runs = [run("layernorm", 1e-3, s, 2.0 + 0.01 * s) for s in range(8)] + [
        run("rmsnorm", 1e-3, s, None if s < 4 else 1.95 + 0.01 * s + noise[s]) for s in range(8)]
    (c,) = compare(runs, "norm", "layernorm", failures="drop")["comparisons"]
    assert (c["verdict"], c["failure_verdict"]) == ("inconclusive", "no difference shown")
    assert [w for w in c["warnings"] if "fails significantly more often" in w] == [
        "the arm fails significantly more often (4 of 8 against 0 of 8, Boschloo, unadjusted p 0.029): not better"]


def test_pairs_for_margin_where_scipys_noncentral_t_gives_nan():
    """A small spread against the margin puts the noncentrality where scipy's noncentral t returns NaN for the lower
    tail: the plan is then the few pairs that decide (the normal limit), not a count inflated by NaN comparisons
    (before: 6 and 7 pairs where 3 decide with power ~1)."""
    from minillm.analysis.exact import pairs_for_margin

    assert pairs_for_margin(0.001, 2, 0.02, tests=1) == 3 and pairs_for_margin(0.001, 2, 0.02, tests=2) == 3
    assert pairs_for_margin(0.0175, 3, 0.02, tests=2) == pairs_for_margin(0.0175, 3, 0.02, tests=2, max_n=200)


def test_version_4_reads_each_run_around_its_lowest_trained_loss_and_gives_no_range_to_a_one_step_window():
    """A failed cell is never a run's own best (its loss, a mean with a failed run, can be the lowest), and a pair
    whose window holds one grid step (its runs' bests at opposite ends of a 2-lr grid) has no range, not a tie."""
    from minillm.analysis.lr_curves import aligned_measures
    from minillm.analysis.rules import Rules

    grid, seeds = [1e-3, 1e-2, 1e-1], [0, 1, 2]
    arm = {s: {1e-3: (1.0, True), 1e-2: (2.0, False), 1e-1: (2.1 + 0.01 * s, False)} for s in seeds}
    base = {s: {1e-3: (2.1, False), 1e-2: (2.0, False), 1e-1: (2.1 + 0.02 * s, False)} for s in seeds}
    found, _ = aligned_measures(arm, base, grid, seeds, Rules())
    assert found["lr_sensitivity"][0] == pytest.approx((0.05, 0.05))  # both read around 1e-2
    two = [1e-2, 1e-1]
    arm2 = {s: {1e-2: (2.0, False), 1e-1: (2.2, False)} for s in seeds}
    base2 = {s: {1e-2: (2.2, False), 1e-1: (2.0, False)} for s in seeds}
    found, _ = aligned_measures(arm2, base2, two, seeds, Rules())
    assert found["lr_range_decades"] == [(None, None)] * 3
    found, _ = aligned_measures(arm2, base2, two, seeds, Rules(version=3))  # version 3 kept as it was
    assert found["lr_range_decades"] == [(0.0, 0.0)] * 3
