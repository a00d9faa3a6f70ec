"""A sweep's runs -> a verdict for each value of one factor against a baseline value (pure: records in, dicts out).

    compare(runs, "norm", "layernorm")   -> the verdicts.json dict (VERDICTS_FIELDS per comparison)

``runs`` are summary.json dicts (or minillm.runs.Run objects). The rules, in order:

- **Arms and strata.** The arms are the values of the factor other than the baseline. Every other config key that
  still varies within an arm (STRATUM_KEYS; never seed, lr, or the labels name and tags) splits the runs into
  strata, and each stratum compares its arms with its own baseline runs. A run stopped by a signal and not
  resumed (status preempted) has no outcome yet and is left out.
- **The learning rate** of each arm and of the baseline (``lr``): ``tuned`` (default) takes each one's own best lr
  on the grid, the lowest mean over seeds of its tuning loss (below); ``common`` takes the one lr that every value
  of the stratum ran with the lowest mean over the values of their mean tuning loss (each value weighs the same,
  so no arm is favoured; an error when the values share no lr); a number takes that lr for every value (an error
  when one lacks it). The tuning loss is minillm.outcome's comparison loss of the metric when it is a loss in nats
  (LOSSES), else of the final val loss; a failed run (diverged, crashed, stalled at the unigram loss:
  minillm.outcome.failed_of) counts as ln V. A best lr at the edge of a grid of several lrs is a warning: the
  grid does not bracket the optimum.
- **Failures** at the compared lrs: failed and diverged counts per arm, their Clopper-Pearson intervals, Fisher's
  exact test against the baseline. Failed runs are left out of the metric's comparison (pairs with a failed run
  are counted in ``pairs_left_out``).
- **The difference** arm - baseline: paired by seed (``paired_by`` seed, or auto when the two share a seed), the
  t interval of the paired differences, else Welch's interval; also a BCa bootstrap interval from 8 differences
  (or runs per arm). The verdict uses the t interval, or the bootstrap one with ``interval="bootstrap"`` (when it
  exists); ``ci_method`` names it. Holm-adjusted p-values across every comparison of the call.
- **Warnings** that make a verdict not informative (``informative`` false): fewer than 3 pairs (or runs per arm),
  every run of an arm failed, and arms that ran on different CPU kernels, torch versions or git commits while
  their difference is below PROVENANCE_NOISE (or the metric is not in nats). Others: a best lr at a grid edge,
  runs without a partner seed, repeated seeds, runs without the metric, a bootstrap verdict that differs.
- **The evaluation windows** (``window_error``): the t interval adds the sampling error of the evaluated windows
  (minillm.verdicts.window_se, with_window_error; per-window losses from minillm.runs.eval_windows), paired when
  every run holds as many windows (one eval set). Without them for some run: the seeds' interval, and a warning.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from minillm import verdicts as st
from minillm.outcome import failed_of, loss_for_comparison
from minillm.runs import eval_windows, group_runs, hashable, label, sort_key

LOSSES = ("final_val_loss", "best_val_loss", "test_loss")  # losses in nats, with ln V as their ceiling
# config keys that split a comparison into strata when they vary within an arm, in this order (a key that follows
# the ones before it, e.g. norm_options after norm, does not)
STRATUM_KEYS = ("norm", "placement", "init", "qk_norm", "precision", "precision_used", "warmup_steps", "n_layers",
                "dim", "n_heads", "n_kv_heads", "tie_embeddings", "vocab_size", "max_seq_len", "batch_size", "seq_len",
                "max_steps", "grad_clip", "weight_decay", "z_loss", "norm_eps", "norm_options", "attn_norm_options")
ENVIRONMENT = (("cpu_capability", "CPU kernels"), ("torch_version", "torch versions"), ("code", "git commits"))
# Another CPU's vector kernels move a run's losses by a few thousandths of a nat (README, "The default run"):
# a difference below this between arms that ran in different environments is not evidence.
PROVENANCE_NOISE = 0.005
PAIRED_BY = ("auto", "seed", "none")
INTERVALS = ("t", "bootstrap")
MIN_PAIRS = 3


class CompareError(ValueError):
    """A request the runs cannot answer; ``option`` names the command-line option at fault."""

    def __init__(self, option: str, message: str):
        self.option = option
        super().__init__(f"{option}: {message}")


# --- values, groups ------------------------------------------------------------------------------------------


def matches(value: Any, text: str) -> bool:
    """``text`` (from a command line or a plan) names ``value``: 8 names 8.0, true names True, null names None."""
    if isinstance(value, bool) or value is None:
        return text.lower() in {True: ("true", "1", "yes"), False: ("false", "0", "no"), None: ("none", "null")}[value]
    if isinstance(value, (int, float)):
        try:
            return math.isclose(float(value), float(text), rel_tol=1e-9)
        except ValueError:
            return False
    return label(value) == text or str(value) == text


def records_of(runs: Iterable[Any]) -> list[dict]:
    """summary dicts from summary dicts or Run objects (which add their folder as run_dir when it is missing)."""
    out = []
    for run in runs:
        summary = getattr(run, "summary", run)
        folder = getattr(run, "dir", None)
        out.append({**summary, "run_dir": summary.get("run_dir") or (str(folder) if folder else None)})
    return out


def strata_keys(records: Sequence[Mapping], factor: str) -> list[str]:
    """The STRATUM_KEYS (factor left out) that take several values within one arm, each counted only when it still
    varies once the arm and the keys chosen before it are fixed."""
    chosen: list[str] = []
    for key in STRATUM_KEYS:
        if key != factor and any(len({hashable(r.get(key)) for r in members}) > 1
                                 for members in group_runs(records, [factor, *chosen]).values()):
            chosen.append(key)
    return chosen


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def factor_values(records: Sequence[Mapping], factor: str) -> list[Any]:
    return [members[0].get(factor) for members in group_runs(records, [factor]).values()]


def varying_keys(records: Sequence[Mapping]) -> list[str]:
    """The config and environment keys that take several values across the runs (the factors one can compare)."""
    keys = [*STRATUM_KEYS, *(k for k, _ in ENVIRONMENT if k != "code"), "git_commit", "minillm_version"]
    return [k for k in keys if any(k in r for r in records) and len(group_runs(records, [k])) > 1]


# --- checking a request ----------------------------------------------------------------------------------------


def check_request(records: Sequence[Mapping], factor: str, baseline: str, metric: str, margin: float, alpha: float,
                  lr: str | float, paired_by: str = "auto", interval: str = "t") -> Any:
    """Raise CompareError (naming the option and what is allowed) for a request the runs cannot answer; return the
    baseline's value as the runs hold it."""
    if not records:
        raise CompareError("sweep", "no run with an outcome (summary.json) to compare")
    allowed = ", ".join(varying_keys(records)) or "none (nothing varies across these runs)"
    if factor in ("seed", "lr"):
        raise CompareError("--compare", f"{factor} cannot be the factor (seeds are paired, lrs tuned); allowed: "
                                        f"{allowed}")
    if not any(factor in r for r in records):
        raise CompareError("--compare", f"unknown factor {factor!r}, not a key of the runs' summary.json; allowed: "
                                        f"{allowed}")
    values = factor_values(records, factor)
    if len(values) < 2:
        raise CompareError("--compare", f"{factor} does not vary (every run has {label(values[0])}); allowed: "
                                        f"{allowed}")
    found = [v for v in values if matches(v, str(baseline))]
    if not found:
        raise CompareError("--baseline", f"{baseline!r} is not a value of {factor}; allowed: "
                                         f"{', '.join(label(v) for v in values)}")
    if not any(_finite(r.get(metric)) for r in records):
        numeric = sorted({k for r in records for k, v in r.items() if _finite(v) and k not in STRATUM_KEYS})
        raise CompareError("--metric", f"{metric!r} has no value in the runs' summary.json; allowed: "
                                       f"{', '.join(numeric)}")
    if not (_finite(margin) and margin > 0):
        raise CompareError("--margin", f"{margin} is invalid; allowed: a number > 0, in the metric's units")
    if not (_finite(alpha) and 0 < alpha < 1):
        raise CompareError("--alpha", f"{alpha} is invalid; allowed: a number in (0, 1)")
    if lr not in ("tuned", "common") and not (_finite(lr) and lr > 0):
        raise CompareError("--lr", f"{lr} is invalid; allowed: tuned, common or a learning rate > 0")
    if paired_by not in PAIRED_BY:
        raise CompareError("--paired-by", f"{paired_by} is invalid; allowed: {', '.join(PAIRED_BY)}")
    if interval not in INTERVALS:
        raise CompareError("--interval", f"{interval} is invalid; allowed: {', '.join(INTERVALS)}")
    return found[0]


# --- the learning rate -------------------------------------------------------------------------------------------


def tuning_loss(record: Mapping, metric: str) -> float:
    """minillm.outcome's comparison loss of ``metric`` (of the final val loss for a metric not in nats); a failed
    run counts as a diverged one, ln V."""
    failed = bool(record.get("diverged")) or failed_of(record)
    return loss_for_comparison({**record, "diverged": failed}, key=metric if metric in LOSSES else "final_val_loss")


def loss_by_lr(records: Sequence[Mapping], metric: str) -> dict[Any, float]:
    """lr -> mean tuning loss over the runs at that lr, in lr order."""
    return {key[0]: statistics.fmean(tuning_loss(r, metric) for r in rs)
            for key, rs in group_runs(records, ["lr"]).items()}


def choose_lrs(by_value: Mapping[Any, Sequence[Mapping]], rule: str | float, metric: str,
               where: str = "") -> dict[Any, tuple[Any, dict[Any, float], list[str]]]:
    """value -> (its lr, its loss by lr, warnings) under ``rule`` (module docstring); CompareError when a common lr
    or the given lr is missing."""
    grids = {v: loss_by_lr(rs, metric) for v, rs in by_value.items()}
    out = {}
    if rule == "tuned":
        for v, grid in grids.items():
            best = min(grid, key=grid.get)
            warn = []
            if len(grid) > 1 and best in (min(grid, key=sort_key), max(grid, key=sort_key)):
                edge = "lowest" if best == min(grid, key=sort_key) else "highest"
                warn.append(f"the best lr of {label(v)}, {label(best)}, is the {edge} of its grid "
                            f"({', '.join(label(x) for x in grid)}): the grid does not bracket its optimum")
            out[v] = (best, grid, warn)
        return out
    if rule == "common":
        shared = set.intersection(*(set(g) for g in grids.values()))
        if not shared:
            lrs = "; ".join(f"{label(v)}: {', '.join(label(x) for x in g)}" for v, g in grids.items())
            raise CompareError("--lr", f"common: no lr was run by every value{where} ({lrs}); use tuned or a value")
        pick = min(sorted(shared, key=sort_key), key=lambda x: statistics.fmean(g[x] for g in grids.values()))
    else:
        pick = next((x for x in grids[next(iter(grids))] if _finite(x) and math.isclose(x, rule, rel_tol=1e-9)), None)
        for v, g in grids.items():
            if not any(_finite(x) and math.isclose(x, rule, rel_tol=1e-9) for x in g):
                raise CompareError("--lr", f"{label(rule)}: {label(v)} has no run at that lr{where} (its lrs: "
                                           f"{', '.join(label(x) for x in g)})")
    return {v: (next(x for x in g if x == pick or (_finite(x) and math.isclose(x, pick, rel_tol=1e-9))), g, [])
            for v, g in grids.items()}


# --- one comparison ---------------------------------------------------------------------------------------------


def _usable(record: Mapping, metric: str) -> bool:
    return not failed_of(record) and _finite(record.get(metric))


def _environment(record: Mapping, key: str) -> Any:
    if key != "code":
        return record.get(key)
    commit = record.get("git_commit")
    return f"{commit[:10]}{'+dirty' if record.get('git_dirty') else ''}" if commit else None


def _environment_warnings(arm: Sequence[Mapping], base: Sequence[Mapping], metric: str,
                          diff: float | None) -> tuple[list[str], bool]:
    """Warnings for arms that ran in different environments, and whether one makes the verdict not informative."""
    warnings, blocking = [], False
    for key, what in ENVIRONMENT:
        a, b = ({_environment(r, key) for r in rs} - {None} for rs in (arm, base))
        if a and b and a != b:
            small = metric not in LOSSES or diff is None or abs(diff) < PROVENANCE_NOISE
            blocking |= small
            size = (f"the difference ({'n/a' if diff is None else f'{diff:+.4g}'}) is smaller than the "
                    f"~{PROVENANCE_NOISE} nats that alone can move: not informative" if small else
                    f"the difference ({diff:+.4g}) is larger than the ~{PROVENANCE_NOISE} nats that alone moves")
            warnings.append(f"arm and baseline ran on different {what} ({', '.join(sorted(map(str, a)))} vs "
                            f"{', '.join(sorted(map(str, b)))}); {size}")
    return warnings, blocking


def _by_seed(records: Sequence[Mapping], metric: str) -> tuple[dict[Any, list[float]], set, list[Any]]:
    """seed -> the metric of its usable runs, every seed present, seeds with more than one run."""
    usable: dict[Any, list[float]] = defaultdict(list)
    counts: dict[Any, int] = defaultdict(int)
    for r in records:
        counts[r.get("seed")] += 1
        if _usable(r, metric):
            usable[r.get("seed")].append(float(r[metric]))
    return usable, set(counts), sorted((s for s, c in counts.items() if c > 1), key=sort_key)


def _window_interval(arm: Sequence[Mapping], base: Sequence[Mapping], metric: str, a_vals: Sequence[float],
                     b_vals: Sequence[float], paired: bool, alpha: float) -> tuple[dict | None, str | None]:
    """with_window_error's interval from the usable runs' per-window losses, or (None, the warning why not)."""
    found = [[eval_windows(dict(r), metric) for r in rs if _usable(r, metric)] for rs in (arm, base)]
    if any(w is None for ws in found for w in ws) or not all(found):
        return None, (f"no per-window losses of {metric} for some compared runs (LitLM's eval_windows): the "
                      "interval leaves out the sampling error of the evaluation windows")
    same = len({len(w) for ws in found for w in ws}) == 1
    se, n_windows = st.window_se(*found, paired=same)
    return st.with_window_error(a_vals, b_vals, paired, se, n_windows, alpha), None


def compare_pair(arm: Sequence[Mapping], base: Sequence[Mapping], metric: str = "final_val_loss",
                 margin: float = 0.02, alpha: float = 0.05, paired_by: str = "auto", higher_is_better: bool = False,
                 interval: str = "t", window_error: bool = False) -> dict:
    """The comparison of one arm's runs with the baseline's (both at their compared lr): the difference, its
    intervals, p, the verdict, failures and warnings (fields of verdicts.json, without arm, stratum and lrs)."""
    warnings: list[str] = []
    a_seed, a_all, a_rep = _by_seed(arm, metric)
    b_seed, b_all, b_rep = _by_seed(base, metric)
    shared = (a_all & b_all) - {None}
    paired = paired_by == "seed" or (paired_by == "auto" and bool(shared))
    for who, rep in (("arm", a_rep), ("baseline", b_rep)):
        if rep:
            warnings.append(f"seeds with several runs in the {who} ({', '.join(map(label, rep))}): their mean is used")
    missing = sum(not failed_of(r) and not _finite(r.get(metric)) for r in [*arm, *base])
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
        t = st.paired_t(a_vals, b_vals, alpha)
    else:
        seeds = []
        a_vals = [v for vs in a_seed.values() for v in vs]
        b_vals = [v for vs in b_seed.values() for v in vs]
        t = st.welch_t(a_vals, b_vals, alpha)
    boot = st.bootstrap(a_vals, b_vals, alpha, paired=paired)
    chosen, method = (t["ci_low"], t["ci_high"]), t["method"]
    windowed, why = _window_interval(arm, base, metric, a_vals, b_vals, paired, alpha) if window_error else (None, None)
    warnings += [why] if why else []
    if windowed is not None and windowed["ci_low"] is not None:
        chosen, method, t = (windowed["ci_low"], windowed["ci_high"]), windowed["method"], {**t, "p": windowed["p"]}
    boot_name = "paired bootstrap (BCa)" if paired else "bootstrap (BCa), unpaired"
    if interval == "bootstrap" and boot is not None:
        chosen, method = boot, boot_name
    elif interval == "bootstrap":
        warnings.append(f"fewer than {st.BOOTSTRAP_MIN_N} {'pairs' if paired else 'runs per arm'}: no bootstrap "
                        "interval, the verdict uses the t interval")
    ruling = st.verdict(*chosen, margin, higher_is_better)
    if boot is not None and interval == "t" and st.verdict(*boot, margin, higher_is_better) != ruling:
        warnings.append(f"the {boot_name} interval [{boot[0]:+.4g}, {boot[1]:+.4g}] gives "
                        f"{st.verdict(*boot, margin, higher_is_better)}")
    n = len(seeds) if paired else min(len(a_vals), len(b_vals))
    blocking = n < MIN_PAIRS
    if blocking:
        warnings.append(f"only {n} {'pairs' if paired else 'usable runs in an arm'} (fewer than {MIN_PAIRS}): the "
                        "verdict is not informative")
    fail_a, fail_b = sum(map(failed_of, arm)), sum(map(failed_of, base))
    for who, k, rs in (("arm", fail_a, arm), ("baseline", fail_b, base)):
        if rs and k == len(rs):
            blocking = True
            warnings.append(f"every run of the {who} failed or stalled at the unigram loss ({k} of {len(rs)}; "
                            f"{sum(bool(r.get('diverged')) for r in rs)} diverged): nothing to compare")
    env, env_blocking = _environment_warnings(arm, base, metric, t["diff"])
    warnings += env
    return {
        "n_pairs": len(seeds) if paired else None, "paired_by": "seed" if paired else "none",
        "diff": t["diff"], "ci_low": chosen[0], "ci_high": chosen[1], "ci_method": method, "p": t["p"],
        "significant": st.significant(*chosen), "verdict": ruling,
        "fail_arm": fail_a, "fail_baseline": fail_b, "n_arm": len(arm), "n_baseline": len(base),
        "fisher_p": st.fisher_p(fail_a, len(arm), fail_b, len(base)),
        "seeds_needed": st.seeds_needed(t["diff"], t["sd"], margin, alpha) if ruling == "inconclusive" else None,
        "warnings": warnings, "informative": not (blocking or env_blocking),
        "sd": t["sd"], "t_interval": [t["ci_low"], t["ci_high"]], "bootstrap_interval": list(boot) if boot else None,
        "diverged_arm": sum(bool(r.get("diverged")) for r in arm),
        "diverged_baseline": sum(bool(r.get("diverged")) for r in base),
        "fail_arm_ci": st.exact_ci(fail_a, len(arm), alpha), "fail_baseline_ci": st.exact_ci(fail_b, len(base), alpha),
        **({"window_interval": windowed} if window_error else {}),
        "pairs_left_out": pairs_left_out, "seeds": seeds,
        "arm_seeds": sorted(a_all, key=sort_key), "baseline_seeds": sorted(b_all, key=sort_key),
    }


# --- the whole comparison ------------------------------------------------------------------------------------------


def compare(runs: Iterable[Any], factor: str, baseline: str, *, metric: str = "final_val_loss", margin: float = 0.02,
            alpha: float = 0.05, lr: str | float = "tuned", paired_by: str = "auto", higher_is_better: bool = False,
            interval: str = "t", run_check: Callable[[Mapping], str | None] | None = None,
            window_error: bool = False) -> dict:
    """Every arm of ``factor`` against ``baseline`` in every stratum (module docstring): the verdicts.json dict,
    {factor, baseline, metric, margin, alpha, lr_rule, ..., comparisons: [...]}. ``run_check`` may flag compared
    runs (e.g. started before a plan): its message becomes a warning of each comparison holding such runs.
    Raises CompareError for a request the runs cannot answer."""
    found = records_of(runs)
    records = [r for r in found if r.get("status") != "preempted"]
    base_value = check_request(records, factor, baseline, metric, margin, alpha, lr, paired_by, interval)
    keys = strata_keys(records, factor)
    comparisons, notes = [], []
    for members in group_runs(records, keys).values():
        stratum = {k: members[0].get(k) for k in keys}
        where = f" in stratum {', '.join(f'{k}={label(v)}' for k, v in stratum.items())}" if stratum else ""
        by_value = {key[0]: rs for key, rs in group_runs(members, [factor]).items()}  # hashable value -> runs
        value_of = {key: rs[0].get(factor) for key, rs in by_value.items()}
        base = hashable(base_value)
        if base not in by_value or len(by_value) < 2:
            notes.append(f"nothing compared{where}: {'no baseline run' if base not in by_value else 'no other arm'}")
            continue
        lrs = choose_lrs(by_value, lr, metric, where)
        base_lr, base_grid, base_warn = lrs[base]
        base_runs = [r for r in by_value[base] if r.get("lr") == base_lr]
        for value, rs in by_value.items():
            if value == base:
                continue
            arm_lr, arm_grid, arm_warn = lrs[value]
            arm_runs = [r for r in rs if r.get("lr") == arm_lr]
            result = compare_pair(arm_runs, base_runs, metric, margin, alpha, paired_by, higher_is_better, interval,
                                  window_error)
            flagged = defaultdict(list)
            for r in [*arm_runs, *base_runs] if run_check else []:
                if message := run_check(r):
                    flagged[message].append(str(r.get("run_dir")))
            result["warnings"] = [*arm_warn, *base_warn, *result["warnings"],
                                  *(f"{len(d)} compared run(s) {m}: {some(d)}" for m, d in flagged.items())]
            comparisons.append({"arm": value_of[value], "baseline": base_value, "stratum": stratum, "arm_lr": arm_lr,
                                "baseline_lr": base_lr, **result,
                                "arm_lr_grid": {label(k): v for k, v in arm_grid.items()},
                                "baseline_lr_grid": {label(k): v for k, v in base_grid.items()}})
    for c, p in zip(comparisons, st.holm([c["p"] for c in comparisons]), strict=True):
        c["p_holm"] = p
    return {"factor": factor, "baseline": base_value, "metric": metric, "margin": margin, "alpha": alpha,
            "lr_rule": lr, "higher_is_better": higher_is_better, "paired_by": paired_by, "interval": interval,
            **({"window_error": True} if window_error else {}),
            "strata_keys": keys, "n_runs": len(records),
            "left_out": sorted(str(r.get("run_dir")) for r in found if r.get("status") == "preempted"),
            "notes": notes, "comparisons": [_ordered(c) for c in comparisons]}


def some(items: Sequence[str], shown: int = 3) -> str:
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")


VERDICTS_FIELDS = ("arm", "baseline", "stratum", "arm_lr", "baseline_lr", "n_pairs", "diff", "ci_low", "ci_high",
                   "ci_method", "p", "p_holm", "significant", "verdict", "fail_arm", "fail_baseline", "n_arm",
                   "n_baseline", "fisher_p", "seeds_needed", "warnings")


def _ordered(c: dict) -> dict:
    """The documented fields of verdicts.json first, in their order, then the extras."""
    return {**{k: c[k] for k in VERDICTS_FIELDS}, **{k: v for k, v in c.items() if k not in VERDICTS_FIELDS}}
