"""Which learning rate each value of a factor is compared at, and on which runs that lr is chosen.

An lr chosen on the same runs whose losses then judge the arms favours the arm whose runs happened to be lucky at
one lr of the grid, and the more so the flatter its loss-vs-lr curve (more lrs near its best to be lucky at). The
choice can read other data than the verdict:

    validation  the lr chosen on the final validation loss of every seed, the verdict read from the held-out test
                loss: the evaluations differ, but a run's own luck (its init, its data order) is in both losses, so
                in practice this chooses as the judging runs would.
    cross-fit   the seeds split in two halves (sorted, alternating); each half's runs are judged at the lr chosen
                on the other half; the two halves' differences then form one paired comparison. Needs 2 seeds of
                every value in each half. No luck is rewarded, but each half is judged at an lr chosen on half the
                seeds, often not the best one, and that real difference at the judged lrs is what the interval
                sees: measured on simulated sweeps equal at their optimum, it says a false better / worse about
                twice as often as alpha (docs/comparing.md), so it is not the default.
    same        the lr chosen on the runs that judge it, with a warning.
    selection-aware  each arm's best lr shown, the words from a test over every lr of both grids that accounts
                for the choice (minillm.analysis.selection; rules version 3 labels the three above exploratory).
    auto        validation where the verdict reads the test loss, else same. With the words adjusted, both keep the
                family-wise rate of a false word at alpha on those simulated sweeps (a flatter arm gets most of it).

With one lr per value, or a given lr, nothing is chosen.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from minillm import schema
from minillm.analysis.rules import CHOICE_METRIC, LOSSES, CompareError
from minillm.analysis.runs import group_runs, label, sort_key
from minillm.outcome import failed_of, loss_for_comparison

MIN_SEEDS_PER_HALF = 2


def tuning_loss(record: Mapping, metric: str) -> float:
    """minillm.outcome's comparison loss of ``metric`` (of the final val loss for a metric not in nats); a failed
    run counts as a diverged one, ln V."""
    failed = bool(record.get("diverged")) or failed_of(record)
    return loss_for_comparison({**record, "diverged": failed}, key=metric if metric in LOSSES else CHOICE_METRIC)


def loss_by_lr(records: Sequence[Mapping], metric: str) -> dict[Any, float]:
    """lr -> mean tuning loss over the runs at that lr, in lr order."""
    return {key[0]: statistics.fmean(tuning_loss(r, metric) for r in rs)
            for key, rs in group_runs(records, ["lr"]).items()}


def same_lr(x: Any, y: Any) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, (int, float)) and math.isclose(x, y, rel_tol=1e-9))


def choose_lrs(by_value: Mapping[Any, Sequence[Mapping]], rule: str | float, metric: str,
               where: str = "") -> dict[Any, tuple[Any, dict[Any, float], list[str]]]:
    """value -> (its lr, its loss by lr, warnings) under ``rule``: tuned (each value's lowest mean tuning loss),
    common (the one lr every value ran with the lowest mean over the values of their mean loss; each value weighs
    the same) or a given lr. CompareError when a common lr or the given lr is missing."""
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
        pick = rule
        for v, g in grids.items():
            if not any(same_lr(x, rule) for x in g):
                raise CompareError("--lr", f"{label(rule)}: {label(v)} has no run at that lr{where} (its lrs: "
                                           f"{', '.join(label(x) for x in g)})")
    return {v: (next(x for x in g if same_lr(x, pick)), g, []) for v, g in grids.items()}


@dataclass
class Choice:
    """The lrs of one stratum's values and the runs each value enters the comparison with."""

    how: str  # one lr | given | cross-fit | validation | same data | selection-aware
    chosen_on: str | None  # the loss the lr was chosen on
    lrs: dict[Any, Any]  # value -> its lr (cross-fit: [first half's, second half's] when they differ)
    grids: dict[Any, dict[Any, float]]  # value -> loss by lr over every seed (the choice metric)
    runs: dict[Any, list[Mapping]]  # value -> the compared runs: each seed at the lr chosen for it
    warnings: dict[Any, list[str]] = field(default_factory=dict)  # value -> warnings (an lr at a grid edge)
    note: str | None = None  # for every comparison of the stratum (an lr chosen on the judging data)
    folds: list[dict] = field(default_factory=list)  # cross-fit: seeds chosen on, seeds judged, lrs

    def record(self) -> dict:
        """The choice as verdicts.json keeps it."""
        return {"how": self.how, "chosen_on": self.chosen_on,
                **({"folds": self.folds} if self.folds else {})}


def halves(seeds: Sequence[Any]) -> tuple[list, list]:
    """The seeds sorted and dealt alternately into two halves (reproducible, and balanced in number)."""
    ordered = sorted(seeds, key=sort_key)
    return ordered[0::2], ordered[1::2]


def _seeds(runs: Sequence[Mapping]) -> set:
    return {r.get("seed") for r in runs} - {None}


def choose(by_value: Mapping[Any, Sequence[Mapping]], rule: str | float, lr_choice: str, metric: str,
           where: str = "") -> Choice:
    """The lrs and compared runs of one stratum (module docstring); ``metric`` is the one the verdict reads."""
    one_lr = all(len(group_runs(rs, ["lr"])) == 1 for rs in by_value.values())
    if one_lr or not isinstance(rule, str):
        picked = choose_lrs(by_value, rule, metric, where)
        runs = {v: [r for r in rs if same_lr(r.get("lr"), picked[v][0])] for v, rs in by_value.items()}
        how = "one lr" if one_lr else "given"
        return Choice(how, None, {v: p[0] for v, p in picked.items()}, {v: p[1] for v, p in picked.items()}, runs,
                      {v: p[2] for v, p in picked.items()})
    first, second = halves(set().union(*(_seeds(rs) for rs in by_value.values())))
    can_cross = all(len(_seeds(rs) & set(half)) >= MIN_SEEDS_PER_HALF
                    for rs in by_value.values() for half in (first, second))
    if lr_choice == "crossfit" and not can_cross:
        raise CompareError("--lr-choice", f"crossfit needs {MIN_SEEDS_PER_HALF} seeds of every value in each half of "
                                          f"the seeds{where} ({', '.join(map(label, first))} | "
                                          f"{', '.join(map(label, second))}); allowed: auto, validation, same")
    how = lr_choice if lr_choice != "auto" else ("validation" if metric == schema.TEST_LOSS else "same")
    on_judged = how in ("same", "selection-aware")  # selection-aware: the best shown, the test over the grid
    chosen_on = CHOICE_METRIC if not on_judged and (metric == schema.TEST_LOSS or metric not in LOSSES) else (
        metric if metric in LOSSES else CHOICE_METRIC)
    everyone = choose_lrs(by_value, rule, chosen_on, where)
    lrs = {v: p[0] for v, p in everyone.items()}
    grids, warns = {v: p[1] for v, p in everyone.items()}, {v: p[2] for v, p in everyone.items()}
    if how == "selection-aware":
        runs = {v: [r for r in rs if same_lr(r.get("lr"), lrs[v])] for v, rs in by_value.items()}
        return Choice(how, chosen_on, lrs, grids, runs, warns)
    if how != "crossfit":
        runs = {v: [r for r in rs if same_lr(r.get("lr"), lrs[v])] for v, rs in by_value.items()}
        note = (f"the lr was chosen on the {chosen_on} of the runs whose {metric} judges the verdict: their own luck "
                "(init, data order) is in both, so a value with a flat loss-vs-lr curve is slightly favoured"
                if how == "validation" else
                f"the lr was chosen on the runs that judge the verdict ({chosen_on}): a value with a flat "
                "loss-vs-lr curve is slightly favoured")
        return Choice("same data" if how == "same" else how, chosen_on, lrs, grids, runs, warns, note)
    runs: dict[Any, list[Mapping]] = {v: [] for v in by_value}
    folds, per_half = [], {v: [] for v in by_value}
    for chosen_seeds, judged_seeds in ((first, second), (second, first)):
        subset = {v: [r for r in rs if r.get("seed") in chosen_seeds] for v, rs in by_value.items()}
        picked = choose_lrs(subset, rule, chosen_on, where)
        for v, rs in by_value.items():
            runs[v] += [r for r in rs if r.get("seed") in judged_seeds and same_lr(r.get("lr"), picked[v][0])]
            per_half[v].append(picked[v][0])
        folds.append({"chosen_on_seeds": list(chosen_seeds), "judged_seeds": list(judged_seeds),
                      "lrs": {label(v): p[0] for v, p in picked.items()}})
    shown = {v: (a if same_lr(a, b) else [a, b]) for v, (a, b) in per_half.items()}
    return Choice("cross-fit", chosen_on, shown, grids, runs, warns, None, folds)
