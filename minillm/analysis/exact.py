"""Tests that hold at any spread, for the rules of version 3 (plain numbers in, no runs): what a comparison uses
where a t test would read a spread that is not there, or counts that are not normal.

    degenerate(sd, values)             the spread is below DEGENERATE_REL of the values' size: no evidence either way
    sign_tests(diffs, margin)          the sign test of "median difference 0" and its equivalence pair (two one-sided
                                       sign tests against -margin and +margin): exact for discrete per-seed measures
    stratified_exact_p(tables)         the exact conditional test of "no difference in failure rate" over strata (one
                                       2x2 table per seed): the exact form of the Cochran-Mantel-Haenszel test
    failure_test(k_arm, n_arm, k_base, n_base)   Boschloo's exact test of two failure counts (more powerful than
                                       Fisher's at the same size)
    share_better(arm, baseline, paired, higher_is_better)   the share of seed pairs in which the arm is better
    probability_of_improvement(arm, baseline, higher_is_better, alpha)   P(an arm run beats a baseline run) over all
                                       run pairs, ties half (rliable's), with a percentile bootstrap interval
    pairs_for_margin(sd, n, margin, alpha, power, tests)   pairs a new sweep needs to decide at the fixed margin
    seeds_for_failures(rate_arm, rate_base, alpha, power, tests)   runs per arm that show two failure rates differ
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

# A spread at or below this fraction of the values' size (at least 1) is rounding, not variation: 1e-9 nats on losses
# near 2 is six orders below the smallest real seed-to-seed spread minillm has measured (~1e-3), and far above the
# ~1e-16 that float arithmetic leaves on differences of equal numbers.
DEGENERATE_REL = 1e-9
PROB_RESAMPLES = 2000
PROB_SEED = 0


def degenerate(sd: float | None, values: Sequence[float]) -> bool:
    """Whether the spread ``sd`` is below DEGENERATE_REL * max(1, the largest |value|): the differences do not vary."""
    if sd is None or not math.isfinite(sd):
        return False
    scale = max([1.0, *(abs(float(v)) for v in values if math.isfinite(float(v)))])
    return sd <= DEGENERATE_REL * scale


def _at_least(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2)."""
    return float(stats.binom.sf(k - 1, n, 0.5)) if n else 1.0


def sign_tests(diffs: Sequence[float], margin: float) -> dict:
    """{p, p_equivalent, lower, higher, ties} of paired differences. p: the two-sided sign test of "the median
    difference is 0" (binomtest of the pairs below 0 among the untied ones; None when every pair is tied: nothing to
    test). p_equivalent: the larger of the one-sided sign tests of "median >= +margin" (the pairs below +margin among
    all) and "median <= -margin" (the pairs above -margin); a difference of exactly ±margin counts against
    equivalence. Exact at any spread: n pairs that all agree give 2 / 2^n and 1 / 2^n, never 0."""
    d = np.asarray(diffs, dtype=float)
    lower, higher = int((d < 0).sum()), int((d > 0).sum())
    p = float(stats.binomtest(lower, lower + higher).pvalue) if lower + higher else None
    n = len(d)
    p_eq = max(_at_least(int((d < margin).sum()), n), _at_least(int((d > -margin).sum()), n)) if n else None
    return {"p": p, "p_equivalent": p_eq, "lower": lower, "higher": higher, "ties": n - lower - higher}


def stratified_exact_p(tables: Sequence[tuple[int, int, int, int]]) -> float | None:
    """Two-sided p of the exact conditional test that the arm and the baseline fail at the same rate within every
    stratum: one table (k_arm, n_arm, k_base, n_base) per stratum (a seed's lrs); given each stratum's margins, the
    arm's failures are hypergeometric, their sum over strata the convolution, and p the probability of a sum as
    unlikely as the observed one or less (the exact form of the Cochran-Mantel-Haenszel test). Strata whose runs
    all failed or all trained say nothing and are left out; None when none is left."""
    dist, observed = np.ones(1), 0
    for k_a, n_a, k_b, n_b in tables:
        total = k_a + k_b
        if total == 0 or total == n_a + n_b:
            continue
        support = np.arange(max(0, total - n_b), min(total, n_a) + 1)
        pmf = np.zeros(support[-1] + 1)
        pmf[support] = stats.hypergeom.pmf(support, n_a + n_b, n_a, total)
        dist, observed = np.convolve(dist, pmf), observed + k_a
    if len(dist) == 1:
        return None
    return float(min(1.0, dist[dist <= dist[observed] * (1 + 1e-7)].sum()))


@functools.lru_cache(maxsize=4096)
def failure_test(k_arm: int, n_arm: int, k_base: int, n_base: int) -> float | None:
    """Two-sided p of Boschloo's exact test of the table [[k_arm, n_arm - k_arm], [k_base, n_base - k_base]]
    (scipy.stats.boschloo_exact: Fisher's p as the statistic, maximized over the common rate; exact, and more
    powerful than Fisher's). None when nothing can differ: an arm without runs, or no failure (or only failures) in
    both."""
    if n_arm == 0 or n_base == 0 or k_arm + k_base in (0, n_arm + n_base):
        return None
    table = [[k_arm, n_arm - k_arm], [k_base, n_base - k_base]]
    return float(min(1.0, stats.boschloo_exact(table, alternative="two-sided").pvalue))


def share_better(arm: Sequence[float], baseline: Sequence[float], paired: bool, higher_is_better: bool) -> \
        float | None:
    """The share of seed pairs (unpaired: of all arm x baseline run pairs) in which the arm is better, ties half."""
    a, b = np.asarray(arm, dtype=float), np.asarray(baseline, dtype=float)
    if not len(a) or not len(b):
        return None
    d = a - b if paired else (a[:, None] - b[None, :]).ravel()
    return float((d > 0 if higher_is_better else d < 0).mean() + 0.5 * (d == 0).mean())


def _all_pairs(a: np.ndarray, b: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """P(X better than Y) over the last two axes' pairs, ties half; a and b may carry leading resample axes."""
    d = a[..., :, None] - b[..., None, :]
    return ((d > 0) if higher_is_better else (d < 0)).mean(axis=(-2, -1)) + 0.5 * (d == 0).mean(axis=(-2, -1))


def probability_of_improvement(arm: Sequence[float], baseline: Sequence[float], higher_is_better: bool = False,
                               alpha: float = 0.05) -> dict | None:
    """rliable's probability of improvement (Agarwal et al. 2021): P(X better than Y) over every pair of an arm run X
    and a baseline run Y, ties counting half (the Mann-Whitney U over n_arm * n_base), with the percentile
    bootstrap (1 - alpha) interval from resampling each arm's runs (PROB_RESAMPLES resamples, a fixed seed).
    {value, ci_low, ci_high, method}; None without runs in either arm."""
    a, b = np.asarray(arm, dtype=float), np.asarray(baseline, dtype=float)
    if not len(a) or not len(b):
        return None
    rng = np.random.default_rng(PROB_SEED)
    boot = _all_pairs(a[rng.integers(0, len(a), (PROB_RESAMPLES, len(a)))],
                      b[rng.integers(0, len(b), (PROB_RESAMPLES, len(b)))], higher_is_better)
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return {"value": float(_all_pairs(a, b, higher_is_better)), "ci_low": float(low), "ci_high": float(high),
            "method": "all run pairs, ties half; percentile bootstrap"}


def sd_upper(sd: float, n: int, confidence: float = 0.8) -> float:
    """The upper ``confidence`` bound of a spread ``sd`` observed on n differences (chi-square, n - 1 df)."""
    return sd * math.sqrt((n - 1) / stats.chi2.ppf(1.0 - confidence, n - 1))


def pairs_for_margin(sd: float | None, n: int, margin: float, alpha: float = 0.05, power: float = 0.8,
                     tests: int = 1, sd_confidence: float = 0.8, min_n: int = 3, max_n: int = 10_000) -> int | None:
    """The smallest number of pairs N with which a new sweep decides at the fixed margin with probability >= power
    both ways: the equivalence test passes if the true difference is 0, and the test of no difference rejects if it
    is ±margin, each at alpha / tests (Bonferroni for the report's family). The spread is the upper ``sd_confidence``
    bound of the observed ``sd`` of n differences, and the observed difference is not used (it is the one the
    sweep could not decide, and biased when the lr was chosen on the same runs). At least ``min_n`` (fewer pairs
    never give an informative verdict); None without a spread."""
    if sd is None or n < 2 or not math.isfinite(sd):
        return None
    sd_plan = sd_upper(max(sd, 1e-300), n, sd_confidence)
    level = alpha / max(tests, 1)
    big_n = np.arange(min_n, max_n + 1, dtype=float)
    df, se = big_n - 1.0, sd_plan / np.sqrt(big_n)
    crit, one_sided = stats.t.ppf(1.0 - level / 2.0, df), stats.t.ppf(1.0 - level, df)
    differs = stats.nct.sf(crit, df, margin / se) + stats.nct.cdf(-crit, df, margin / se)
    equivalent = 2.0 * stats.nct.sf(one_sided, df, margin / se) - 1.0  # at 0: P1 + P2 - 1, both tails alike
    ok = (differs >= power) & (equivalent >= power)
    return int(big_n[np.argmax(ok)]) if ok.any() else None


def seeds_for_failures(rate_arm: float, rate_base: float, alpha: float = 0.05, power: float = 0.8,
                       tests: int = 1) -> int | None:
    """Runs per arm with which a two-sided test at alpha / tests tells two failure rates apart with the given
    power, if they are the observed ones (the arcsine approximation: N = ((z_(1 - level/2) + z_power) / h)^2, h
    Cohen's 2 asin sqrt(p1) - 2 asin sqrt(p2)). A planning number; None when the rates are equal."""
    h = abs(2 * math.asin(math.sqrt(rate_arm)) - 2 * math.asin(math.sqrt(rate_base)))
    if h == 0.0:
        return None
    level = alpha / max(tests, 1)
    z = stats.norm.ppf(1 - level / 2) + stats.norm.ppf(power)
    return max(2, math.ceil((z / h) ** 2))
