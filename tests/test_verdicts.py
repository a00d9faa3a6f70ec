"""minillm/analysis/stats.py (the statistics, against known answers) and minillm/analysis/compare.py (a sweep's runs ->
verdicts) on
synthetic sweeps with planted effects: each test plants an effect that the wrong method would call differently."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from minillm.analysis.compare import compare
from minillm.analysis.exact import pairs_for_margin
from minillm.analysis.lr_choice import tuning_loss
from minillm.analysis.rules import REGISTERED_BEFORE, CompareError
from minillm.analysis.runs import find_runs
from minillm.analysis.stats import (
    bootstrap,
    exact_ci,
    fisher_p,
    holm,
    paired_t,
    seeds_needed,
    seeds_to_plan,
    sign_test,
    verdict,
    welch_t,
)
from minillm.analysis.strata import strata_keys

LOSS_INIT, UNIGRAM = math.log(65), 3.0
LRS = (1e-3, 3e-3, 1e-2, 3e-2)
SEEDS = tuple(range(8))
SEED_EFFECT = (0.12, -0.15, 0.05, 0.2, -0.08, -0.18, 0.1, -0.06)  # shared by every arm of a seed: sd 0.14
LR_SHAPE = {1e-3: 0.1, 3e-3: 0.0, 1e-2: 0.15, 3e-2: 0.6}  # best at 3e-3, inside the grid
SCALENORM_SHAPE = {1e-3: 0.4, 3e-3: 0.2, 1e-2: 0.0, 3e-2: 0.1}  # best at 1e-2: tuned, as good as the baseline
POWERNORM_DIFFS = (0.05, -0.02, 0.04, -0.03, 0.06, 0.0, -0.01, 0.03)  # mean +0.015, sd 0.033: undecided
DYT_DIVERGED = (1, 4, 6)  # seeds whose dyt runs diverge (at every lr)


def run(norm: str, lr: float, seed: int, final: float | None, **extra) -> dict:
    """A summary.json as RunSummary writes it (the fields the comparison reads)."""
    diverged = final is None
    final = None if diverged else float(final)
    summary = {"name": "planted", "norm": norm, "placement": "pre", "lr": lr, "seed": seed, "warmup_steps": 40,
               "precision": "32-true", "n_layers": 2, "dim": 32, "vocab_size": 65, "loss_init": LOSS_INIT,
               "unigram_loss": UNIGRAM, "status": "diverged" if diverged else "completed",
               "final_val_loss": final, "best_val_loss": final, "test_loss": None, "diverged": diverged,
               "failed": diverged or final >= UNIGRAM, "started_at": "2026-11-20T10:00:00+00:00",
               "git_commit": "0123456789abcdef", "git_dirty": False, "torch_version": "2.13.0+cpu",
               "cpu_capability": "AVX2"}
    return {**summary, **extra}


def planted_runs() -> list[dict]:
    """norm layernorm (the baseline), rmsnorm (+0.004, seen only when paired), scalenorm (as good, at its own lr),
    dyt (+0.1, 3 of 8 seeds diverge), powernorm (+0.015 with a spread that decides nothing): 4 lrs x 8 seeds."""
    noise = np.random.default_rng(0).normal(0, 0.002, size=(5, len(SEEDS)))
    runs = []
    for lr in LRS:
        for s in SEEDS:
            base = 2.0 + SEED_EFFECT[s] + noise[0, s]
            runs.append(run("layernorm", lr, s, base + LR_SHAPE[lr]))
            runs.append(run("rmsnorm", lr, s, base + 0.004 + LR_SHAPE[lr] + noise[1, s]))
            runs.append(run("scalenorm", lr, s, base + SCALENORM_SHAPE[lr] + noise[2, s]))
            runs.append(run("dyt", lr, s, None if s in DYT_DIVERGED else base + 0.1 + LR_SHAPE[lr] + noise[3, s]))
            runs.append(run("powernorm", lr, s, base + POWERNORM_DIFFS[s] + LR_SHAPE[lr]))
    return runs


def write_sweep(root: Path, runs: list[dict]) -> Path:
    """Run folders as a sweep leaves them (<root>/<job>/summary.json)."""
    for i, summary in enumerate(runs):
        (root / str(i)).mkdir(parents=True)
        (root / str(i) / "summary.json").write_text(json.dumps(summary))
    return root


@pytest.fixture
def planted(tmp_path) -> Path:
    return write_sweep(tmp_path / "planted", planted_runs())


def by_arm(result: dict) -> dict:
    return {c["arm"]: c for c in result["comparisons"]}


# --- the statistics, known answers --------------------------------------------------------------------------------


def test_paired_and_welch_t_intervals_known_answers():
    # differences 0.01, 0.03, 0.02: mean 0.02, sd 0.01, t(0.975, 2) = 4.302653 -> half-width 0.0248414
    got = paired_t([2.01, 2.03, 2.02], [2.0, 2.0, 2.0])
    assert got["diff"] == pytest.approx(0.02) and got["sd"] == pytest.approx(0.01) and got["n"] == 3
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((0.02 - 0.0248414, 0.02 + 0.0248414), abs=1e-6)
    assert got["p"] == pytest.approx(0.07418, abs=1e-4)
    # Welch: [1, 2, 3] vs [2, 3, 5]: se^2 = 1/3 + 7/9, df = (10/9)^2 / ((1/3)^2/2 + (7/9)^2/2) = 3.5385
    got = welch_t([1, 2, 3], [2, 3, 5])
    se, df = math.sqrt(1 / 3 + 7 / 9), (10 / 9) ** 2 / ((1 / 3) ** 2 / 2 + (7 / 9) ** 2 / 2)
    half = stats.t.ppf(0.975, df) * se
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((-4 / 3 - half, -4 / 3 + half))
    assert paired_t([2.0], [1.0])["ci_low"] is None and welch_t([1.0], [1.0, 2.0])["p"] is None
    same = paired_t([2.5, 2.6, 2.7], [2.5, 2.6, 2.7])  # identical runs (the same kernels): a zero-width interval
    assert (same["ci_low"], same["ci_high"], same["p"]) == (0.0, 0.0, 1.0)


def test_exact_failure_intervals_fisher_and_holm_known_answers():
    assert exact_ci(0, 10) == pytest.approx((0.0, 1 - 0.025 ** (1 / 10)))  # Clopper-Pearson at k = 0
    assert exact_ci(3, 8) == pytest.approx((0.085233, 0.755136), abs=1e-6)
    assert exact_ci(0, 0) is None
    assert fisher_p(6, 10, 0, 10) == pytest.approx(0.010836, abs=1e-6)  # twice S7's one-sided 0.0054
    assert fisher_p(3, 8, 0, 8) == pytest.approx(0.2)
    # one-sided (a rule that fixed the direction first): C(10,6) C(10,0) / C(20,6) = 210 / 38760; 4 of 4 on the arm
    assert fisher_p(6, 10, 0, 10, "greater") == pytest.approx(210 / 38760)
    assert fisher_p(4, 10, 0, 10, "greater") == pytest.approx(math.comb(10, 4) / math.comb(20, 4))
    assert fisher_p(0, 10, 6, 10, "less") == pytest.approx(210 / 38760) and fisher_p(6, 10, 0, 10, "less") == 1.0
    with pytest.raises(ValueError, match="alternative"):
        fisher_p(1, 2, 0, 2, "one-sided")
    # Holm: sorted 0.01, 0.03, 0.04 -> 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 1 x 0.04)
    assert holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.03, 0.06, None, 0.06])
    assert holm([0.5, 0.6]) == [1.0, 1.0]


def test_sign_test_known_answers():
    # 2 of 10 pairs lower: P(X <= 2) + P(X >= 8) for X ~ Bin(10, 1/2) = 2 x 56 / 1024; a tie is left out
    got = sign_test([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [2, 3] + [0] * 8)
    assert (got["lower"], got["higher"], got["ties"]) == (2, 8, 0) and got["p"] == pytest.approx(112 / 1024)
    got = sign_test([1.0, 2.0, 3.0], [1.0, 1.0, 1.0])
    assert (got["lower"], got["higher"], got["ties"], got["p"]) == (0, 2, 1, 0.5)
    assert sign_test([1.0], [1.0])["p"] is None


def test_the_verdict_vocabulary():
    assert verdict(-0.01, 0.015, 0.02) == "equivalent"
    assert verdict(0.005, 0.015, 0.02) == "equivalent"  # significant, and too small to matter
    assert verdict(-0.09, -0.03, 0.02) == "better" and verdict(-0.09, -0.03, 0.02, higher_is_better=True) == "worse"
    assert verdict(0.01, 0.05, 0.02) == "worse"
    assert verdict(-0.01, 0.05, 0.02) == "inconclusive" and verdict(None, None, 0.02) == "inconclusive"
    assert verdict(-0.02, 0.01, 0.02) == "inconclusive"  # the margin is open: -0.02 is not inside it


def test_seeds_needed_is_the_smallest_n_whose_interval_decides():
    diff, sd, margin = 0.015, 0.033, 0.02

    def decides(n):
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        return abs(diff) > half or abs(diff) + half < margin

    n = seeds_needed(diff, sd, margin)
    assert decides(n) and not any(decides(k) for k in range(2, n)) and n == 22
    assert seeds_needed(0.0, 0.01, 0.02) == 4  # t(0.975, 3) * 0.01 / 2 = 0.0159 < 0.02; n = 3: 0.0248
    assert seeds_needed(0.0, 0.0, 0.02) == 2 and seeds_needed(0.01, None, 0.02) is None


def test_bootstrap_interval_is_seeded_and_needs_8_differences():
    rng = np.random.default_rng(3)
    a, b = rng.normal(2.0, 0.1, 10), rng.normal(2.0, 0.1, 10)
    first = bootstrap(a, b)
    assert first == bootstrap(a, b)  # the same numbers, the same interval
    lo, hi = first
    t = paired_t(a, b)
    assert lo < t["diff"] < hi and abs((hi - lo) - (t["ci_high"] - t["ci_low"])) < 0.5 * (t["ci_high"] - t["ci_low"])
    assert bootstrap(a[:7], b[:7]) is None and bootstrap(a, b, paired=False) != first


# --- the comparison of a sweep, planted effects --------------------------------------------------------------------


def test_pairing_by_seed_shows_equivalence_that_an_unpaired_interval_cannot(planted):
    """rmsnorm = layernorm + 0.004 in every seed, under a seed effect (sd 0.14) both arms share."""
    paired = by_arm(compare(find_runs(planted), "norm", "layernorm"))["rmsnorm"]
    assert paired["paired_by"] == "seed" and paired["n_pairs"] == 8 and paired["ci_method"] == "paired t"
    assert paired["diff"] == pytest.approx(0.004, abs=0.002)
    assert -0.02 < paired["ci_low"] < paired["ci_high"] < 0.02 and paired["verdict"] == "equivalent"
    assert paired["informative"] and [w[:37] for w in paired["warnings"]] == ["the lr was chosen on the runs that ju"]
    unpaired = by_arm(compare(find_runs(planted), "norm", "layernorm", paired_by="none"))["rmsnorm"]
    assert unpaired["ci_method"] == "Welch t" and unpaired["n_pairs"] is None
    assert unpaired["diff"] == pytest.approx(paired["diff"])  # the same difference, a 20x wider interval
    assert unpaired["ci_high"] - unpaired["ci_low"] > 20 * (paired["ci_high"] - paired["ci_low"])
    assert unpaired["ci_low"] < -0.02 and unpaired["ci_high"] > 0.02 and unpaired["verdict"] == "inconclusive"


def test_each_arm_at_its_own_tuned_lr_gives_the_right_effect_size(planted):
    """scalenorm is as good as layernorm at its own best lr (1e-2), and 0.2 worse at layernorm's (3e-3)."""
    tuned = by_arm(compare(find_runs(planted), "norm", "layernorm"))["scalenorm"]
    assert (tuned["arm_lr"], tuned["baseline_lr"]) == (1e-2, 3e-3)
    assert tuned["diff"] == pytest.approx(0.0, abs=0.003) and tuned["verdict"] == "equivalent"
    assert tuned["arm_lr_grid"]["0.01"] == pytest.approx(2.0 + np.mean(SEED_EFFECT), abs=0.002)
    common = by_arm(compare(find_runs(planted), "norm", "layernorm", lr="common", version=2))["scalenorm"]
    assert (common["arm_lr"], common["baseline_lr"]) == (3e-3, 3e-3)  # version 2: the lowest mean over five norms
    assert common["diff"] == pytest.approx(0.2, abs=0.003) and common["verdict"] == "worse"
    fixed = by_arm(compare(find_runs(planted), "norm", "layernorm", lr=1e-2))["scalenorm"]
    assert (fixed["arm_lr"], fixed["baseline_lr"]) == (1e-2, 1e-2) and fixed["verdict"] == "better"


def test_diverged_runs_are_counted_with_exact_tests_and_left_out_of_the_pairs_under_the_old_rules(planted):
    """--failures drop (the rules registered before failed runs counted): survivors only, failures beside them."""
    dyt = by_arm(compare(find_runs(planted), "norm", "layernorm", **REGISTERED_BEFORE))["dyt"]
    assert dyt["arm_lr"] == 3e-3  # diverged runs count as ln V at every lr: the best lr stays
    assert (dyt["fail_arm"], dyt["n_arm"], dyt["fail_baseline"], dyt["n_baseline"]) == (3, 8, 0, 8)
    assert dyt["diverged_arm"] == 3 and dyt["fisher_p"] == pytest.approx(0.2)
    assert dyt["fail_arm_ci"] == pytest.approx(exact_ci(3, 8)) and dyt["fail_baseline_ci"][0] == 0.0
    assert dyt["n_pairs"] == 5 and dyt["pairs_left_out"] == 3 and dyt["seeds"] == [0, 2, 3, 5, 7]
    assert dyt["diff"] == pytest.approx(0.1, abs=0.003) and dyt["verdict"] == "worse" and dyt["significant"]


def test_an_undecided_arm_is_inconclusive_with_the_seeds_a_decision_needs(planted):
    result = compare(find_runs(planted), "norm", "layernorm", **REGISTERED_BEFORE)
    pn = by_arm(result)["powernorm"]
    d = np.array(POWERNORM_DIFFS)
    assert pn["diff"] == pytest.approx(d.mean()) and pn["verdict"] == "inconclusive" and not pn["significant"]
    half = stats.t.ppf(0.975, 7) * d.std(ddof=1) / math.sqrt(8)
    assert (pn["ci_low"], pn["ci_high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    assert pn["seeds_needed"] == seeds_needed(d.mean(), d.std(ddof=1), 0.02) == 23
    assert by_arm(result)["rmsnorm"]["seeds_needed"] is None  # decided
    ps = [c["p"] for c in result["comparisons"]]
    assert [c["p_holm"] for c in result["comparisons"]] == pytest.approx(holm(ps))
    assert [c["arm"] for c in result["comparisons"]] == ["dyt", "powernorm", "rmsnorm", "scalenorm"]
    # the rules of version 2: a planning number for 4 comparisons, 80% power, the spread at its upper 80% bound
    v2 = by_arm(compare(find_runs(planted), "norm", "layernorm", version=2))["powernorm"]
    assert v2["verdict"] == "inconclusive" and v2["diff"] == pytest.approx(d.mean())
    assert v2["seeds_needed"] == seeds_to_plan(d.mean(), d.std(ddof=1), 8, 0.02, tests=4) > 23
    # today's: the pairs that decide at the fixed margin both ways, for the report's family of 5 (4 comparisons and
    # dyt's failures), from the spread alone
    result = compare(find_runs(planted), "norm", "layernorm")
    now = by_arm(result)["powernorm"]
    assert result["family"] == 5 and result["family_tests"] == {"loss": 4, "failures": 1, "stability": 0}
    assert now["verdict"] == "inconclusive"
    assert now["seeds_needed"] == pairs_for_margin(d.std(ddof=1), 8, 0.02, tests=5) > 23


def test_a_config_key_that_varies_within_an_arm_splits_strata(tmp_path):
    runs = [run(n, 1e-3, s, 2.0 + 0.1 * (p == "post") + (0.05 + 0.001 * (s - 1)) * (n == "rmsnorm") + 0.01 * s,
                placement=p, norm_options={"norm": n}) for n in ("layernorm", "rmsnorm") for p in ("pre", "post")
            for s in range(3)]
    assert strata_keys(runs, "norm") == ["placement"]  # norm_options follows the norm: no stratum of its own
    result = compare(find_runs(write_sweep(tmp_path / "s", runs)), "norm", "layernorm")
    assert [(c["stratum"], c["verdict"]) for c in result["comparisons"]] == [
        ({"placement": "post"}, "worse"), ({"placement": "pre"}, "worse")]
    assert all(c["diff"] == pytest.approx(0.05) for c in result["comparisons"])


def test_warnings_that_make_a_verdict_not_informative():
    few = [run(n, 1e-3, s, 2.0 + 0.01 * s) for n in ("layernorm", "rmsnorm") for s in range(2)]
    (c,) = compare(few, "norm", "layernorm", version=2)["comparisons"]
    assert not c["informative"] and any("only 2 pairs (fewer than 3)" in w for w in c["warnings"])
    (c,) = compare(few, "norm", "layernorm")["comparisons"]  # 2 shared seeds do not pair: Welch, from 2 runs
    assert not c["informative"] and c["paired_by"] == "none"
    assert any("only 2 usable runs in an arm (fewer than 3)" in w for w in c["warnings"])
    stalled = [run("layernorm", 1e-3, s, 2.0 + 0.001 * (s - 1.5)) for s in range(4)] + [
        run("rmsnorm", 1e-3, s, 3.01) for s in range(4)]
    (c,) = compare(stalled, "norm", "layernorm", failures="drop")["comparisons"]
    assert c["fail_arm"] == 4 and c["verdict"] == "inconclusive" and not c["informative"]
    assert any("every run of the arm failed or stalled at the unigram loss" in w for w in c["warnings"])
    (c,) = compare(stalled, "norm", "layernorm")["comparisons"]  # failures counted at ln V: the arm is worse
    assert c["fail_arm"] == 4 and c["verdict"] == "worse" and c["informative"]
    assert c["diff"] == pytest.approx(LOSS_INIT - 2.0)
    kernels = [run("layernorm", 1e-3, s, 2.0 + 0.01 * s) for s in range(4)] + [
        run("rmsnorm", 1e-3, s, 2.003 + 0.01 * s + 0.0001 * s, cpu_capability="AVX512") for s in range(4)]
    (c,) = compare(kernels, "norm", "layernorm")["comparisons"]
    assert c["verdict"] == "equivalent" and not c["informative"]
    assert any("different CPU kernels (AVX512 vs AVX2)" in w and "not informative" in w for w in c["warnings"])
    edge = [run(n, lr, s, 2.0 + lr + 0.01 * s) for n in ("layernorm", "rmsnorm") for lr in (1e-3, 1e-2)
            for s in range(3)]
    (c,) = compare(edge, "norm", "layernorm")["comparisons"]
    assert sum("is the lowest of its grid" in w for w in c["warnings"]) == 2 and c["informative"]


def test_tuning_loss_is_the_outcome_rule():
    assert tuning_loss(run("x", 1e-3, 0, None), "final_val_loss") == LOSS_INIT  # diverged
    assert tuning_loss(run("x", 1e-3, 0, 3.2), "final_val_loss") == LOSS_INIT  # stalled above the unigram loss
    assert tuning_loss(run("x", 1e-3, 0, 2.0, test_loss=1.9), "test_loss") == 1.9
    assert tuning_loss(run("x", 1e-3, 0, 2.0, tokens_per_s=9.0), "tokens_per_s") == 2.0  # lr tuned on a loss


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"factor": "warmup"}, "--compare: unknown factor 'warmup', not a key of the runs' summary.json; allowed: norm"),
    ({"factor": "placement"}, "--compare: placement does not vary (every run has pre); allowed: norm"),
    ({"factor": "seed"}, "--compare: seed cannot be the factor"),
    ({"baseline": "batchnorm"}, "--baseline: 'batchnorm' is not a value of norm; allowed: dyt, layernorm, powernorm"),
    ({"metric": "val_bpb"}, "--metric: 'val_bpb' has no value in the runs' summary.json; allowed: auto, "
                            "best_val_loss, "),
    ({"margin": 0.0}, "--margin: 0.0 is invalid; allowed: a number > 0"),
    ({"alpha": 1.0}, "--alpha: 1.0 is invalid; allowed: a number in (0, 1)"),
    ({"lr": 5e-3}, "--lr: 0.005: dyt has no run at that lr (its lrs: 0.001, 0.003, 0.01, 0.03)"),
])
def test_requests_the_runs_cannot_answer_name_the_option_and_what_is_allowed(kwargs, message):
    args = {"factor": "norm", "baseline": "layernorm", **kwargs}
    with pytest.raises(CompareError) as err:
        compare(planted_runs(), args.pop("factor"), args.pop("baseline"), **args)
    assert str(err.value).startswith(message), str(err.value)


def test_common_lr_refuses_arms_that_share_no_lr():
    runs = [run("layernorm", 1e-3, s, 2.0) for s in range(3)] + [run("rmsnorm", 3e-3, s, 2.0) for s in range(3)]
    with pytest.raises(CompareError, match="--lr: common: no lr was run by every value"):
        compare(runs, "norm", "layernorm", lr="common")
    assert compare(runs, "norm", "layernorm")["comparisons"][0]["arm_lr"] == 3e-3  # tuned: each its own


def test_a_higher_is_better_metric_and_the_bootstrap_interval(planted):
    """tokens/s, 10% higher for rmsnorm: better when higher is better (the lr still tuned on the loss), and with
    interval=bootstrap the verdict's interval is the seeded BCa one."""
    runs = [{**r.summary, "tokens_per_s": 1000.0 * (1.1 if r.get("norm") == "rmsnorm" else 1.0) + r.get("seed")
             + (0.0 if r.get("norm") == "layernorm" else 0.5 * (r.get("seed") - 3.5))} for r in find_runs(planted)]
    rms = by_arm(compare(runs, "norm", "layernorm", metric="tokens_per_s", margin=20.0, higher_is_better=True))
    assert rms["rmsnorm"]["diff"] == pytest.approx(100.0) and rms["rmsnorm"]["verdict"] == "better"
    assert rms["scalenorm"]["arm_lr"] == 1e-2  # tuned on the final val loss, not on the speed
    assert rms["dyt"]["fail_arm"] == 3 and rms["powernorm"]["verdict"] == "equivalent"
    boot = by_arm(compare(find_runs(planted), "norm", "layernorm", interval="bootstrap"))["powernorm"]
    assert boot["ci_method"] == "paired bootstrap (BCa)"
    assert [boot["ci_low"], boot["ci_high"]] == boot["bootstrap_interval"] != boot["t_interval"]
    assert boot["ci_high"] - boot["ci_low"] < boot["t_interval"][1] - boot["t_interval"][0]  # too narrow at n = 8


# --- a seed mean against a threshold; the sampling error of the evaluation windows -------------------------------


def test_a_seed_mean_against_a_threshold_gives_its_interval_and_a_one_sided_p():
    from minillm.analysis.stats import against_threshold

    vals = [2.2, 2.4, 2.3, 2.5]
    t = stats.ttest_1samp(vals, 2.0)
    above = against_threshold(vals, 2.0, "at least")
    ci = t.confidence_interval(0.95)
    assert [above["ci_low"], above["ci_high"]] == pytest.approx([ci.low, ci.high])
    assert above["p"] == pytest.approx(t.pvalue / 2) and above["holds_on_mean"] and above["mean"] == pytest.approx(2.35)
    below = against_threshold(vals, 2.0, "at most")  # the other side: the data speak against it
    assert below["p"] == pytest.approx(1 - t.pvalue / 2) and not below["holds_on_mean"]
    two = against_threshold([0.9, 1.1], 1.05, "at most")  # the mean is under it, the interval far across it
    assert two["holds_on_mean"] and two["ci_high"] > 1.05 and two["p"] > 0.25
    assert against_threshold([3.0], 2.0)["ci_low"] is None
    with pytest.raises(ValueError, match="direction"):
        against_threshold(vals, 2.0, "above")


def test_window_error_paired_and_unpaired():
    """Same windows: the error of the difference is that of the per-window differences (hard windows cancel);
    different windows: the arms' window variances add. Added in quadrature to the seeds' error, the interval is
    the seeds' one when the windows add nothing, and wider otherwise."""
    from minillm.analysis.stats import window_se, with_window_error

    rng = np.random.default_rng(0)
    hardness = rng.normal(2.0, 0.5, size=200)  # shared by every run scored on these windows
    base = [hardness + rng.normal(0, 0.01, 200) for _ in range(4)]
    arm = [hardness + 0.01 + rng.normal(0, 0.01, 200) for _ in range(4)]
    se_paired, w = window_se(arm, base, paired=True)
    se_unpaired, _ = window_se(arm, base, paired=False)
    assert w == 200 and se_paired < 0.002 and se_unpaired == pytest.approx(0.5 * math.sqrt(2 / 200), rel=0.15)
    a, b = [float(x.mean()) for x in arm], [float(x.mean()) for x in base]
    seeds = paired_t(a, b)
    same = with_window_error(a, b, True, 0.0, 200)
    assert [same["ci_low"], same["ci_high"]] == pytest.approx([seeds["ci_low"], seeds["ci_high"]])
    wide = with_window_error(a, b, True, se_unpaired, 200)
    assert wide["ci_high"] - wide["ci_low"] > 2 * (seeds["ci_high"] - seeds["ci_low"])
    assert wide["method"] == "paired t + windows" and wide["df"] == 3 and wide["p"] > seeds["p"]
    welch = with_window_error(a, b, False, 0.0, 200)
    ref = welch_t(a, b)
    assert [welch["ci_low"], welch["ci_high"]] == pytest.approx([ref["ci_low"], ref["ci_high"]])
    with pytest.raises(ValueError, match="one length"):
        window_se([np.ones(3)], [np.ones(4)], paired=True)


def test_compare_adds_the_window_error_when_asked(tmp_path):
    """compare(window_error=True) reads each run's per-window losses (a record's val_windows, or val_windows.npy
    in its folder): on shared windows it barely widens the interval; runs without them keep the seeds' interval
    and say so."""
    rng = np.random.default_rng(1)
    hardness = rng.normal(2.0, 0.4, size=128)
    runs = []
    for s in range(4):
        for norm, shift in (("layernorm", 0.0), ("rmsnorm", 0.004)):
            windows = hardness + shift + 0.01 * s + rng.normal(0, 0.002, 128)
            folder = tmp_path / f"{norm}{s}"
            folder.mkdir()
            np.save(folder / "val_windows.npy", windows)
            runs.append(run(norm, 1e-3, s, float(windows.mean()), run_dir=str(folder)))
    plain, = compare(runs, "norm", "layernorm")["comparisons"]
    result = compare(runs, "norm", "layernorm", window_error=True)
    c, = result["comparisons"]
    assert result["window_error"] and c["ci_method"] == "paired t + windows"
    assert c["ci_low"] < plain["ci_low"] and c["ci_high"] > plain["ci_high"] and c["t_interval"] == [
        plain["ci_low"], plain["ci_high"]]
    assert c["window_interval"]["se_window"] < 0.001
    inline = [{**r, "run_dir": None, "val_windows": np.load(Path(r["run_dir"]) / "val_windows.npy").tolist()}
              for r in runs]
    assert compare(inline, "norm", "layernorm", window_error=True)["comparisons"][0]["ci_low"] == pytest.approx(
        c["ci_low"])
    (tmp_path / "rmsnorm0" / "val_windows.npy").unlink()
    c, = compare(runs, "norm", "layernorm", window_error=True)["comparisons"]
    assert c["ci_method"] == "paired t" and any("no per-window losses" in w for w in c["warnings"])


# --- summaries checked against minillm.schema -----------------------------------------------------------------


def test_a_summary_that_is_not_a_runs_is_not_readable(tmp_path, capsys):
    """`{}` became an arm (None: inconclusive) and `"test_loss": "abc"` in one run turned every verdict to the val
    loss: both are not readable summaries, and --skip-bad leaves them out, each named."""
    from test_report import report_main

    from minillm.analysis.runs import RunsError

    runs = [run(n, 1e-3, s, 2.0 + 0.01 * s + 0.02 * (n == "rmsnorm"), test_loss=2.0 + 0.01 * s)
            for n in ("layernorm", "rmsnorm") for s in range(4)]
    sweep = write_sweep(tmp_path / "s", [*runs, {}, {**runs[0], "seed": 9, "test_loss": "abc"}])
    with pytest.raises(RunsError, match=r"8/summary.json: not a readable summary.json \(no lr; no seed"):
        find_runs(sweep)
    bad: list[str] = []
    assert len(find_runs(sweep, bad=bad)) == 8 and len(bad) == 2
    assert "test_loss is 'abc', not number or null" in bad[1]
    with pytest.raises(CompareError, match="not a readable summary.json .test_loss is 'abc'"):
        compare([*runs, {**runs[0], "seed": 9, "test_loss": "abc"}], "norm", "layernorm")
    code, out, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm", "--skip-bad"], capsys)
    assert code == 0 and err.count("warning: skipped") == 2 and f"{sweep / '8' / 'summary.json'}" in err
    result = json.loads((sweep / "report" / "verdicts.json").read_text())
    assert result["metric"] == "test_loss" and [c["arm"] for c in result["comparisons"]] == ["rmsnorm"]


# --- an arm is a value with its options (rules version 3) ---------------------------------------------------------

STUDIES = Path(__file__).resolve().parents[1] / "experiments" / "studies"


@pytest.mark.parametrize(("round_", "baseline", "arms"), [
    ("s4_batchnorm/r3_powernorm_nogroup", "layernorm",
     {"batchnorm", "powernorm (group_scaling=0)", "powernorm (group_scaling=1)"}),
    ("s4_batchnorm/r4_powernorm_paper", "layernorm",
     {"batchnorm", "powernorm (group_scaling=0)", "powernorm (group_scaling=1)"}),
    ("s8_dyt/r1_grid", "rmsnorm", {"dyt (alpha0=0.25)", "dyt (alpha0=0.5)", "dyt (alpha0=1)", "dyt (alpha0=2)"}),
])
def test_options_tied_to_the_factor_belong_to_the_arm(round_, baseline, arms):
    """The committed sweeps whose arms come in option variants gave 0 comparisons (each variant a stratum without
    the baseline); each variant is now an arm, and the strata are what every arm ran under."""
    runs = [json.loads(line) for line in (STUDIES / round_ / "runs.jsonl").read_text().splitlines()]
    assert compare(runs, "norm", baseline, version=2)["comparisons"] == []  # version 2 unchanged
    result = compare(runs, "norm", baseline)
    assert {c["arm"] for c in result["comparisons"]} == arms
    assert "norm_options" not in result["strata_keys"] and len(result["strata_keys"]) == 1
    for c in result["comparisons"]:
        assert c["arm_value"] == c["arm"].split(" ")[0] and c["informative"]
        assert ("norm_options" in c["arm_options"]) == ("(" in c["arm"])
    assert not any(n.startswith("nothing compared") and "no baseline run" in n and "norm_options" in n
                   for n in result["notes"])


def test_a_setting_the_baseline_varies_in_or_arms_share_still_splits_strata():
    runs = [run(n, 1e-3, s, 2.0 + 0.01 * s, norm_options={"x": x}) for n in ("layernorm", "rmsnorm")
            for x in (1, 2) for s in range(3)]
    result = compare(runs, "norm", "layernorm")
    assert result["strata_keys"] == ["norm_options"] and {c["arm"] for c in result["comparisons"]} == {"rmsnorm"}


def test_pairing_needs_three_shared_seeds_covering_most_runs():
    """Seeds 0-7 against 7-14 were "paired" on seed 7 alone; Welch sees the +0.1."""
    rng = np.random.default_rng(1)
    runs = [run("layernorm", 1e-3, s, 2.0 + rng.normal(0, 0.02)) for s in range(8)]
    runs += [run("rmsnorm", 1e-3, s, 2.1 + rng.normal(0, 0.02)) for s in range(7, 15)]
    (old,) = compare(runs, "norm", "layernorm", version=2)["comparisons"]
    assert old["paired_by"] == "seed" and old["n_pairs"] == 1 and old["verdict"] == "inconclusive"
    (new,) = compare(runs, "norm", "layernorm")["comparisons"]
    assert new["paired_by"] == "none" and new["verdict"] == "worse" and new["diff"] == pytest.approx(0.1, abs=0.02)
    assert any("share 1 seed(s) (7), fewer than 3: compared unpaired (Welch)" in w for w in new["warnings"])
    arm = [run("rmsnorm", 1e-3, s, 2.1) for s in (5, 6, 7, *range(8, 16))]  # 3 shared seeds of 11
    few = [r for r in runs if r["norm"] == "layernorm"] + arm
    (c,) = compare(few, "norm", "layernorm")["comparisons"]
    assert c["paired_by"] == "none" and any("hold 3 of the arm's 11 runs, not most" in w for w in c["warnings"])
    (c,) = compare(few, "norm", "layernorm", paired_by="seed")["comparisons"]  # asked for: paired on the 3
    assert c["paired_by"] == "seed" and c["n_pairs"] == 3


def test_common_lr_is_chosen_for_each_arm_and_baseline_pair(planted):
    """Under version 2 the common lr of scalenorm against layernorm was the best over all five norms (3e-3: worse);
    scalenorm alone against layernorm picks 1e-2 (better): another arm decided its word. Now each pair picks its
    own."""
    runs = find_runs(planted)
    alone = [r for r in runs if r.get("norm") in ("layernorm", "scalenorm")]
    old = by_arm(compare(runs, "norm", "layernorm", lr="common", version=2))["scalenorm"]
    assert old["verdict"] == "worse" and old["arm_lr"] == 3e-3
    assert by_arm(compare(alone, "norm", "layernorm", lr="common", version=2))["scalenorm"]["verdict"] == "better"
    for sweep in (runs, alone):
        c = by_arm(compare(sweep, "norm", "layernorm", lr="common"))["scalenorm"]
        assert (c["arm_lr"], c["baseline_lr"], c["verdict"]) == (1e-2, 1e-2, "better")
        assert c["diff"] == pytest.approx(-0.15, abs=0.003)


# --- single-stage grid sweeps: exploratory words, or the selection-aware test -------------------------------------


def test_a_word_from_an_lr_chosen_on_the_judged_runs_is_exploratory(planted, tmp_path):
    from minillm.analysis.verdict_files import markdown

    runs = find_runs(planted)
    tuned = compare(runs, "norm", "layernorm")
    assert all(c["exploratory"] and "chosen on the judged runs" in c["exploratory_reason"]
               for c in tuned["comparisons"])
    for how, reason in (("validation", "validation windows are inside the test split"), ("crossfit", "other half")):
        c = by_arm(compare(runs, "norm", "layernorm", lr_choice=how))["scalenorm"]
        assert c["exploratory"] and reason in c["exploratory_reason"]
    text = markdown(tuned)
    assert "*Exploratory*: the lr was chosen on the judged runs." in text and "(exploratory) |" in text
    assert "does not cover these words" in text and "4 of the 4 words" in text
    for fixed in (compare(runs, "norm", "layernorm", lr=3e-3),
                  compare([r for r in runs if r.get("lr") == 3e-3], "norm", "layernorm"),
                  compare(runs, "norm", "layernorm", lr_choice="selection-aware")):
        assert not any(c["exploratory"] for c in fixed["comparisons"]) and "Exploratory" not in markdown(fixed)
    assert "exploratory" not in compare(runs, "norm", "layernorm", version=2)["comparisons"][0]


def test_the_selection_aware_test_known_answers():
    """Two arm lrs x two baseline lrs, z-like cells (df inf): better needs one arm lr below both baseline lrs."""
    from minillm.analysis.selection import grid_test

    z = stats.norm
    cells = {("a1", "b1"): (-0.05, 0.01, math.inf), ("a1", "b2"): (-0.01, 0.01, math.inf),
             ("a2", "b1"): (0.02, 0.01, math.inf), ("a2", "b2"): (-0.03, 0.01, math.inf)}
    got = grid_test(cells, ["a1", "a2"], ["b1", "b2"], margin=0.02, alpha=0.05)
    # a1: max(p(-5), p(-1)) = cdf(-1); a2: max(cdf(2), cdf(-3)) = cdf(2) -> 2 cdf(-1)
    assert got["p_better"] == pytest.approx(2 * z.cdf(-1))
    # b1: max over a of sf(d / se) = sf(-5) vs sf(2) -> sf(-5) ~ 1; b2: max(sf(-1), sf(-3)) = sf(-3) ~ 1
    assert got["p_worse"] == pytest.approx(1.0)
    assert got["p"] == pytest.approx(min(1, 4 * z.cdf(-1)))
    # upper TOST: min over a of max_b cdf((d - 0.02) / se): a1 cdf(-3), a2 cdf(1) -> 2 cdf(-3); the lower half
    # (some b below every a + margin) fails: b1 has a2 above it by 0.02 + 0.02, b2 has a1 and a2 close to it
    assert got["p_equivalent_upper"] == pytest.approx(2 * z.cdf(-3))
    assert got["p_equivalent_lower"] == pytest.approx(1.0) and got["p_equivalent"] == pytest.approx(1.0)
    assert got["diff"] == pytest.approx(-0.01)  # min_a max_b d: a1 -0.01, a2 +0.02
    # upper end: min_a max_b (d + z(1 - alpha / 4) se); lower end: max_b min_a (d - z(1 - alpha / 4) se)
    q = z.ppf(1 - 0.05 / 4)
    assert got["ci_high"] == pytest.approx(min(-0.01 + q * 0.01, 0.02 + q * 0.01))
    assert got["ci_low"] == pytest.approx(max(-0.05 - q * 0.01, -0.03 - q * 0.01))
    one = grid_test({("a", "b"): (-0.05, 0.01, math.inf)}, ["a"], ["b"], 0.02, 0.05)
    assert one["p"] == pytest.approx(2 * z.cdf(-5)) and one["ci_high"] == pytest.approx(-0.05 + z.ppf(0.975) * 0.01)
    flat = grid_test({("a", "b"): (-0.05, 0.0, 2.0)}, ["a"], ["b"], 0.02, 0.05)  # a zero spread is no evidence
    assert flat["p"] == 1.0 and flat["p_equivalent"] == 1.0


LR7 = tuple(1e-3 * 2 ** i for i in range(7))


def flat_against_steep(rng: np.random.Generator, seeds: int = 8, shift: float = 0.0) -> list[dict]:
    """7 lrs: the baseline's loss rises 0.03 (i - 3)^2 away from its optimum, the arm is flat at the baseline's
    optimum (+shift); a seed effect (sd 0.1) shared, each run's own luck sd 0.024."""
    seed_effect = rng.normal(0, 0.1, seeds)
    out = []
    for i, lr in enumerate(LR7):
        for s in range(seeds):
            out.append(run("layernorm", lr, s, 2.0 + seed_effect[s] + 0.03 * (i - 3) ** 2 + rng.normal(0, 0.024)))
            out.append(run("flatnorm", lr, s, 2.0 + shift + seed_effect[s] + rng.normal(0, 0.024)))
    return out


def test_selection_aware_keeps_a_flat_arm_equal_at_the_optimum_from_better():
    """The tuned lr rewards the flat arm's luck: sweep 2 of this generator is a false better; selection-aware is
    not, and a flat arm truly 0.1 better is still found."""
    runs = flat_against_steep(np.random.default_rng(2))
    (tuned,) = compare(runs, "norm", "layernorm")["comparisons"]
    assert tuned["verdict"] == "better" and tuned["exploratory"]
    (aware,) = compare(runs, "norm", "layernorm", lr_choice="selection-aware")["comparisons"]
    assert aware["verdict"] == "inconclusive" and aware["ci_low"] < 0 < aware["ci_high"]
    assert aware["lr_choice"]["how"] == "selection-aware" and aware["selection"]["cells"] == 49
    assert aware["ci_method"] == "selection-aware over 7 x 7 lrs" and not aware["exploratory"]
    (real,) = compare(flat_against_steep(np.random.default_rng(3), shift=-0.1), "norm", "layernorm",
                      lr_choice="selection-aware")["comparisons"]
    assert real["verdict"] == "better" and real["ci_high"] < 0


def test_selection_aware_false_better_rate_on_planted_sweeps():
    """Monte Carlo (fixed seed, 300 sweeps of the cells directly): the flat arm equal at the optimum is called
    better at most alpha by the selection-aware test, where the best lr on each side read as planned is not; worse
    by exactly the margin, it is called equivalent at most alpha."""
    from minillm.analysis.selection import grid_test

    rng = np.random.default_rng(0)
    curve = 0.03 * (np.arange(7) - 3.0) ** 2
    aware = naive = equivalent = 0
    n = 300
    for _ in range(n):
        luck = rng.normal(0, 0.024, size=(2, 7, 8))  # arm / baseline, lr, seed (the seed effect cancels in pairs)
        d = luck[0][:, None, :] - (curve[:, None] + luck[1])[None, :, :]  # arm lr x baseline lr x seed
        mean, se = d.mean(axis=2), d.std(axis=2, ddof=1) / math.sqrt(8)
        cells = {(a, b): (mean[a, b], se[a, b], 7.0) for a in range(7) for b in range(7)}
        aware += grid_test(cells, range(7), range(7), 0.02, 0.05)["p_better"] <= 0.025
        at_margin = {ab: (v + 0.02, e, f) for ab, (v, e, f) in cells.items()}  # the flat arm worse by the margin
        equivalent += grid_test(at_margin, range(7), range(7), 0.02, 0.05)["p_equivalent"] <= 0.05
        a, b = int(luck[0].mean(axis=1).argmin()), int((curve + luck[1].mean(axis=1)).argmin())
        naive += stats.t.cdf(mean[a, b] / se[a, b], 7) <= 0.025
    assert aware / n <= 0.05 < naive / n and equivalent / n <= 0.05


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lr": "common"}, "--lr: common cannot be combined with --lr-choice selection-aware; allowed: tuned"),
    ({"interval": "bootstrap"}, "--interval: bootstrap cannot be combined"),
    ({"window_error": True}, "--window-error: true cannot be combined"),
])
def test_selection_aware_refuses_rules_it_cannot_test(planted, kwargs, message):
    with pytest.raises(CompareError, match=message):
        compare(find_runs(planted), "norm", "layernorm", lr_choice="selection-aware", **kwargs)
