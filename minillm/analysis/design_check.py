"""A two-stage comparison's judged runs checked against its frozen design (minillm.analysis.design).

The runs a report reads are the pilot's (a pilot seed, started before the freeze: left out) and the judged ones.
The design holds when the runs are of the plan's sweep (summary.json's name), the values of the factor are exactly
the family (the baseline and the arms), every judged run's (value, lr, seed) is in the frozen design (its frozen lr,
or a recorded neighbour; a judged seed), no pilot seed is judged, and every judged run started after the freeze. A
breach is not a warning only: each verdict it touches (a breach of its arm, of the baseline, or of the whole sweep)
is marked not pre-registered. The verdicts compare each value at its frozen lr on the judged seeds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from minillm.analysis.compare import some
from minillm.analysis.design import family, value_label
from minillm.analysis.lr_choice import same_lr
from minillm.analysis.plan_record import PlanError, parse_time
from minillm.analysis.runs import label


def _why(r: Mapping, plan: Mapping, frozen: Mapping, sweep: str, value: str | None) -> list[str]:
    """What puts one judged run outside the frozen design (nothing when it is inside)."""
    why = []
    if r.get("name") != sweep:
        why.append(f"are not of the plan's sweep {sweep} (summary.json's name {label(r.get('name'))})")
    if value is None:
        why.append(f"are of {plan['factor']}={label(r.get(plan['factor']))}, not of the family "
                   f"{', '.join(family(plan))}")
        return why
    seed = r.get("seed")
    if seed in plan["pilot_seeds"]:
        why.append("judge a pilot seed (started after the freeze)")
    elif seed not in frozen["judged_seeds"]:
        why.append(f"are of seed(s) outside the frozen judged seeds {frozen['judged_seeds']}")
    allowed = (frozen.get("neighbours") or {}).get(value) or [frozen["lrs"][value]]
    if not any(same_lr(r.get("lr"), x) for x in allowed):
        why.append(f"ran at an lr not frozen for {value} ({', '.join(map(label, allowed))})")
    started, at = parse_time(r.get("started_at")), parse_time(frozen["frozen_at"])
    if started is None:
        why.append("have no start time: after the freeze cannot be checked")
    elif at is not None and started < at:
        why.append(f"started before the design was frozen ({frozen['frozen_at']})")
    return why


def judge(plan: Mapping, frozen: Mapping | None, records: Sequence[Mapping], sweep: str,
          path: Any) -> tuple[list[dict], dict]:
    """(the runs compared: each value at its frozen lr on the judged seeds, the design's facts: breaches as
    {arm, message} with arm None for the whole sweep, the pilot runs left out, the estimand)."""
    if frozen is None:
        raise PlanError(f"{path}: the two-stage plan is not frozen: run 'minillm-plan freeze --sweep {sweep} "
                        "<pilot folder>' after the pilot, then the judged runs")
    at = parse_time(frozen["frozen_at"])
    pilot, judged = [], []
    for r in records:
        started = parse_time(r.get("started_at"))
        is_pilot = r.get("seed") in plan["pilot_seeds"] and (started is None or at is None or started < at)
        (pilot if is_pilot else judged).append(r)
    breached: dict[tuple[str | None, str], list[str]] = defaultdict(list)
    seen = set()
    for r in judged:
        value = value_label(r, plan)
        seen.add(value)
        for why in _why(r, plan, frozen, sweep, value):
            breached[(value if value is not None and "sweep" not in why else None, why)].append(str(r.get("run_dir")))
    for value in family(plan):
        if value not in seen:
            breached[(value, f"no judged run of {value}: the family is {', '.join(family(plan))}")] = []
    breaches = [{"arm": arm, "message": f"{len(dirs)} judged run(s) {why}: {some(sorted(dirs))}" if dirs else why}
                for (arm, why), dirs in breached.items()]
    kept = [r for r in judged if (v := value_label(r, plan)) is not None and r.get("seed") in frozen["judged_seeds"]
            and same_lr(r.get("lr"), frozen["lrs"][v])]
    n = len(plan["pilot_seeds"])
    facts = {"design": "two-stage", "frozen_at": frozen["frozen_at"], "pilot_seeds": plan["pilot_seeds"],
             "judged_seeds": frozen["judged_seeds"], "lrs": frozen["lrs"], "neighbours": frozen.get("neighbours"),
             "pilot_runs": sorted(str(r.get("run_dir")) for r in pilot), "breaches": breaches,
             "estimand": f"each arm at the lr a {n}-seed pilot chose", "seeds": frozen["judged_seeds"]}
    return kept, facts


def mark(result: dict, facts: Mapping) -> None:
    """Each comparison of a two-stage plan: pre-registered or not (its breaches as warnings), its estimand, and
    how its lr was chosen."""
    base = label(result["baseline"])
    for c in result["comparisons"]:
        arms = {label(c["arm"]), label(c.get("arm_value", c["arm"]))}  # an option variant breaches with its value
        mine = [b["message"] for b in facts["breaches"] if b["arm"] in (None, base, *arms)]
        c["preregistered"] = not mine
        if mine:  # a word outside the frozen design neither meets nor misses the plan's expectation
            c["as_expected"] = None
        c["estimand"] = facts["estimand"]
        c["lr_choice"] = {"how": "pilot", "chosen_on": f"final_val_loss of pilot seeds "
                                                      f"{', '.join(map(str, facts['pilot_seeds']))}"}
        c["warnings"] = [*c["warnings"], *(f"not pre-registered: {m}" for m in mine)]


def report_text(plan: Mapping) -> str:
    """verdicts.md's words on the plan version that graded the verdicts and, two-stage, its design and breaches."""
    if "version" not in plan:
        return ""
    text = (f" Graded by version {plan['version']} of {plan['versions']} ({plan['stage']} stage, sha256 "
            f"{plan['stage_sha256'][:12]}).")
    if plan.get("design") == "two-stage":
        lrs = ", ".join(f"{v} {label(lr)}" for v, lr in plan["lrs"].items())
        text += (f" Two-stage design: {plan['estimand']} (pilot seeds {', '.join(map(str, plan['pilot_seeds']))}; "
                 f"lrs {lrs}), frozen {plan['frozen_at']}; judged seeds {', '.join(map(str, plan['judged_seeds']))};"
                 f" pilot runs left out: {len(plan['pilot_runs'])}; breaches of the design: {len(plan['breaches'])}"
                 + (" (the verdicts they touch are **not pre-registered**)" if plan["breaches"] else "") + ".")
    return text
