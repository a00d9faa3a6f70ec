"""The stability verdict: each arm's loss-vs-lr curve against the baseline's, per seed and paired by seed.

For a sweep over an lr grid (``minillm-report <sweep> --compare norm --baseline layernorm --stability``). A seed's
curve is its loss at each lr of the grid both arms ran, a failed run counting at ln V and every loss clipped at
ln V (minillm.analysis.compare.value_of with failures penalized: the definition of Wortsman et al. 2023, "Small-scale
proxies for large-scale Transformer training instabilities"). Per seed:

    lr_sensitivity     mean over the grid of the loss minus the best loss on the grid (nats; lower is better)
    lr_range_decades   the width, in decades, of the contiguous lrs around the best whose loss is within
                       ``tolerance`` of it (higher is better; bounded by the grid)
    failure_rate       the share of the grid's lrs at which the run failed (lower is better)

Each is compared paired by seed (the t interval of the differences), with an equivalence margin of its own
(margin, range_margin, rate_margin), and the words follow minillm.analysis.stats.decide with the family-wise
adjustment over every (arm, stratum, measure) of the stability table (rules version 2).

Rules version 3 (``aligned_measures``): each arm's curve is read around its own best lr (the lowest seed-mean loss
on the grid), over the grid steps -a..+b from it that both arms' grids hold, so that the same curve shifted along
the grid measures the same; the lr sensitivity is taken over the lrs where both runs of a seed pair trained (a
failure is the failure rate's, not a high loss), the trainable range over the trained lrs; the sensitivity is
compared by the paired t test (no evidence when the differences do not vary), the range by the sign test and the
failure rate by the exact test stratified by seed (minillm.analysis.exact), each with its equivalence test; the
words come from the report's one family (minillm.analysis.family). A warning says when the arms' best lrs differ
or one sits at the grid's edge.

Rules version 4: the same, but each seed pair is read around each run's own best lr (its lowest trained loss), not
around the best of the seeds' mean, and a pair whose window holds one grid step has no range either; its edge
warning counts the runs whose own best sits at the grid's edge. Version 3's best is one choice made from every
seed's runs: when the two arms' bests differed by chance, the windows of every seed moved at once (with failures at
the top lrs, cut differently for the two arms), so the seed pairs' differences shared one offset and were no longer
independent, and identical arms got a sensitivity word in up to 8% of sweeps, more with more seeds. Each pair read
on its own runs is independent of the other pairs again.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from minillm import schema
from minillm.analysis import exact, stats
from minillm.analysis.rules import Rules, failed, value_of
from minillm.analysis.runs import group_runs, hashable, label, sort_key

MEASURES = {
    "lr_sensitivity": ("nats", False, "mean over the grid of the loss minus the best loss on the grid"),
    "lr_range_decades": ("decades", True, "width of the contiguous lrs within the tolerance of the best loss"),
    "failure_rate": ("share", False, "share of the grid's lrs at which the run failed"),
}


def _margin(measure: str, rules: Rules) -> float:
    return {"lr_sensitivity": rules.margin, "lr_range_decades": rules.range_margin,
            "failure_rate": rules.rate_margin}[measure]


def seed_curves(runs: Sequence[Mapping], metric: str, rules: Rules) -> dict[Any, dict[Any, tuple[float, bool]]]:
    """seed -> lr -> (the loss the stability verdict reads, failed) for one value's runs (several runs of a seed at
    one lr: their mean, failed if any failed)."""
    penalize = rules.with_(failures="penalize")
    out: dict[Any, dict[Any, tuple[float, bool]]] = {}
    for (seed, lr), rs in group_runs(runs, ["seed", "lr"]).items():
        values = [value_of(r, metric, penalize) for r in rs]
        values = [v for v in values if v is not None]
        if values:
            out.setdefault(seed, {})[lr] = (statistics.fmean(values), any(map(failed, rs)))
    return out


def measures(curve: Mapping[Any, tuple[float, bool]], tolerance: float) -> dict[str, float]:
    """The three measures of one seed's curve (module docstring); lrs in grid order."""
    lrs = sorted(curve, key=sort_key)
    loss = [curve[lr][0] for lr in lrs]
    best = min(range(len(lrs)), key=loss.__getitem__)
    low = high = best
    while low > 0 and loss[low - 1] <= loss[best] + tolerance:
        low -= 1
    while high < len(lrs) - 1 and loss[high + 1] <= loss[best] + tolerance:
        high += 1
    return {"lr_sensitivity": statistics.fmean(v - loss[best] for v in loss),
            "lr_range_decades": math.log10(lrs[high] / lrs[low]),
            "failure_rate": sum(curve[lr][1] for lr in lrs) / len(lrs)}


def _compare_measure(arm: Sequence[float], base: Sequence[float], measure: str, rules: Rules) -> dict:
    t = stats.paired_t(arm, base, rules.alpha)
    return {"arm_mean": statistics.fmean(arm) if arm else None,
            "baseline_mean": statistics.fmean(base) if base else None, "diff": t["diff"], "ci_low": t["ci_low"],
            "ci_high": t["ci_high"], "p": t["p"], "margin": _margin(measure, rules),
            "p_equivalent": stats.tost_p(t["diff"], *(stats.standard_error(arm, base, True) or (None, None)),
                                      _margin(measure, rules)), "sd": t["sd"]}


def _best_index(curves: Mapping[Any, Mapping[Any, tuple[float, bool]]], grid: Sequence[Any],
                seeds: Sequence[Any]) -> int | None:
    """The grid index of an arm's best lr: the lowest mean over the paired seeds (a failed run at ln V); None when
    no run of the arm trained at any lr of the grid."""
    if all(curves[s][lr][1] for s in seeds for lr in grid):
        return None
    return min(range(len(grid)), key=lambda i: statistics.fmean(curves[s][grid[i]][0] for s in seeds))


def _own_best(curve: Mapping[Any, tuple[float, bool]], grid: Sequence[Any]) -> int | None:
    """Rules version 4: the grid index of a run's lowest trained loss (None when it trained at no lr)."""
    trained = [i for i, lr in enumerate(grid) if not curve[lr][1]]
    return min(trained, key=lambda i: curve[grid[i]][0]) if trained else None


def _steps(best: Mapping[str, int], grid: Sequence[Any]) -> tuple[int, int]:
    """The grid steps (low <= 0 <= high) around each of the bests that both curves hold."""
    return -min(best.values()), min(len(grid) - 1 - b for b in best.values())


def _trainable_range(loss: Sequence[float], trained: Sequence[bool], lrs: Sequence[float], tolerance: float) -> \
        float | None:
    """The decades of the contiguous trained lrs around the best trained one within ``tolerance`` of it."""
    if not any(trained):
        return None
    best = min((i for i in range(len(loss)) if trained[i]), key=loss.__getitem__)
    low = high = best
    while low > 0 and trained[low - 1] and loss[low - 1] <= loss[best] + tolerance:
        low -= 1
    while high < len(loss) - 1 and trained[high + 1] and loss[high + 1] <= loss[best] + tolerance:
        high += 1
    return math.log10(lrs[high] / lrs[low])


def aligned_measures(arm_c: Mapping, base_c: Mapping, grid: Sequence[Any], seeds: Sequence[Any], rules: Rules) -> \
        tuple[dict[str, list[tuple[float | None, float | None]]], list[str]]:
    """Rules version 3 on: per seed pair, (arm, baseline) of each measure read around each arm's own best lr (version
    3: the best of the seeds' mean; 4: each run's own; module docstring; None where a seed has nothing to measure),
    and the warnings about the arms' optima."""
    out: dict[str, list] = {m: [] for m in MEASURES}
    out["failures"] = []  # (k_arm, n, k_base, n) per seed, for the stratified exact test
    if not seeds:
        return out, []
    best = {"arm": _best_index(arm_c, grid, seeds), "baseline": _best_index(base_c, grid, seeds)}
    untrained = [who for who, b in best.items() if b is None]
    for s in seeds:
        k = {who: sum(c[s][lr][1] for lr in grid) for who, c in (("arm", arm_c), ("baseline", base_c))}
        out["failure_rate"].append((k["arm"] / len(grid), k["baseline"] / len(grid)))
        out["failures"].append((k["arm"], len(grid), k["baseline"], len(grid)))
        if untrained:
            out["lr_sensitivity"].append((None, None))
            out["lr_range_decades"].append((None, None))
    if untrained:
        return out, [f"the {' and the '.join(untrained)} trained at no lr of the grid: no lr sensitivity or range, "
                     "only the failure rate"]
    low, high = _steps(best, grid)
    warnings = []
    if best["arm"] != best["baseline"]:
        where = (f"each arm's own best, over the {high - low + 1} grid steps ({low:+d} to {high:+d}) both can show"
                 if rules.version < 4 else "each run's own best lr, over the grid steps both runs of its seed pair "
                 "can show")
        warnings.append(f"the arms' best lrs differ (arm {label(grid[best['arm']])}, baseline "
                        f"{label(grid[best['baseline']])}): lr sensitivity and range are read around {where}")
    edges = (0, len(grid) - 1) if len(grid) > 1 else ()
    for who, b in best.items():
        if rules.version < 4 and b in edges:
            warnings.append(f"the {who}'s best lr {label(grid[b])} sits at the grid's edge: its curve beyond is "
                            "unseen, and the measures are bounded by the grid")
        if rules.version >= 4:  # each run is read around its own best: say how many of those sit at an edge
            curves = arm_c if who == "arm" else base_c
            at_edge = [s for s in seeds if _own_best(curves[s], grid) in edges]
            if at_edge:
                warnings.append(f"the {who}'s own best lr sits at the grid's edge in {len(at_edge)} of {len(seeds)} "
                                "runs: their curves beyond are unseen, and the measures are bounded by the grid")
    for s in seeds:
        own = best if rules.version < 4 else {who: _own_best(c[s], grid) for who, c in (("arm", arm_c),
                                                                                        ("baseline", base_c))}
        if None in own.values():  # one run of the pair trained at no lr: its failures are the failure rate's
            out["lr_sensitivity"].append((None, None))
            out["lr_range_decades"].append((None, None))
            continue
        low, high = _steps(own, grid)
        window = {who: [grid[own[who] + o] for o in range(low, high + 1)] for who in own}
        seed_curve = {"arm": arm_c[s], "baseline": base_c[s]}
        loss = {who: [seed_curve[who][lr][0] for lr in window[who]] for who in own}
        trained = {who: [not seed_curve[who][lr][1] for lr in window[who]] for who in own}
        both = [i for i in range(high - low + 1) if trained["arm"][i] and trained["baseline"][i]]
        sens = {who: (statistics.fmean(loss[who][i] for i in both) - min(loss[who][i] for i in both)
                      if len(both) >= 2 else None) for who in own}
        out["lr_sensitivity"].append((sens["arm"], sens["baseline"]))
        if rules.version >= 4 and high == low:  # one grid step in the window: no range to measure
            out["lr_range_decades"].append((None, None))
            continue
        out["lr_range_decades"].append(tuple(_trainable_range(loss[who], trained[who], window[who], rules.tolerance)
                                             for who in own))
    return out, warnings


def _compare_v3(found: Mapping[str, list], measure: str, rules: Rules) -> dict:
    """One measure's comparison under rules version 3: the difference, its test and equivalence test, no words."""
    pairs = [(a, b) for a, b in found[measure] if a is not None and b is not None]
    arm, base = [a for a, _ in pairs], [b for _, b in pairs]
    diffs = [a - b for a, b in pairs]
    margin, warnings = _margin(measure, rules), []
    entry = {"arm_mean": statistics.fmean(arm) if arm else None,
             "baseline_mean": statistics.fmean(base) if base else None,
             "diff": statistics.fmean(diffs) if diffs else None, "ci_low": None, "ci_high": None, "p": None,
             "margin": margin, "p_equivalent": None, "sd": statistics.stdev(diffs) if len(diffs) > 1 else None,
             "n": len(pairs)}
    if measure == "lr_sensitivity":
        t = stats.paired_t(arm, base, rules.alpha)
        entry["test"] = "paired t"
        if exact.degenerate(t["sd"], arm + base):
            warnings.append(f"{measure}: the differences do not vary (sd {t['sd']:.2g}): no evidence either way")
        elif t["p"] is not None:
            error = stats.standard_error(arm, base, True)
            entry.update(ci_low=t["ci_low"], ci_high=t["ci_high"], p=t["p"],
                         p_equivalent=stats.tost_p(t["diff"], *error, margin))
        entry["direction"] = entry["diff"]
    else:
        signs = exact.sign_tests(diffs, margin)
        entry["p_equivalent"] = signs["p_equivalent"]
        if measure == "failure_rate":  # the direction of the pooled counts the exact test reads
            entry.update(test="exact, stratified by seed; equivalence: sign tests", direction=entry["diff"],
                         p=exact.stratified_exact_p(found["failures"]))
        else:  # the sign test's: the median difference
            entry.update(test="sign test", direction=statistics.median(diffs) if diffs else None, p=signs["p"])
    return {**entry, "warnings": warnings}


def stability(records: Sequence[Mapping], rules: Rules, metric: str, keys: Sequence[str], base_value: Any) -> dict:
    """The stability verdicts of every arm in every stratum (module docstring) and the curves for the figure."""
    comparisons, curves, notes = [], [], []
    for members in group_runs(records, keys).values():
        stratum = {k: members[0].get(k) for k in keys}
        by_value = {key[0]: rs for key, rs in group_runs(members, [rules.factor]).items()}
        base = hashable(base_value)
        per_value = {v: seed_curves(rs, metric, rules) for v, rs in by_value.items()}
        curves.append({"stratum": stratum, "values": {label(rs[0].get(rules.factor)): {
            label(s): {label(lr): loss for lr, (loss, _) in sorted(c.items(), key=lambda kv: sort_key(kv[0]))}
            for s, c in sorted(per_value[v].items(), key=lambda kv: sort_key(kv[0]))} for v, rs in by_value.items()}})
        if base not in by_value:
            continue
        for value, rs in by_value.items():
            if value == base:
                continue
            arm_c, base_c = per_value[value], per_value[base]
            grid = sorted(set.intersection(*(set(c) for c in [*arm_c.values(), *base_c.values()])) if arm_c and
                          base_c else set(), key=sort_key)
            seeds = sorted(set(arm_c) & set(base_c), key=sort_key)
            warnings = []
            full = [len(set(c)) for c in [*arm_c.values(), *base_c.values()]]
            if full and any(n != len(grid) for n in full):
                warnings.append(f"seeds ran different lrs: the measures use the {len(grid)} lrs every seed of both "
                                f"ran ({', '.join(map(label, grid))})")
            if len(grid) < 2:
                notes.append(f"no stability verdict for {label(rs[0].get(rules.factor))}"
                             + (f" ({', '.join(f'{k}={label(v)}' for k, v in stratum.items())})" if stratum else "")
                             + ": fewer than 2 lrs that every seed of both arms ran")
                continue
            if len(seeds) < 3:
                warnings.append(f"only {len(seeds)} seeds with the whole grid in both arms (fewer than 3): not "
                                "informative")
            if rules.version >= 3:
                found, why = aligned_measures(arm_c, base_c, grid, seeds, rules)
                compared = {m: _compare_v3(found, m, rules) for m in MEASURES}
                warnings += why + [w for e in compared.values() for w in e.pop("warnings")]
            else:
                per_seed = {who: [measures({lr: c[s][lr] for lr in grid}, rules.tolerance) for s in seeds]
                            for who, c in (("arm", arm_c), ("baseline", base_c))}
                compared = {m: _compare_measure([x[m] for x in per_seed["arm"]], [x[m] for x in per_seed["baseline"]],
                                                m, rules) for m in MEASURES}
            comparisons.append({
                "arm": rs[0].get(rules.factor), "baseline": base_value, "stratum": stratum,
                "grid": grid, "n_pairs": len(seeds), "seeds": seeds, "warnings": warnings,
                "informative": len(seeds) >= 3, "measures": compared})
    inits = [r.get(schema.LOSS_INIT) for r in records if isinstance(r.get(schema.LOSS_INIT), (int, float))]
    result = {"tolerance": rules.tolerance, schema.LOSS_INIT: max(inits) if inits else None, "family": None,
              "measures": {m: {"unit": u, "higher_is_better": h, "meaning": d} for m, (u, h, d) in MEASURES.items()},
              "comparisons": comparisons, "curves": curves, "notes": notes}
    if rules.version >= 3:  # the words come from the report's family (minillm.analysis.family)
        return result
    tests = [(c["measures"][m]["p"], c["measures"][m]["p_equivalent"]) for c in comparisons for m in MEASURES]
    adjusted = iter(stats.step_down(tests) if rules.adjust == "holm" else tests)
    for c in comparisons:
        for m, (_, higher_is_better, _) in MEASURES.items():
            entry = c["measures"][m]
            entry["p_adjusted"], entry["p_equivalent_adjusted"] = next(adjusted)
            entry["verdict"] = stats.decide(entry["diff"], entry["p_adjusted"], entry["p_equivalent_adjusted"],
                                         rules.alpha, higher_is_better)
    return {**result, "family": len(tests) if rules.adjust == "holm" else 1}


def plot(result: dict, path: Path) -> None:
    """loss_vs_lr.png: per stratum one panel, per value its seeds' mean loss against lr with the seeds' range
    shaded and each seed's points, ln V dashed; the y axis zoomed to the losses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = result["curves"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.9), squeeze=False, sharey=True)
    shown: list[float] = []
    for ax, panel in zip(axes[0], panels, strict=True):
        for value, seeds in panel["values"].items():
            lrs = sorted({float(lr) for c in seeds.values() for lr in c})
            by_lr = [[c[label(lr)] for c in seeds.values() if label(lr) in c] for lr in lrs]
            mean = [statistics.fmean(v) for v in by_lr]
            line, = ax.plot(lrs, mean, marker="o", lw=1.4, label=f"{value} ({len(seeds)} seeds)")
            ax.fill_between(lrs, [min(v) for v in by_lr], [max(v) for v in by_lr], color=line.get_color(),
                            alpha=0.18, lw=0)
            for lr, v in zip(lrs, by_lr, strict=True):
                ax.plot([lr] * len(v), v, ".", color=line.get_color(), ms=3, alpha=0.6)
            shown += [x for v in by_lr for x in v]
        if result.get(schema.LOSS_INIT):
            ax.axhline(result[schema.LOSS_INIT], color="gray", ls="--", lw=0.8)
        ax.set(xscale="log", xlabel="learning rate", title=", ".join(f"{k}={label(v)}" for k, v in
                                                                     panel["stratum"].items()) or "all runs")
        ax.legend(fontsize=7)
    if shown:
        low, high = min(shown), max(shown)
        pad = 0.05 * (high - low or 1.0)
        axes[0][0].set_ylim(low - pad, high + pad)
    axes[0][0].set_ylabel("loss (failed run = ln V)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
