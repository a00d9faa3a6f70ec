"""A sweep's runs -> a verdict for each value of one factor against a baseline value (pure: records in, dicts out).

    compare(runs, "norm", "layernorm")                 -> the verdicts.json dict (VERDICTS_FIELDS per comparison)
    compare(runs, rules=Rules(factor="norm", baseline="layernorm", margin=0.05))

``runs`` are summary.json dicts (or minillm.analysis.runs.Run objects). The rules (minillm.analysis.rules.Rules), in
order:

- **The runs.** A run is identified by its folder's real path, and a copy by the folder and start time its summary
  recorded: listed twice it counts once (``duplicates``). A run stopped by a signal and not resumed (status
  preempted) has no outcome yet and is left out; runs that have not ended are listed by the caller
  (``unfinished``) and flag every comparison.
- **The summaries** are checked against minillm.schema (required fields, types): another is CompareError.
- **Arms and strata.** The arms are the values of the factor other than the baseline; under rules version 3 a
  value's variants in settings tied to it (minillm.analysis.arms: PowerNorm with and without group scaling) are
  arms of their own. Every other setting that still varies within an arm splits the runs into strata
  (strata_keys: the summary's config keys and every key of its ``settings``; never seed, lr, or the labels name and
  tags), each comparing its arms with its own baseline.
- **The metric.** ``auto``: the held-out test loss where every compared run that trained has one, else the final
  val loss. A failed run (minillm.outcome: diverged, crashed, not trained, stalled at the unigram loss) enters a
  loss at ln V, the loss of a uniform guess (``failures`` penalize), so every seed pair stays and an arm that fails
  more is worse; ``drop`` compares the survivors only. A metric not in nats has no penalty: failures left out.
- **The learning rate** (minillm.analysis.lr_choice): tuned, common or given; chosen on the validation loss where the
  verdict reads the test loss, or cross-fitted across the halves of the seeds when asked; version 3 chooses it for
  each (arm, baseline) pair and labels a word from an lr chosen on the judged runs exploratory, or tests the whole
  grid with the choice in it (selection-aware: minillm.analysis.selection).
- **The difference** arm - baseline: paired by seed (auto when the two share a seed; version 3: at least 3 seeds
  holding most runs of each), the t interval of the paired
  differences, else Welch's; a BCa bootstrap interval from 8 differences; with ``window_error`` the sampling error
  of the evaluation windows added.
- **The words** (minillm.analysis.stats.decide): the test of no difference and the equivalence test (TOST at alpha),
both
  adjusted across every comparison of the call (step_down: the family-wise error of the words stays at alpha);
  ``adjust`` none for one planned comparison. An arm whose failure rate is significantly higher (Fisher) is never
  better or equivalent.
- **Warnings** that make a verdict not informative: fewer than 3 pairs, every run of both arms failed (drop: of
  either), and arms that ran on different CPU kernels, torch versions or git commits while their difference is
  below PROVENANCE_NOISE (or the metric is not in nats).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from minillm.analysis import arms, exact, family, lr_choice, lr_curves, selection, stats
from minillm.analysis.rules import Rules, failed, penalized, value_of
from minillm.analysis.runs import eval_windows, group_runs, hashable, label, records_of, sort_key, without_duplicates
from minillm.analysis.strata import (
    check_request,
    check_summaries,
    environment_warnings,
    resolve_metric,
    strata_keys,
)
from minillm.outcome import is_number

MIN_PAIRS = 3


def _by_seed(records: Sequence[Mapping], metric: str, rules: Rules) -> tuple[dict[Any, list[float]], set, list[Any]]:
    """seed -> the values of its compared runs, every seed present, seeds with more than one run."""
    usable: dict[Any, list[float]] = defaultdict(list)
    counts: dict[Any, int] = defaultdict(int)
    for r in records:
        counts[r.get("seed")] += 1
        if (v := value_of(r, metric, rules)) is not None:
            usable[r.get("seed")].append(v)
    return usable, set(counts), sorted((s for s, c in counts.items() if c > 1), key=sort_key)


def _window_interval(arm: Sequence[Mapping], base: Sequence[Mapping], metric: str, a_vals: Sequence[float],
                     b_vals: Sequence[float], paired: bool, rules: Rules) -> tuple[dict | None, str | None]:
    """with_window_error's interval from the compared runs' per-window losses, or (None, the warning why not)."""
    found = [[eval_windows(dict(r), metric) for r in rs if value_of(r, metric, rules) is not None and not failed(r)]
             for rs in (arm, base)]
    if any(w is None for ws in found for w in ws) or not all(found):
        return None, (f"no per-window losses of {metric} for some compared runs (LitLM's eval_windows): the "
                      "interval leaves out the sampling error of the evaluation windows")
    same = len({len(w) for ws in found for w in ws}) == 1
    se, n_windows = stats.window_se(*found, paired=same)
    return stats.with_window_error(a_vals, b_vals, paired, se, n_windows, rules.alpha), None


def compared_values(arm: Sequence[Mapping], base: Sequence[Mapping], metric: str, rules: Rules) -> dict:
    """The values a comparison reads: arm and baseline (seed means in seed order when paired), whether paired, the
    seeds paired and the warnings of the pairing."""
    warnings: list[str] = []
    a_seed, a_all, a_rep = _by_seed(arm, metric, rules)
    b_seed, b_all, b_rep = _by_seed(base, metric, rules)
    shared = (a_all & b_all) - {None}
    paired = rules.paired_by == "seed" or (rules.paired_by == "auto" and bool(shared))
    if paired and rules.paired_by == "auto" and rules.version >= 3 and (why := arms.unpaired_reason(arm, base)):
        paired = False
        warnings.append(why)
    for who, rep in (("arm", a_rep), ("baseline", b_rep)):
        if rep:
            warnings.append(f"seeds with several runs in the {who} ({', '.join(map(label, rep))}): their mean is used")
    missing = sum(value_of(r, metric, rules) is None and not failed(r) for r in [*arm, *base])
    if missing:
        warnings.append(f"{missing} run(s) that did not fail have no {metric}: left out")
    pairs_left_out = None
    if paired:
        seeds = sorted((s for s in shared if s in a_seed and s in b_seed), key=sort_key)
        pairs_left_out = len(shared) - len(seeds)
        alone = sorted((a_all ^ b_all) - {None}, key=sort_key)
        if alone:
            warnings.append(f"seeds without a partner in the other arm, left out: {', '.join(map(label, alone))}")
        a_vals = [statistics.fmean(a_seed[s]) for s in seeds]
        b_vals = [statistics.fmean(b_seed[s]) for s in seeds]
    else:
        seeds = []
        a_vals = [v for vs in a_seed.values() for v in vs]
        b_vals = [v for vs in b_seed.values() for v in vs]
    return {"a_vals": a_vals, "b_vals": b_vals, "paired": paired, "seeds": seeds, "warnings": warnings,
            "pairs_left_out": pairs_left_out, "a_all": a_all, "b_all": b_all}


def compare_pair(arm: Sequence[Mapping], base: Sequence[Mapping], metric: str, rules: Rules) -> dict:
    """The comparison of one arm's runs with the baseline's (each seed at its compared lr): the difference, its
    intervals and tests, failures and warnings (fields of verdicts.json, without arm, stratum, lrs and the words,
    which need the whole family)."""
    v = compared_values(arm, base, metric, rules)
    a_vals, b_vals, paired, seeds, warnings = v["a_vals"], v["b_vals"], v["paired"], v["seeds"], v["warnings"]
    a_all, b_all, pairs_left_out = v["a_all"], v["b_all"], v["pairs_left_out"]
    t = stats.paired_t(a_vals, b_vals, rules.alpha) if paired else stats.welch_t(a_vals, b_vals, rules.alpha)
    windowed, why = (_window_interval(arm, base, metric, a_vals, b_vals, paired, rules) if rules.window_error
                     else (None, None))
    warnings += [why] if why else []
    test = windowed if windowed is not None and windowed["ci_low"] is not None else t
    n = len(seeds) if paired else min(len(a_vals), len(b_vals))
    blocking = n < MIN_PAIRS
    if blocking:
        warnings.append(f"only {n} {'pairs' if paired else 'usable runs in an arm'} (fewer than {MIN_PAIRS}): the "
                        "verdict is not informative")
    fail_a, fail_b = sum(map(failed, arm)), sum(map(failed, base))
    everyone = [(who, k, rs) for who, k, rs in (("arm", fail_a, arm), ("baseline", fail_b, base)) if rs
                and k == len(rs)]
    if everyone and (len(everyone) == 2 or not penalized(metric, rules)):
        blocking = True
        for who, k, rs in everyone:
            warnings.append(f"every run of the {who} failed or stalled at the unigram loss ({k} of {len(rs)}; "
                            f"{sum(bool(r.get('diverged')) for r in rs)} diverged): nothing to compare")
    trained = _trained_pairs(arm, base, metric) if paired and penalized(metric, rules) else []
    degenerate = rules.version >= 3 and test is t and exact.degenerate(t["sd"], [*a_vals, *b_vals])
    if degenerate:  # a spread that is rounding, not variation: no test either way
        warnings.append(f"the differences do not vary (sd {t['sd']:.2g}, at most {exact.DEGENERATE_REL:g} of the "
                        "values): no evidence either way")
        test = {**t, "ci_low": None, "ci_high": None, "p": None}
    env, env_blocking = environment_warnings(arm, base, metric, t["diff"])
    warnings += env
    result = {
        "n_pairs": len(seeds) if paired else None, "paired_by": "seed" if paired else "none",
        "diff": t["diff"], "ci_low": test["ci_low"], "ci_high": test["ci_high"], "ci_method": test["method"],
        "p": test["p"], "p_equivalent": _tost(test, windowed, a_vals, b_vals, paired, rules.margin),
        "fail_arm": fail_a, "fail_baseline": fail_b, "n_arm": len(arm), "n_baseline": len(base),
        "fisher_p": stats.fisher_p(fail_a, len(arm), fail_b, len(base)),
        "warnings": warnings, "informative": not (blocking or env_blocking),
        "sd": t["sd"], "t_interval": [t["ci_low"], t["ci_high"]],
        "bootstrap_interval": _listed(stats.bootstrap(a_vals, b_vals, rules.alpha, paired=paired))
        if rules.interval == "bootstrap" or rules.equivalence == "interval" else None,
        "p_improvement": exact.share_better(a_vals, b_vals, paired, rules.higher_is_better),  # v2's name for it
        **({"trained_pairs": len(trained), "diff_trained": statistics.fmean(trained) if trained else None}
           if penalized(metric, rules) and paired else {}),
        "diverged_arm": sum(bool(r.get("diverged")) for r in arm),
        "diverged_baseline": sum(bool(r.get("diverged")) for r in base),
        "fail_arm_ci": stats.exact_ci(fail_a, len(arm), rules.alpha),
        "fail_baseline_ci": stats.exact_ci(fail_b, len(base), rules.alpha),
        **({"window_interval": windowed} if rules.window_error else {}),
        "pairs_left_out": pairs_left_out, "seeds": seeds,
        "arm_seeds": sorted(a_all, key=sort_key), "baseline_seeds": sorted(b_all, key=sort_key),
        "_values": (a_vals, b_vals, paired),
    }
    return _version_3(result, arm, base, metric, rules, degenerate) if rules.version >= 3 else result


def _version_3(c: dict, arm: Sequence[Mapping], base: Sequence[Mapping], metric: str, rules: Rules,
               degenerate: bool) -> dict:
    """The fields rules version 3 adds to compare_pair's: no test from a spread that does not vary, the exact
    failure test (the family gives it a word), the spread a plan reads (that of the runs that trained), and the
    share of pairs better beside rliable's probability of improvement (instead of the one p_improvement)."""
    a_vals, b_vals, paired = c["_values"]
    if degenerate:
        c["p_equivalent"] = c["bootstrap_interval"] = None
    c.pop("p_improvement")
    survivors = [[float(r[metric]) for r in rs if not failed(r) and is_number(r.get(metric))] for rs in (arm, base)]
    if paired and penalized(metric, rules):
        trained = _trained_pairs(arm, base, metric)
        spread = (statistics.stdev(trained) if len(trained) > 1 else None, len(trained))
    elif penalized(metric, rules) and min(map(len, survivors)) > 1:
        spread = (math.sqrt(statistics.variance(survivors[0]) + statistics.variance(survivors[1])),
                  min(map(len, survivors)))
    else:
        spread = (c["sd"], c["n_pairs"] if paired else min(len(a_vals), len(b_vals)))
    return {**c, "failure_p": exact.failure_test(c["fail_arm"], c["n_arm"], c["fail_baseline"], c["n_baseline"]),
            "failure_test": "Boschloo exact", "share_better": exact.share_better(a_vals, b_vals, paired,
                                                                               rules.higher_is_better),
            "prob_improvement": exact.probability_of_improvement(a_vals, b_vals, rules.higher_is_better, rules.alpha),
            "_survivors": spread, "_degenerate": degenerate}


def _tost(test: dict, windowed: dict | None, a_vals: Sequence[float], b_vals: Sequence[float], paired: bool,
          margin: float) -> float | None:
    """The equivalence test's p on the interval the verdict uses (the windows' error added when it is)."""
    if test is windowed:
        se = math.sqrt(windowed["se_seeds"] ** 2 + windowed["se_window"] ** 2)
        return stats.tost_p(test["diff"], se, windowed["df"] if windowed["df"] is not None else math.inf, margin)
    error = stats.standard_error(a_vals, b_vals, paired)
    return stats.tost_p(test["diff"], *error, margin) if error else None


def _trained_pairs(arm: Sequence[Mapping], base: Sequence[Mapping], metric: str) -> list[float]:
    """The paired differences of the seeds whose runs trained in both arms (what a survivors-only comparison reads)."""
    survivors = [{r.get("seed"): float(r[metric]) for r in rs if not failed(r) and is_number(r.get(metric))}
                 for rs in (arm, base)]
    return [survivors[0][s] - survivors[1][s] for s in sorted(survivors[0].keys() & survivors[1].keys(),
                                                               key=sort_key)]


def _listed(interval: tuple[float, float] | None) -> list[float] | None:
    return list(interval) if interval is not None else None


# --- the words ----------------------------------------------------------------------------------------------------


def _bootstrap_words(c: dict, rules: Rules, family_size: int) -> str:
    """The word from BCa bootstrap intervals at the Bonferroni levels of the family (no p-values to step down)."""
    a, b, paired = c["_values"]
    level = rules.alpha / family_size
    diff_ci = stats.bootstrap(a, b, level, paired=paired)
    eq_ci = stats.bootstrap(a, b, 2 * level, paired=paired) if rules.equivalence == "tost" else diff_ci
    if eq_ci is not None and -rules.margin < eq_ci[0] and eq_ci[1] < rules.margin:
        return "equivalent"
    if diff_ci is not None and stats.significant(*diff_ci):
        return stats.verdict(*diff_ci, 0.0, rules.higher_is_better)
    return "inconclusive"


def _word(c: dict, p_adj: float | None, p_eq_adj: float | None, rules: Rules, family_size: int) -> str:
    """A comparison's loss word from its adjusted p-values (or, by the rules asking for them, its intervals), never
    better or equivalent for an arm whose failure rate is significantly higher."""
    bootstrap = rules.interval == "bootstrap" and c["bootstrap_interval"] is not None
    if rules.interval == "bootstrap" and not bootstrap:
        c["warnings"].append(f"fewer than {stats.BOOTSTRAP_MIN_N} pairs (or runs per arm): no bootstrap "
                             "interval, the verdict uses the t interval")
    if bootstrap:
        c["ci_low"], c["ci_high"] = c["bootstrap_interval"]
        c["ci_method"] = "paired bootstrap (BCa)" if c["paired_by"] == "seed" else "bootstrap (BCa), unpaired"
        word = _bootstrap_words(c, rules, family_size)
    elif rules.equivalence == "interval":  # the (1 - alpha) interval inside the margin
        word = stats.verdict(c["ci_low"], c["ci_high"], rules.margin, rules.higher_is_better)
        if word in ("better", "worse") and rules.adjust == "holm" and not (p_adj is not None
                                                                            and p_adj <= rules.alpha):
            word = "inconclusive"
    else:
        word = stats.decide(c["diff"], p_adj, p_eq_adj, rules.alpha, rules.higher_is_better)
    boot = c["bootstrap_interval"]
    if boot is not None and not bootstrap and rules.equivalence == "interval":
        other = stats.verdict(*boot, rules.margin, rules.higher_is_better)
        if other != word:
            c["warnings"].append(f"the bootstrap interval [{boot[0]:+.4g}, {boot[1]:+.4g}] gives {other}")
    # the veto reads the unadjusted p (it can only withhold a word); under v3 it says so beside the failure word
    test, p = ("Boschloo, unadjusted", c["failure_p"]) if rules.version >= 3 else ("Fisher", c["fisher_p"])
    more_failures = (p is not None and p <= rules.alpha
                     and c["fail_arm"] / c["n_arm"] > c["fail_baseline"] / c["n_baseline"])
    if more_failures and word in ("better", "equivalent"):
        c["warnings"].append(f"the arm fails significantly more often ({c['fail_arm']} of {c['n_arm']} against "
                             f"{c['fail_baseline']} of {c['n_baseline']}, {test} p {p:.2g}): not {word}")
        word = "inconclusive"
    return word


def assign_words(comparisons: list[dict], rules: Rules, stable: dict | None = None) -> dict:
    """Each comparison's verdict word, adjusted p-values, seeds to plan and the failure check (module docstring);
    rules version 3: every word of the report, stability's too, from one family (minillm.analysis.family).
    Returns the family: {size} (and, version 3, how many tests of each kind it holds)."""
    if rules.version >= 3:
        fam = family.assign(comparisons, stable, rules, lambda c, p, q, size: _word(c, p, q, rules, size))
        for c in comparisons:
            c["no_spread"] = c.pop("_degenerate")  # the differences do not vary: no seeds can decide
            for key in ("_values", "_survivors"):
                c.pop(key)
        return fam
    family_size = len(comparisons) if rules.adjust == "holm" else 1
    tests = [(c["p"], c["p_equivalent"] if rules.equivalence == "tost" else None) for c in comparisons]
    adjusted = stats.step_down(tests) if rules.adjust == "holm" else tests
    for c, (p_adj, p_eq_adj), holm in zip(comparisons, adjusted, stats.holm([c["p"] for c in comparisons]),
                                          strict=True):
        c["p_holm"], c["p_adjusted"], c["p_equivalent_adjusted"] = holm, p_adj, p_eq_adj
        word = _word(c, p_adj, p_eq_adj, rules, family_size)
        c["verdict"], c["significant"] = word, stats.significant(c["ci_low"], c["ci_high"])
        undecided = word == "inconclusive"
        if rules.equivalence == "interval" and rules.adjust == "none":  # the rule registered with the old words
            c["seeds_needed"] = stats.seeds_needed(c["diff"], c["sd"], rules.margin, rules.alpha) if undecided else None
        else:
            n = c["n_pairs"] if c["n_pairs"] is not None else min(map(len, c["_values"][:2]))
            c["seeds_needed"] = (stats.seeds_to_plan(c["diff"], c["sd"], n, rules.margin, rules.alpha,
                                                     tests=family_size) if undecided else None)
        c.pop("_values")
    return {"size": family_size}


# --- the whole comparison ------------------------------------------------------------------------------------------


def compare(runs: Iterable[Any], factor: str | None = None, baseline: Any = None, *, rules: Rules | None = None,
            run_check: Callable[[Mapping], str | None] | None = None, unfinished: Sequence[str] = (),
            **changes: Any) -> dict:
    """Every arm of the factor against the baseline in every stratum (module docstring): the verdicts.json dict.
    ``rules`` (default Rules()) with ``factor``, ``baseline`` and any other rule given as a keyword; ``run_check``
    may flag compared runs (e.g. started before a plan): its message becomes a warning of each comparison holding
    such runs; ``unfinished`` names run folders that have not ended. Raises CompareError for a request the runs
    cannot answer."""
    rules = (rules or Rules()).with_(**{k: v for k, v in (("factor", factor), ("baseline", baseline)) if v is not None},
                                     **changes)
    runs = list(runs)
    check_summaries(runs)
    found, duplicates = without_duplicates(records_of(runs))
    records = [r for r in found if r.get("status") != "preempted"]
    metric, metric_note = resolve_metric(records, rules.metric)
    base_value = check_request(records, rules, metric)
    v3 = rules.version >= 3
    records, options = arms.with_options(records, rules.factor, base_value) if v3 else (records, {})
    keys = strata_keys(records, rules.factor)
    comparisons, notes = [], [n for n in (metric_note,) if n]
    for members in group_runs(records, keys).values():
        stratum = {k: members[0].get(k) for k in keys}
        where = f" in stratum {', '.join(f'{k}={label(v)}' for k, v in stratum.items())}" if stratum else ""
        by_value = {key[0]: rs for key, rs in group_runs(members, [rules.factor]).items()}  # hashable value -> runs
        value_of_key = {key: rs[0].get(rules.factor) for key, rs in by_value.items()}
        base = hashable(base_value)
        if base not in by_value or len(by_value) < 2:
            notes.append(f"nothing compared{where}: {'no baseline run' if base not in by_value else 'no other arm'}")
            continue
        family_choice = None if v3 else lr_choice.choose(by_value, rules.lr, rules.lr_choice, metric, where)
        for value in by_value:
            if value == base:
                continue
            choice = family_choice or lr_choice.choose({value: by_value[value], base: by_value[base]}, rules.lr,
                                                       rules.lr_choice, metric, where)  # v3: each pair its own
            result = compare_pair(choice.runs[value], choice.runs[base], metric, rules)
            if choice.how == selection.SELECTION_AWARE:
                result = selection.compare_grid(by_value[value], by_value[base], result, rules,
                                                lambda a, b: compared_values(a, b, metric, rules))
            flagged = defaultdict(list)
            for r in [*choice.runs[value], *choice.runs[base]] if run_check else []:
                if message := run_check(r):
                    flagged[message].append(str(r.get("run_dir")))
            result["warnings"] = [*choice.warnings[value], *choice.warnings[base], *([choice.note] if choice.note
                                                                                      else []),
                                  *result["warnings"],
                                  *(f"{len(d)} compared run(s) {m}: {some(d)}" for m, d in flagged.items()),
                                  *([f"{len(unfinished)} run(s) of the sweep have not ended: the verdict may change"]
                                    if unfinished else [])]
            comparisons.append({"arm": value_of_key[value], "baseline": base_value, "stratum": stratum,
                                "arm_lr": choice.lrs[value], "baseline_lr": choice.lrs[base], **result,
                                "lr_choice": choice.record(),
                                "arm_lr_grid": {label(k): v for k, v in choice.grids[value].items()},
                                "baseline_lr_grid": {label(k): v for k, v in choice.grids[base].items()},
                                **({**selection.exploratory(choice), "arm_value": options[value]["value"],
                                    "arm_options": options[value]["options"]} if v3 else {})})
    stable = lr_curves.stability(records, rules, metric, keys, base_value) if rules.stability else None
    fam = assign_words(comparisons, rules, stable)
    return {**rules.as_dict(), "baseline": base_value, "metric": metric, "metric_rule": rules.metric,
            "lr_rule": rules.lr, "failures_rule": ("penalize" if penalized(metric, rules) else
                                                    "drop" if rules.failures == "drop" else "drop (not a loss)"),
            "family": fam["size"],
            **({"family_tests": {k: v for k, v in fam.items() if k != "size"}} if rules.version >= 3 else {}),
            "strata_keys": keys, "n_runs": len(records), "duplicates": duplicates, "unfinished": list(unfinished),
            "left_out": sorted(str(r.get("run_dir")) for r in found if r.get("status") == "preempted"),
            "notes": notes, "comparisons": [_ordered(c) for c in comparisons],
            **({"stability_verdict": stable} if stable is not None else {})}


def some(items: Sequence[str], shown: int = 3) -> str:
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")


VERDICTS_FIELDS = ("arm", "baseline", "stratum", "arm_lr", "baseline_lr", "n_pairs", "diff", "ci_low", "ci_high",
                   "ci_method", "p", "p_holm", "significant", "verdict", "fail_arm", "fail_baseline", "n_arm",
                   "n_baseline", "fisher_p", "seeds_needed", "warnings")


def _ordered(c: dict) -> dict:
    """The documented fields of verdicts.json first, in their order, then the extras."""
    return {**{k: c[k] for k in VERDICTS_FIELDS}, **{k: v for k, v in c.items() if k not in VERDICTS_FIELDS}}
