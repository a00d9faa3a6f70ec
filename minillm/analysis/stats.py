"""The statistics of a comparison, on plain numbers (no runs, no files): intervals, tests, the verdict rule.

Every distribution comes from scipy.stats. A difference is always ``arm - baseline`` in the metric's units.

    paired_t(arm, baseline, alpha)     t interval and p of the mean paired difference (scipy.stats.ttest_rel)
    welch_t(arm, baseline, alpha)      Welch's t interval and p of the difference of means (ttest_ind, equal_var=False)
    bootstrap(arm, baseline, alpha, paired)  BCa bootstrap interval of the same difference (seeded: reproducible)
    exact_ci(k, n, alpha)              Clopper-Pearson interval of a failure rate (binomtest(...).proportion_ci)
    fisher_p(k_arm, n_arm, k_base, n_base, alternative)   Fisher's exact test of two failure counts (two-sided,
                                       or one-sided when a pre-registered rule says which arm fails more)
    sign_test(arm, baseline)           the sign test of paired differences (binomtest, p = 1/2)
    holm(pvalues)                      Holm's step-down adjustment of a family of p-values
    verdict(low, high, margin, higher_is_better)   the verdict vocabulary (VERDICTS)
    seeds_needed(diff, sd, margin, alpha)          pairs a paired t interval would need to decide (at the observed
                                       mean and spread: the rules registered before 2026-11-28)
    tost_p(diff, se, df, margin)       the equivalence test: two one-sided t tests against -margin and +margin
    step_down(pairs)                   adjusted p-values of (difference, equivalence) test pairs, family-wise
    decide(diff, p_diff, p_equivalent, alpha, higher_is_better)   the verdict word from (adjusted) p-values
    seeds_to_plan(diff, sd, n, margin, alpha, power, tests)       pairs a new sweep needs to decide with a
                                       stated power, the spread taken at its upper confidence bound
    against_threshold(values, threshold, direction, alpha)   a seed mean against a fixed threshold: its t
                                       interval and the one-sided p of "the rule's side of the threshold"
    window_se(arm_windows, baseline_windows, paired)  the validation sampling error of a difference of mean losses
    with_window_error(arm, baseline, paired, se_window, n_windows, alpha)  a t interval of the difference that
                                       adds that error (in quadrature, on the smaller degrees of freedom)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import stats

VERDICTS = {
    "equivalent": "the whole interval lies inside (-margin, +margin): any difference is too small to matter",
    "better": "not equivalent, and the whole interval is on the better side of 0 (below 0 when lower is better)",
    "worse": "not equivalent, and the whole interval is on the worse side of 0",
    "inconclusive": "the interval crosses 0 and reaches beyond the margin (or there is no interval): more seeds, "
                    "or a larger margin, would be needed to decide",
}
BOOTSTRAP_MIN_N = 8  # a bootstrap interval is computed from this many differences (or runs per arm) on
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 0


def _interval(diff: float, sd: float, n: int, test: Callable[[], Any], alpha: float, method: str) -> dict:
    """The common fields of a t interval; a zero spread gives the point interval [diff, diff]."""
    if sd == 0.0:
        low = high = diff
        p = 1.0 if diff == 0.0 else 0.0
    else:
        result = test()
        ci = result.confidence_interval(confidence_level=1.0 - alpha)
        low, high, p = float(ci.low), float(ci.high), float(result.pvalue)
    return {"diff": diff, "ci_low": low, "ci_high": high, "p": p, "sd": sd, "n": n, "method": method}


def _empty(diff: float | None, sd: float | None, n: int, method: str) -> dict:
    return {"diff": diff, "ci_low": None, "ci_high": None, "p": None, "sd": sd, "n": n, "method": method}


def paired_t(arm: Sequence[float], baseline: Sequence[float], alpha: float = 0.05) -> dict:
    """The mean of the paired differences arm[i] - baseline[i], its (1 - alpha) t interval and the two-sided p of
    "the mean difference is 0" (scipy.stats.ttest_rel). Returns {diff, ci_low, ci_high, p, sd (of the
    differences), n, method}; with fewer than 2 pairs the interval and p are None."""
    a, b = np.asarray(arm, dtype=float), np.asarray(baseline, dtype=float)
    d = a - b
    n = len(d)
    if n < 2:
        return _empty(float(d.mean()) if n else None, None, n, "paired t")
    sd = float(d.std(ddof=1))
    return _interval(float(d.mean()), sd, n, lambda: stats.ttest_rel(a, b), alpha, "paired t")


def welch_t(arm: Sequence[float], baseline: Sequence[float], alpha: float = 0.05) -> dict:
    """mean(arm) - mean(baseline), Welch's (1 - alpha) t interval (unequal variances) and its two-sided p
    (scipy.stats.ttest_ind, equal_var=False). ``sd`` is sqrt(var(arm) + var(baseline)): the spread of the
    difference of one arm run and one baseline run. Fewer than 2 runs in either arm: no interval."""
    a, b = np.asarray(arm, dtype=float), np.asarray(baseline, dtype=float)
    n = min(len(a), len(b))
    if n < 2:
        diff = float(a.mean() - b.mean()) if len(a) and len(b) else None
        return _empty(diff, None, n, "Welch t")
    sd = math.sqrt(float(a.var(ddof=1) + b.var(ddof=1)))
    return _interval(float(a.mean() - b.mean()), sd, n, lambda: stats.ttest_ind(a, b, equal_var=False),
                     alpha, "Welch t")


def bootstrap(arm: Sequence[float], baseline: Sequence[float], alpha: float = 0.05,
              paired: bool = True) -> tuple[float, float] | None:
    """The BCa bootstrap (1 - alpha) interval of the mean paired difference (paired) or of the difference of
    means (two independent samples), BOOTSTRAP_RESAMPLES resamples from a fixed seed, so the same numbers give
    the same interval. None below BOOTSTRAP_MIN_N differences (or runs in either arm)."""
    a, b = np.asarray(arm, dtype=float), np.asarray(baseline, dtype=float)
    if min(len(a), len(b)) < BOOTSTRAP_MIN_N:
        return None
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    if paired:
        d = a - b
        if np.ptp(d) == 0.0:
            return float(d[0]), float(d[0])
        res = stats.bootstrap((d,), np.mean, confidence_level=1.0 - alpha, n_resamples=BOOTSTRAP_RESAMPLES,
                              method="BCa", rng=rng)
    else:
        if np.ptp(a) == 0.0 and np.ptp(b) == 0.0:
            return float(a[0] - b[0]), float(a[0] - b[0])

        def diff_of_means(x, y, axis=-1):
            return np.mean(x, axis=axis) - np.mean(y, axis=axis)

        res = stats.bootstrap((a, b), diff_of_means, confidence_level=1.0 - alpha, n_resamples=BOOTSTRAP_RESAMPLES,
                              method="BCa", rng=rng)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@functools.lru_cache(maxsize=4096)
def exact_ci(k: int, n: int, alpha: float = 0.05) -> tuple[float, float] | None:
    """Clopper-Pearson (exact) (1 - alpha) interval of a rate of k events in n runs; None when n = 0."""
    if n == 0:
        return None
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1.0 - alpha, method="exact")
    return float(ci.low), float(ci.high)


FISHER_ALTERNATIVES = ("two-sided", "greater", "less")


@functools.lru_cache(maxsize=4096)
def fisher_p(k_arm: int, n_arm: int, k_baseline: int, n_baseline: int, alternative: str = "two-sided") -> float | None:
    """p of Fisher's exact test of the 2x2 table [[k_arm, n_arm - k_arm], [k_base, n_base - k_base]]; None when an
    arm has no runs. ``alternative``: two-sided (the default, what a comparison reports), or greater / less: the
    one-sided p of "the arm has events more / less often than the baseline" (for greater, the hypergeometric
    probability of k_arm or more of the k_arm + k_base events falling on the arm), for a rule that fixed the
    direction before the runs."""
    if alternative not in FISHER_ALTERNATIVES:
        raise ValueError(f"alternative {alternative!r}; allowed: {', '.join(FISHER_ALTERNATIVES)}")
    if n_arm == 0 or n_baseline == 0:
        return None
    table = [[k_arm, n_arm - k_arm], [k_baseline, n_baseline - k_baseline]]
    return float(stats.fisher_exact(table, alternative=alternative).pvalue)


def sign_test(arm: Sequence[float], baseline: Sequence[float]) -> dict:
    """The sign test of the paired differences arm[i] - baseline[i]: {lower (pairs with arm < baseline), higher,
    ties (left out), p: two-sided binomtest of lower of lower + higher at 1/2 (None without an untied pair)}."""
    d = np.asarray(arm, dtype=float) - np.asarray(baseline, dtype=float)
    lower, higher = int((d < 0).sum()), int((d > 0).sum())
    p = float(stats.binomtest(lower, lower + higher).pvalue) if lower + higher else None
    return {"lower": lower, "higher": higher, "ties": len(d) - lower - higher, "p": p}


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment: with the m non-missing p-values sorted, p_(i) becomes
    max over j <= i of min(1, (m - j + 1) p_(j)); it controls the family-wise error rate at alpha. None stays None,
    outside the family."""
    present = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[float | None] = [None] * len(pvalues)
    running, m = 0.0, len(present)
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def verdict(low: float | None, high: float | None, margin: float, higher_is_better: bool = False) -> str:
    """``equivalent`` when -margin < low and high < margin; else ``better`` / ``worse`` when the interval lies
    wholly on one side of 0 (below 0 is better when lower is better); else ``inconclusive`` (also without an
    interval). VERDICTS says what each word means."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "inconclusive"
    if -margin < low and high < margin:
        return "equivalent"
    if high < 0 or low > 0:
        return "better" if (high < 0) != higher_is_better else "worse"
    return "inconclusive"


def significant(low: float | None, high: float | None) -> bool:
    """The interval excludes 0."""
    return low is not None and high is not None and (high < 0 or low > 0)


def seeds_needed(diff: float | None, sd: float | None, margin: float, alpha: float = 0.05,
                 max_n: int = 100_000) -> int | None:
    """The smallest number of pairs n >= 2 for which a paired t interval, with the observed mean difference
    ``diff`` and standard deviation ``sd`` of the differences, would decide: its half-width
    h(n) = t(1 - alpha/2, n - 1) * sd / sqrt(n) satisfies |diff| > h(n) (the interval excludes 0: better or
    worse) or |diff| + h(n) < margin (it fits inside the margin: equivalent). A planning number, not a promise:
    the next seeds will not show exactly the observed mean and spread. None without a spread (fewer than 2
    differences) or beyond max_n."""
    if diff is None or sd is None or not math.isfinite(sd):
        return None
    n = np.arange(2, max_n + 1)
    half = stats.t.ppf(1.0 - alpha / 2.0, n - 1) * sd / np.sqrt(n)
    decided = (abs(diff) > half) | (abs(diff) + half < margin)
    return int(n[np.argmax(decided)]) if decided.any() else None


DIRECTIONS = ("at least", "at most")


def against_threshold(values: Sequence[float], threshold: float, direction: str = "at least",
                      alpha: float = 0.05) -> dict:
    """A mean over seeds against a fixed threshold (a rule "the mean is at least / at most T"): {mean, ci_low,
    ci_high (the (1 - alpha) t interval of the mean), p (one-sided: of "the mean lies on the rule's side of T";
    small when the interval clears T), holds_on_mean, n}. With fewer than 2 values the interval and p are None.
    The interval is paired_t's of the values against T, shifted back by T."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}; allowed: {', '.join(DIRECTIONS)}")
    vals = [float(v) for v in values]
    n = len(vals)
    mean = float(np.mean(vals)) if n else None
    holds = None if mean is None else (mean >= threshold if direction == "at least" else mean <= threshold)
    t = paired_t(vals, [threshold] * n, alpha)
    if t["p"] is None:
        return {"mean": mean, "ci_low": None, "ci_high": None, "p": None, "holds_on_mean": holds, "n": n}
    toward = (t["diff"] > 0) == (direction == "at least") and t["diff"] != 0
    p = t["p"] / 2 if toward else 1.0 - t["p"] / 2
    return {"mean": mean, "ci_low": t["ci_low"] + threshold, "ci_high": t["ci_high"] + threshold, "p": p,
            "holds_on_mean": holds, "n": n}


def window_se(arm_windows: Sequence[Sequence[float]], baseline_windows: Sequence[Sequence[float]],
              paired: bool) -> tuple[float, int]:
    """The standard error that the sampling of the evaluation windows adds to mean(arm) - mean(baseline), and the
    number of windows it rests on. Each argument holds one array per run: the mean loss of each evaluated window
    (a run's loss is the mean of its array). A run's loss is a mean over W windows drawn from the text, so it
    carries the error of that draw; the seeds' interval does not see it, since every run is scored on the same
    windows. ``paired`` (both arms scored on the same windows, in the same order): the per-window difference of
    the arms' seed-mean losses, d_w, varies from window to window far less than the losses do (a hard window is
    hard for both), and the error is sd(d_w) / sqrt(W). Unpaired (different windows): the arms' own window
    variances add, sqrt(var(a_w) / W_a + var(b_w) / W_b), a_w and b_w the seed-mean loss of window w."""
    a = np.asarray([np.asarray(w, dtype=float) for w in arm_windows]).mean(axis=0)
    b = np.asarray([np.asarray(w, dtype=float) for w in baseline_windows]).mean(axis=0)
    if paired:
        if a.shape != b.shape:
            raise ValueError(f"paired windows need arrays of one length ({len(a)} vs {len(b)})")
        d = a - b
        return float(d.std(ddof=1) / math.sqrt(len(d))), len(d)
    se = math.sqrt(float(a.var(ddof=1)) / len(a) + float(b.var(ddof=1)) / len(b))
    return se, min(len(a), len(b))


def with_window_error(arm: Sequence[float], baseline: Sequence[float], paired: bool, se_window: float,
                      n_windows: int, alpha: float = 0.05) -> dict:
    """The t interval of the difference (paired: the mean paired difference; else the difference of means) whose
    standard error adds the window error in quadrature, sqrt(se_seeds^2 + se_window^2), on the smaller degrees of
    freedom of the two parts (the seeds': n - 1, or Welch's; Welch-Satterthwaite would give more, and a tiny window
    error would then narrow the interval). Returns {diff, ci_low, ci_high, p, se_seeds, se_window, df, method};
    None ends with fewer than 2 runs (pairs)."""
    a, b = np.asarray(arm, dtype=float), np.asarray(baseline, dtype=float)
    if paired:
        d = a - b
        n = len(d)
        if n < 2:
            return {"diff": float(d.mean()) if n else None, "ci_low": None, "ci_high": None, "p": None,
                    "se_seeds": None, "se_window": se_window, "df": None, "method": "paired t + windows"}
        diff, se_s, df_s = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(n), n - 1.0
    else:
        if min(len(a), len(b)) < 2:
            return {"diff": None, "ci_low": None, "ci_high": None, "p": None, "se_seeds": None,
                    "se_window": se_window, "df": None, "method": "Welch t + windows"}
        va, vb = float(a.var(ddof=1)) / len(a), float(b.var(ddof=1)) / len(b)
        diff, se_s = float(a.mean() - b.mean()), math.sqrt(va + vb)
        df_s = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if va + vb > 0 else math.inf
    se = math.sqrt(se_s ** 2 + se_window ** 2)
    method = ("paired t" if paired else "Welch t") + " + windows"
    if se == 0.0:
        return {"diff": diff, "ci_low": diff, "ci_high": diff, "p": 1.0 if diff == 0.0 else 0.0, "se_seeds": se_s,
                "se_window": se_window, "df": None, "method": method}
    df = min(d for s, d in ((se_s, df_s), (se_window, n_windows - 1.0)) if s > 0)
    half = float(stats.t.ppf(1.0 - alpha / 2.0, df)) * se
    p = float(2.0 * stats.t.sf(abs(diff) / se, df))
    return {"diff": diff, "ci_low": diff - half, "ci_high": diff + half, "p": p, "se_seeds": se_s,
            "se_window": se_window, "df": df, "method": method}


# --- decisions with a controlled error rate -------------------------------------------------------------------------


def standard_error(arm: Sequence[float], baseline: Sequence[float], paired: bool) -> tuple[float, float] | None:
    """(standard error, degrees of freedom) of paired_t's (paired) or welch_t's difference; None below 2 values."""
    a, b = np.asarray(arm, dtype=float), np.asarray(baseline, dtype=float)
    if paired:
        return (float((a - b).std(ddof=1)) / math.sqrt(len(a)), len(a) - 1.0) if len(a) >= 2 else None
    if min(len(a), len(b)) < 2:
        return None
    va, vb = float(a.var(ddof=1)) / len(a), float(b.var(ddof=1)) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if va + vb > 0 else math.inf
    return math.sqrt(va + vb), df


def tost_p(diff: float | None, se: float | None, df: float | None, margin: float) -> float | None:
    """p of the equivalence test (two one-sided t tests, Schuirmann 1987): the larger of the p of "delta <= -margin"
    and of "delta >= +margin", each one-sided with ``df`` degrees of freedom. Equivalence at level alpha is
    p <= alpha, the same as the (1 - 2 alpha) interval lying inside (-margin, +margin). A zero standard error
    gives 0 or 1; None without an interval."""
    if diff is None or se is None or df is None or not math.isfinite(diff):
        return None
    if se == 0.0:
        return 0.0 if abs(diff) < margin else 1.0
    below = float(stats.t.sf((diff + margin) / se, df))  # of H0: delta <= -margin
    above = float(stats.t.cdf((diff - margin) / se, df))  # of H0: delta >= +margin
    return max(below, above)


def step_down(pairs: Sequence[tuple[float | None, float | None]]) -> list[tuple[float | None, float | None]]:
    """Adjusted p-values of a family of comparisons, each a pair (p of "no difference", p of "not equivalent").

    The two nulls of one comparison exclude each other (delta = 0 and |delta| >= margin cannot both hold), so at
    most one per comparison is true. Shaffer's (1986) step-down: the 2m p-values sorted; the i-th is multiplied by
    t_i, the most nulls that can still be true when the i - 1 before it are false, i.e. the number of comparisons
    with a test not yet passed; adjusted p_(i) = max over j <= i of min(1, t_j p_(j)). A word read from adjusted
    p <= alpha keeps the chance of any false better / worse / equivalent in the family at most alpha, whatever
    the dependence between the tests. One comparison: the p-values unchanged. None stays None (no test)."""
    items = sorted((p, i, j) for i, pair in enumerate(pairs) for j, p in enumerate(pair) if p is not None)
    left = [sum(p is not None for p in pair) for pair in pairs]  # each comparison's tests not yet passed
    out: list[list[float | None]] = [[None, None] for _ in pairs]
    running = 0.0
    for p, i, j in items:
        t = sum(n > 0 for n in left)
        running = max(running, min(1.0, t * p))
        out[i][j] = running
        left[i] -= 1
    return [(a, b) for a, b in out]


def decide(diff: float | None, p_difference: float | None, p_equivalent: float | None, alpha: float,
           higher_is_better: bool = False) -> str:
    """The verdict word from (adjusted) p-values: ``equivalent`` when the equivalence test passes at alpha, else
    ``better`` / ``worse`` (by the sign of diff) when the test of no difference rejects at alpha, else
    ``inconclusive``. VERDICT_RULES says what each word promises."""
    if p_equivalent is not None and p_equivalent <= alpha:
        return "equivalent"
    if p_difference is not None and p_difference <= alpha and diff is not None and diff != 0.0:
        return "better" if (diff < 0) != higher_is_better else "worse"
    return "inconclusive"


VERDICT_RULES = {
    "equivalent": "the equivalence test (two one-sided t tests against the margin) passes at alpha after the "
                  "family-wise adjustment: the (1 - 2 alpha) interval lies inside (-margin, +margin) with room for "
                  "the other comparisons of the report",
    "better": "not equivalent, and the test of no difference rejects at alpha after the adjustment, on the better "
              "side (below 0 when lower is better)",
    "worse": "not equivalent, and the test of no difference rejects at alpha after the adjustment, on the worse side",
    "inconclusive": "neither: more seeds (seeds needed), or a larger margin, would be needed to decide",
}
PLAN_POWER = 0.8  # seeds_to_plan's default: the chance that a new sweep of that size decides
PLAN_SD_CONFIDENCE = 0.8  # the spread a plan assumes: the upper 80% confidence bound of the observed sd


def seeds_to_plan(diff: float | None, sd: float | None, n: int, margin: float, alpha: float = 0.05,
                  power: float = PLAN_POWER, tests: int = 1, sd_confidence: float = PLAN_SD_CONFIDENCE,
                  max_n: int = 10_000) -> int | None:
    """The smallest number of pairs N for which a new sweep decides with probability >= ``power``, if the true
    difference is the observed ``diff`` and the spread of the differences is the upper ``sd_confidence``
    confidence bound of the observed ``sd`` (from n differences: sd * sqrt((n - 1) / chi2_(1 - conf)(n - 1)): a
    plan on the observed spread itself is met about half the time). "Decides": the two-sided t test rejects at
    alpha / tests (``tests``: the report's comparisons, Bonferroni, a conservative stand-in for the step-down),
    or the equivalence test passes at that level; the larger of the two powers (noncentral t; the equivalence
    power by the usual bound P1 + P2 - 1). A planning number, not a promise. None without a spread (n < 2) or
    beyond max_n."""
    if diff is None or sd is None or n < 2 or not (math.isfinite(sd) and math.isfinite(diff)):
        return None
    if sd == 0.0:
        return 2
    sd_plan = sd * math.sqrt((n - 1) / stats.chi2.ppf(1.0 - sd_confidence, n - 1))
    level = alpha / max(tests, 1)

    def decides(big_n: np.ndarray) -> np.ndarray:
        df, se = big_n - 1.0, sd_plan / np.sqrt(big_n)
        crit = stats.t.ppf(1.0 - level / 2.0, df)
        p_difference = stats.nct.sf(crit, df, diff / se) + stats.nct.cdf(-crit, df, diff / se)
        one_sided = stats.t.ppf(1.0 - level, df)
        p_equivalent = np.clip(stats.nct.sf(one_sided, df, (diff + margin) / se)
                               + stats.nct.cdf(-one_sided, df, (diff - margin) / se) - 1.0, 0.0, 1.0)
        return np.maximum(p_difference, p_equivalent) >= power

    # the power grows with N: look on a doubling grid, then at every N below the first that decides
    coarse = np.unique(np.minimum(2 ** np.arange(1, 15), max_n)).astype(float)
    hits = decides(coarse)
    if not hits.any():
        return None
    first = int(np.argmax(hits))
    low = 2.0 if first == 0 else coarse[first - 1] + 1
    fine = np.arange(low, coarse[first] + 1)
    return int(fine[np.argmax(decides(fine))])

