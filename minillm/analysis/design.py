"""The two-stage design of a comparison over an lr grid: a pilot chooses each arm's lr, fresh seeds judge it.

    minillm-plan plan.yaml --sweep NAME            records the plan (plan.json), prints the pilot's command
    minillm-train -m ... name=NAME ...             the pilot: the family x lr_grid x pilot_seeds
    minillm-plan freeze --sweep NAME PILOT         fixes each value's lr and the judged seeds; prints their commands
    minillm-train -m ... name=NAME ...             the judged runs: each value at its frozen lr, the judged seeds
    minillm-report logs/NAME --plan                verifies the design, then the verdicts

Why two stages: an lr chosen on the runs whose loss then judges the arms rewards the arm whose runs were lucky at
one lr (a run's luck is in its val and its test loss alike), the more so the flatter its loss-vs-lr curve. Chosen
on a pilot's seeds and judged on other seeds, the choice reads none of the judging runs' luck: the verdict is about
each arm at the lr the pilot chose (its estimand), and keeps alpha.

The freeze (``freeze``) chooses each value's lr on the pilot's final val loss (minillm.analysis.lr_choice; a failed
run at ln V), records the pilot's paired spread (sd of the arm - baseline differences at the chosen lrs, and its
upper confidence bound) and the judged seeds the margin needs: enough for 80% power of the test of no difference
when the true difference is ±margin and of the equivalence test when it is 0, at the family's level, from the upper
bound of the spread (minillm.analysis.stats.seeds_to_plan; never from the observed difference). The pilot-size rule:
each chosen lr should beat its grid neighbours by 2 standard errors of the pilot, else a warning says how many pilot
seeds would. ``judge`` verifies the judged runs against the frozen design (design_check).
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from minillm.analysis.exact import pairs_for_margin, sd_upper
from minillm.analysis.lr_choice import choose_lrs, same_lr, tuning_loss
from minillm.analysis.plan_record import PlanError, current, number, parse_time, utc_now
from minillm.analysis.rules import CHOICE_METRIC, failed
from minillm.analysis.runs import label
from minillm.analysis.stats import PLAN_POWER, PLAN_SD_CONFIDENCE
from minillm.analysis.strata import matches, resolve_metric
from minillm.outcome import is_number

DESIGNS = ("two-stage", "single-stage")
FIELDS = ("design", "arms", "lr_grid", "pilot_seeds", "overrides", "factor_override")
REQUIRED = ("arms", "lr_grid", "pilot_seeds", "margin")  # margin: no default under two-stage
NOT_TWO_STAGE = ("lr", "lr_choice", "stability")  # the pilot fixes each lr; stability needs the whole grid judged
LR_OVERRIDE = "optimizer.lr"  # train.py's override of the learning rate
MIN_JUDGED = 3  # a verdict from fewer pairs is not informative (minillm.analysis.compare.MIN_PAIRS)
STANDARD_ERRORS = 2.0  # the pilot-size rule: a chosen lr beats its neighbours by this many standard errors


def default_design(version: int) -> str:
    """A plan that names no design: two-stage from rules version 3 on, single-stage before."""
    return DESIGNS[0] if version >= 3 else DESIGNS[1]


def _seed_list(value: Any, least: int) -> bool:
    return (isinstance(value, list) and len(value) >= least and len(set(value)) == len(value)
            and all(isinstance(s, int) and not isinstance(s, bool) for s in value))


def check_fields(raw: Mapping, plan: dict, source: str, bad: Callable[[str, str], PlanError]) -> None:
    """Check the design's fields of a parsed plan (``plan``, from the YAML mapping ``raw``) and normalise them."""
    if plan["design"] not in DESIGNS:
        raise bad("design", " | ".join(DESIGNS))
    if plan["design"] == "single-stage":
        given = [f for f in FIELDS[1:] if f in raw]
        if given:
            raise PlanError(f"{source}: {', '.join(given)} only belong to design: two-stage; allowed with design: "
                            "single-stage: the rules of minillm.analysis.rules.Rules")
        return
    missing = [f for f in REQUIRED if raw.get(f) in (None, "", [], {})]
    if missing:
        raise PlanError(f"{source}: {', '.join(missing)} missing; design two-stage (the default) needs arms, lr_grid, "
                        "pilot_seeds and margin (no default: the smallest difference that matters), or design: "
                        "single-stage")
    fixed = [f for f in NOT_TWO_STAGE if f in raw]
    if fixed:
        raise PlanError(f"{source}: {', '.join(fixed)} is invalid under design two-stage (the pilot fixes each arm's "
                        "lr; stability needs the whole grid judged); allowed: design: single-stage")
    arms = raw["arms"]
    if (not isinstance(arms, list) or any(isinstance(a, (dict, list)) or a is None for a in arms)
            or len({label(a) for a in arms}) != len(arms) or plan["baseline"] in {label(a) for a in arms}):
        raise bad("arms", "a list of distinct values of the factor, the baseline not among them")
    plan["arms"] = [label(a) for a in arms]
    grid = raw["lr_grid"]
    lrs = [number(x) for x in grid] if isinstance(grid, list) else []
    if len(lrs) < 2 or any(x is None or x <= 0 for x in lrs) or len(set(lrs)) != len(lrs):
        raise bad("lr_grid", "a list of 2 or more distinct learning rates > 0")
    plan["lr_grid"] = sorted(lrs)
    if not _seed_list(raw["pilot_seeds"], 2):
        raise bad("pilot_seeds", "a list of 2 or more distinct integers")
    shared = sorted(set(raw["pilot_seeds"]) & set(plan["seeds"]))
    if shared:
        raise PlanError(f"{source}: seeds={plan['seeds']} and pilot_seeds={raw['pilot_seeds']} share "
                        f"{', '.join(map(str, shared))}; allowed: judged seeds disjoint from the pilot's")
    if set(plan["expected"]) != set(plan["arms"]):
        raise bad("expected", f"a word for each arm of arms ({', '.join(plan['arms'])}): better | worse | equivalent")
    overrides = plan.setdefault("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise bad("overrides", "a list of train.py overrides (key=value), e.g. [experiment=cpu_study]")
    plan.setdefault("factor_override", plan["factor"])
    if not isinstance(plan["factor_override"], str) or not plan["factor_override"]:
        raise bad("factor_override", "the train.py override that sets the factor (default: the factor)")


def train_command(plan: Mapping, sweep: str, values: Sequence[str], lrs: Sequence[float], seeds: Sequence[int]) -> str:
    """The multirun of ``values`` x ``lrs`` x ``seeds`` in the plan's sweep, quoted for a POSIX shell (minillm-train:
    the same as python train.py, from any folder; the runs go to logs/NAME under it)."""
    words = ["minillm-train", "-m", *plan["overrides"], f"name={sweep}",
             f"{plan['factor_override']}={','.join(values)}", f"{LR_OVERRIDE}={','.join(map(label, lrs))}",
             f"seed={','.join(map(str, seeds))}"]
    return " ".join(shlex.quote(w) for w in words)


def pilot_command(plan: Mapping, sweep: str) -> str:
    return train_command(plan, sweep, [plan["baseline"], *plan["arms"]], plan["lr_grid"], plan["pilot_seeds"])


def family(plan: Mapping) -> list[str]:
    """The baseline and the arms, as the plan names them."""
    return [plan["baseline"], *plan["arms"]]


def value_label(record: Mapping, plan: Mapping) -> str | None:
    """The family member a run is of (as the plan names it), or None."""
    return next((v for v in family(plan) if matches(record.get(plan["factor"]), v)), None)


def _lr_margins(runs: Sequence[Mapping], chosen: float, grid: Sequence[float]) -> list[dict]:
    """How far the chosen lr beats each grid neighbour on the pilot: the mean per-seed gap of the final val loss
    (a failed run at ln V), its standard error, and whether it is STANDARD_ERRORS of them."""
    def by_seed(lr: float) -> dict:
        return {r.get("seed"): tuning_loss(r, CHOICE_METRIC) for r in runs if same_lr(r.get("lr"), lr)}

    at, out = by_seed(chosen), []
    i = next(j for j, x in enumerate(grid) if same_lr(x, chosen))
    for j in (i - 1, i + 1):
        if not 0 <= j < len(grid):
            continue
        other = by_seed(grid[j])
        gaps = [other[s] - at[s] for s in sorted(at.keys() & other.keys(), key=str)]
        gap = statistics.fmean(gaps) if gaps else None
        sd = statistics.stdev(gaps) if len(gaps) > 1 else None
        se = None if sd is None else sd / math.sqrt(len(gaps))
        enough = gap is not None and se is not None and gap > 0 and gap >= STANDARD_ERRORS * se
        need = math.ceil((STANDARD_ERRORS * sd / gap) ** 2) if sd and gap and gap > 0 else None
        out.append({"lr": grid[j], "gap": gap, "se": se, "seeds": len(gaps), "enough": enough,
                    "pilot_seeds_needed": None if enough else need})
    return out


def _size_warning(value: str, chosen: float, margins: Sequence[dict]) -> str | None:
    short = [m for m in margins if not m["enough"]]
    if not short:
        return None
    m = min(short, key=lambda m: -1.0 if m["gap"] is None or m["gap"] <= 0 else m["gap"] / (m["se"] or math.inf))
    if m["gap"] is None or m["gap"] <= 0 or m["se"] is None:
        return (f"the pilot is too small to choose the lr of {value}: {label(chosen)} ties with its neighbour "
                f"{label(m['lr'])} over {m['seeds']} seed(s), so no pilot size tells them apart; the judged verdict "
                "is about the lr the pilot chose")
    need = max(m["pilot_seeds_needed"] or 0, m["seeds"] + 1)
    return (f"the pilot is too small to choose the lr of {value}: {label(chosen)} beats its neighbour "
            f"{label(m['lr'])} by {m['gap']:.4f} nats, {m['gap'] / m['se']:.1f} standard errors of its {m['seeds']} "
            f"seeds (fewer than {STANDARD_ERRORS:g}); about {need} pilot seeds would do")


def _spread(plan: Mapping, trained: Mapping[str, Mapping], arm: str, tests: int) -> dict:
    """The pilot's paired spread of arm - baseline at the chosen lrs, over the seeds whose runs trained in both (a
    failure is the failure test's, not a spread), and the judged pairs it asks for (exact.pairs_for_margin: both
    ways at the fixed margin, at alpha / tests, from the spread's upper bound, never the observed difference)."""
    base = trained[plan["baseline"]]
    seeds = sorted(trained[arm].keys() & base.keys())
    diffs = [trained[arm][s] - base[s] for s in seeds]
    n = len(diffs)
    sd = statistics.stdev(diffs) if n > 1 else None
    need = pairs_for_margin(sd, n, plan["margin"], plan["alpha"], PLAN_POWER, tests, PLAN_SD_CONFIDENCE)
    return {"pairs": n, "sd": sd, "sd_upper": None if sd is None else sd_upper(sd, n, PLAN_SD_CONFIDENCE),
            "confidence": PLAN_SD_CONFIDENCE, "seeds_needed": need}


def freeze(record: Mapping, records: Sequence[Mapping], pilot_dirs: Sequence[str | Path], path: str | Path,
           neighbours: bool = False) -> dict:
    """The freeze stage of a two-stage plan's current version from its pilot's runs (the module docstring)."""
    plan_stage, frozen = current(record)
    plan, sweep = plan_stage["plan"], record.get("sweep") or plan_stage.get("sweep")
    if plan.get("design") != DESIGNS[0]:
        raise PlanError(f"{path}: its plan is design {plan.get('design', 'single-stage')}; only a two-stage plan is "
                        "frozen")
    if frozen is not None:
        raise PlanError(f"{path}: version {plan_stage['version']} was frozen at {frozen['frozen_at']}; a design is "
                        f"frozen once: record a new version (minillm-plan PLAN.yaml --sweep {sweep} --force)")
    grid, where = plan["lr_grid"], ", ".join(map(str, pilot_dirs))
    runs = [r for r in records if r.get("seed") in plan["pilot_seeds"] and value_label(r, plan) is not None
            and any(same_lr(r.get("lr"), x) for x in grid)]
    names = sorted({str(r.get("name")) for r in runs} - {sweep})
    if names:
        raise PlanError(f"{where}: pilot runs of sweep {', '.join(names)}; allowed: runs of the plan's sweep {sweep} "
                        f"(train.py's name={sweep})")
    by_value = {v: [r for r in runs if value_label(r, plan) == v] for v in family(plan)}
    lacking = [f"{v} at lr {', '.join(label(x) for x in grid if not any(same_lr(r.get('lr'), x) for r in rs))}"
               for v, rs in by_value.items() if not all(any(same_lr(r.get("lr"), x) for r in rs) for x in grid)]
    if lacking:
        raise PlanError(f"{where}: the pilot has no run of {'; '.join(lacking)}; allowed: a pilot of every value of "
                        f"{', '.join(family(plan))} at every lr of lr_grid (seeds {plan['pilot_seeds']})")
    picked = choose_lrs(by_value, "tuned", CHOICE_METRIC)  # value -> (its lr, its loss by lr, warnings)
    chosen = {v: p[0] for v, p in picked.items()}
    metric, _ = resolve_metric([r for v, rs in by_value.items() for r in rs if same_lr(r.get("lr"), chosen[v])],
                               plan["metric"])
    trained = {v: {r.get("seed"): float(r[metric]) for r in rs if same_lr(r.get("lr"), chosen[v]) and not failed(r)
                   and is_number(r.get(metric))} for v, rs in by_value.items()}
    # the report's family: a loss test and a failure test per arm (minillm.analysis.family)
    tests = 2 * len(plan["arms"]) if plan["adjust"] == "holm" else 1
    spread = {arm: _spread(plan, trained, arm, tests) for arm in plan["arms"]}
    margins = {v: _lr_margins(rs, chosen[v], grid) for v, rs in by_value.items()}
    warnings = [w for v in by_value if (w := _size_warning(v, chosen[v], margins[v]))]
    needs = [s["seeds_needed"] for s in spread.values()]
    need = None if None in needs else max([MIN_JUDGED, *needs])
    if need is None:
        warnings.append("the pilot's spread gives no number of judged seeds (fewer than 2 pairs that trained, or "
                        "more than 10,000): the plan's seeds are all judged")
    judged = plan["seeds"][:need] if need is not None else list(plan["seeds"])
    if need is not None and need > len(plan["seeds"]):
        warnings.append(f"the margin needs {need} judged seeds and the plan lists {len(plan['seeds'])}: the verdicts "
                        "will have less than the planned power (list more seeds in a new version, --force)")
    recorded = parse_time(plan_stage["recorded_at"])
    early = [str(r.get("run_dir")) for r in runs if (t := parse_time(r.get("started_at"))) and recorded
             and t < recorded]
    if early:
        warnings.append(f"{len(early)} pilot run(s) started before the plan was recorded")
    place = {v: next(i for i, x in enumerate(grid) if same_lr(x, lr)) for v, lr in chosen.items()}
    near = {v: grid[max(i - 1, 0):i + 2] for v, i in place.items()} if neighbours else None
    if neighbours:
        warnings.append("--neighbours: the judged runs at the neighbouring lrs are part of the design, but no test "
                        "reads them yet (each value is judged at its chosen lr): they cost runs for a later analysis")
    commands = [train_command(plan, sweep, [v], near[v] if near else [chosen[v]], judged) for v in chosen]
    return {"stage": "freeze", "version": plan_stage["version"], "frozen_at": utc_now(),
            "pilot_dirs": [str(d) for d in pilot_dirs], "pilot_runs": len(runs),
            "pilot_runs_left_out": len(records) - len(runs), "metric": metric, "lrs": chosen, "neighbours": near,
            "loss_by_lr": {v: {label(lr): loss for lr, loss in p[1].items()} for v, p in picked.items()},
            "lr_margins": margins, "spread": spread, "power": PLAN_POWER, "tests": tests, "seeds_needed": need,
            "judged_seeds": judged, "commands": commands, "warnings": warnings}
