"""A word about an lr chosen on the runs it judges (rules version 3): exploratory, or tested with the choice in it.

**Exploratory.** An lr tuned on the judged runs (``--lr-choice same``), on their validation loss (``validation``: the
validation windows are inside the held-out test split, and a run's own luck is in both losses) or on the other half
of the seeds (``crossfit``) favours an arm with a flat loss-vs-lr curve: such words are labelled ``exploratory`` in
verdicts.json and verdicts.md, and the report's promise (the chance of any false word at most alpha) does not cover
them. A comparison at a fixed lr (``--lr VALUE``, one lr per arm, an lr fixed by a plan) or under the
selection-aware test is not exploratory.

**Selection-aware** (``--lr-choice selection-aware``, with ``--lr tuned``): a claim about the true best lrs of the
whole grid. With the arm's lrs a_1..a_k, the baseline's b_1..b_m and mu the true mean loss of an (arm, lr):

- ``better`` (min_a mu(a) < min_b mu(b)) needs one arm lr that beats every baseline lr: for each a, the one-sided
  p of "a is not below b" is taken at its largest over the b (an intersection-union test: a beats them all), and the
  smallest over the a is multiplied by k (Bonferroni over the arm's lrs). p_better <= alpha / 2 is the claim.
- ``worse`` (min_a mu(a) > min_b mu(b)) is the same with the roles swapped: one baseline lr that every arm lr is
  above, Bonferroni over the baseline's m lrs.
- The two-sided p of no difference is 2 min(p_better, p_worse), stepped down with the report's other tests.
- ``equivalent`` (|min_a mu(a) - min_b mu(b)| < margin): both halves of TOST by the same construction, "some a is
  below every b + margin" (Bonferroni over k) and "some b is below every a + margin" (over m); p_equivalent is the
  larger of the two.
- The interval of min_a mu(a) - min_b mu(b) is the one these tests invert: its upper end min_a max_b u_ab (u_ab
  each cell's one-sided t bound at alpha / 2k: the column of the baseline's true best lr must hold for every a), its
  lower end max_b min_a l_ab (l_ab at alpha / 2m: the row of the arm's true best lr), so better or worse is said
  exactly when it excludes 0. The difference shown is min_a max_b of the observed differences (paired on every
  seed: the arm's best mean minus the baseline's). The lrs shown (each side's best mean) and the failure counts
  are those of the best lrs.

Each cell a x b is a comparison of the arm's runs at a with the baseline's at b as any other (paired by seed, failed
runs at ln V). It is conservative (Bonferroni, and intersection-union tests at the level of each); a zero spread in a
cell is no evidence (p 1). A cell without two values leaves nothing to beat it with: p 1, no interval.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

from minillm.analysis import exact, stats
from minillm.analysis.lr_choice import Choice
from minillm.analysis.runs import group_runs, label

SELECTION_AWARE = "selection-aware"
CHOSEN_ON_JUDGED = {"validation": "the lr was chosen on the validation loss of the judged runs (the validation "
                                  "windows are inside the test split, and a run's luck is in both)",
                    "same data": "the lr was chosen on the judged runs themselves",
                    "cross-fit": "the lr was chosen on the other half of the judged seeds"}


def exploratory(choice: Choice) -> dict:
    """verdicts.json's ``exploratory`` and ``exploratory_reason`` of a comparison whose lrs ``choice`` made."""
    reason = CHOSEN_ON_JUDGED.get(choice.how)
    return {"exploratory": reason is not None, "exploratory_reason": reason}


def _one_sided(diff: np.ndarray, se: np.ndarray, df: np.ndarray, c: float, below: bool) -> np.ndarray:
    """One-sided p of each cell: of H0 delta >= c (``below``: against delta < c) or of H0 delta <= c; a zero spread
    is no evidence (p 1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (diff - c) / se
    p = sps.t.cdf(z, df) if below else sps.t.sf(z, df)
    return np.where(se > 0, p, 1.0)


def grid_test(cells: Mapping[tuple[Any, Any], tuple[float, float, float] | None], arm_lrs: Sequence[Any],
              base_lrs: Sequence[Any], margin: float, alpha: float, higher_is_better: bool = False) -> dict:
    """The selection-aware tests (module docstring) from each cell's (difference arm - baseline, its standard
    error, degrees of freedom), or None for a cell without an interval."""
    arm_lrs, base_lrs = list(arm_lrs), list(base_lrs)
    k, m = len(arm_lrs), len(base_lrs)
    record = {"arm_lrs": arm_lrs, "baseline_lrs": base_lrs, "cells": k * m}
    if any(cells.get((a, b)) is None for a in arm_lrs for b in base_lrs):
        missing = [f"{label(a)} / {label(b)}" for a in arm_lrs for b in base_lrs if cells.get((a, b)) is None]
        return {**record, "p": 1.0, "p_equivalent": 1.0, "p_better": 1.0, "p_worse": 1.0, "diff": None,
                "ci_low": None, "ci_high": None, "missing": missing}
    diff, se, df = (np.array([[cells[(a, b)][i] for b in base_lrs] for a in arm_lrs], dtype=float)
                    for i in range(3))  # arm lr x baseline lr
    diff = -diff if higher_is_better else diff  # the tests below read lower as better

    def arm_row(p: np.ndarray) -> float:  # some arm lr against every baseline lr, Bonferroni over the k
        return float(min(1.0, k * p.max(axis=1).min()))

    def base_column(p: np.ndarray) -> float:  # some baseline lr against every arm lr, Bonferroni over the m
        return float(min(1.0, m * p.max(axis=0).min()))

    p_better = arm_row(_one_sided(diff, se, df, 0.0, below=True))
    p_worse = base_column(_one_sided(diff, se, df, 0.0, below=False))
    p_upper = arm_row(_one_sided(diff, se, df, margin, below=True))
    p_lower = base_column(_one_sided(diff, se, df, -margin, below=False))

    def ends(level: float, side: int) -> np.ndarray:
        """Each cell's one-sided bound at ``level`` (side -1 lower, +1 upper); unbounded for a zero spread."""
        q = np.where(np.isfinite(df), sps.t.ppf(1 - level, np.where(np.isfinite(df), df, 1.0)),
                     sps.norm.ppf(1 - level))
        return np.where(se > 0, diff + side * q * se, side * math.inf)

    shown = float(diff.max(axis=1).min())
    low = float(ends(alpha / (2 * m), -1).min(axis=0).max())  # max_b min_a: as the worse test
    high = float(ends(alpha / (2 * k), +1).max(axis=1).min())  # min_a max_b: as the better test
    if higher_is_better:  # back from the lower-is-better scale the tests read
        shown, low, high = -shown, -high, -low
    return {**record, "p": min(1.0, 2 * min(p_better, p_worse)), "p_equivalent": max(p_upper, p_lower),
            "p_better": p_better, "p_worse": p_worse, "p_equivalent_upper": p_upper, "p_equivalent_lower": p_lower,
            "diff": shown, "ci_low": low, "ci_high": high}


def _no_spread(a_vals: Sequence[float], b_vals: Sequence[float], paired: bool) -> bool:
    """Whether a cell's values do not vary (exact.degenerate): the paired differences, or both arms' runs."""
    values = [*a_vals, *b_vals]
    if paired:
        return exact.degenerate(statistics.stdev([a - b for a, b in zip(a_vals, b_vals, strict=True)]), values)
    return all(exact.degenerate(statistics.stdev(v), values) for v in (a_vals, b_vals) if len(v) > 1)


def compare_grid(arm: Sequence[Mapping], base: Sequence[Mapping], headline: dict, rules: Any,
                 cell: Callable[[Sequence[Mapping], Sequence[Mapping]], dict]) -> dict:
    """``headline`` (compare_pair's fields at each side's best lr) with the selection-aware test over every lr of
    both grids; ``cell(arm runs, baseline runs)`` gives a cell's compared values (compare.compared_values: a_vals,
    b_vals, paired)."""
    a_lrs = {key[0]: rs for key, rs in group_runs(arm, ["lr"]).items()}
    b_lrs = {key[0]: rs for key, rs in group_runs(base, ["lr"]).items()}
    cells = {}
    for a, a_runs in a_lrs.items():
        for b, b_runs in b_lrs.items():
            values = cell(a_runs, b_runs)
            a_vals, b_vals, paired = values["a_vals"], values["b_vals"], values["paired"]
            error = stats.standard_error(a_vals, b_vals, paired) if a_vals and b_vals else None
            diff = statistics.fmean(a_vals) - statistics.fmean(b_vals) if error else None  # paired: the same
            if error and _no_spread(a_vals, b_vals, paired):
                error = (0.0, error[1])  # differences that do not vary are no evidence: the cell's p is 1
            cells[(a, b)] = (diff, *error) if error else None
    test = grid_test(cells, list(a_lrs), list(b_lrs), rules.margin, rules.alpha, rules.higher_is_better)
    warnings = list(headline["warnings"])
    if test.get("missing"):
        warnings.append(f"lr pairs (arm / baseline) with fewer than 2 values: {', '.join(test['missing'])}: the "
                        "selection-aware test cannot decide")
    shown = headline["diff"] if test["diff"] is None else test["diff"]
    return {**headline, "diff": shown, "ci_low": test["ci_low"], "ci_high": test["ci_high"],
            "ci_method": f"selection-aware over {len(a_lrs)} x {len(b_lrs)} lrs",
            "p": test["p"], "p_equivalent": test["p_equivalent"], "warnings": warnings,
            "selection": {k: v for k, v in test.items() if k not in ("diff", "ci_low", "ci_high")},
            "diff_at_best_lrs": headline["diff"]}
