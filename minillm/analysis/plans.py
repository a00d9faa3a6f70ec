"""Pre-registration: a comparison's rules recorded before its sweep runs, and a sweep graded against them.

    minillm-plan PLAN.yaml --sweep NAME [--logs logs] [--force]    records logs/NAME/plan.json
    minillm-plan freeze --sweep NAME PILOT [--neighbours]          two-stage: fixes each value's lr from the pilot
    minillm-report logs/NAME --plan                                grades the sweep by the recorded rules

PLAN.yaml holds the question (FIELDS; factor, baseline, seeds and expected are required):

    question: Is RMSNorm as good as LayerNorm?    # free text, optional
    design: two-stage             # default: a pilot chooses each lr, fresh seeds judge (minillm.analysis.design)
    factor: norm
    baseline: layernorm
    arms: [rmsnorm]               # two-stage: the family's arms
    lr_grid: [1e-3, 3e-3, 1e-2]   # two-stage: the lrs the pilot runs
    pilot_seeds: [0, 1, 2]        # two-stage: the pilot's seeds, disjoint from seeds
    seeds: [10, 11, 12, 13, 14, 15, 16, 17]   # the judged seeds (two-stage: the freeze takes as many as it needs)
    margin: 0.02                  # in the metric's units; no default under two-stage
    alpha: 0.05                   # default: the family-wise error of the words
    metric: auto                  # default: test_loss, else final_val_loss; higher_is_better: false
    expected: {rmsnorm: equivalent}   # per arm: better | worse | equivalent
    # single-stage: lr (tuned | common | a learning rate) and any other rule of minillm.analysis.rules.Rules

plan.json (minillm.analysis.plan_record) keeps every stage: the validated plan, the YAML's text, its sha256, the UTC
time it was recorded and the rules version; the freeze; each --force a new version, the old ones kept, each stage
hash-chained to the one before. Grading takes the rules of the current version's recorded text (whatever the
command line or the YAML file now say; a field the text leaves out takes the default of the recorded rules version,
so a plan recorded before the versions is graded by the rules of its time), leaves out runs of seeds the plan did not
list, and records: the plan's hash, whether the YAML file changed since (its sha256 differs), whether plan.json
itself still matches its hash, the runs whose ``started_at`` precedes the recording (a warning on each verdict they
enter), planned seeds an arm lacks, and whether each verdict is the one expected. A two-stage plan is graded on its
judged runs after its design is verified (minillm.analysis.design_check).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from minillm.analysis import design, design_check, plan_record
from minillm.analysis.plan_record import PlanError, number, parse_time, sha256, utc_now
from minillm.analysis.rules import LR_RULES, OPTIONS, REGISTERED_BEFORE, VERSION, VERSIONS, CompareError, Rules
from minillm.analysis.runs import RunsError, label, load_runs, records_of
from minillm.analysis.strata import matches
from minillm.errors import ArgumentParser
from minillm.files import write_json

# the rules a plan may fix, with the engine's defaults (minillm.analysis.rules.Rules); a plan recorded before the rules
# had a version is graded with the rules of that time (REGISTERED_BEFORE) for every field its text does not set
PLAN_RULES = ("metric", "higher_is_better", "margin", "alpha", "lr", "lr_choice", "failures", "adjust", "equivalence",
              "paired_by", "interval", "window_error", "stability", "tolerance", "range_margin", "rate_margin")
DEFAULTS = {name: getattr(Rules(), name) for name in PLAN_RULES}
RULES_VERSION = VERSION  # plan.json's rules_version (minillm.analysis.rules.VERSION); none: the rules before 2
REQUIRED = ("factor", "baseline", "seeds", "expected")
FIELDS = ("question", *REQUIRED, *DEFAULTS, *design.FIELDS)
EXPECTED = ("better", "worse", "equivalent")
RULES = ("factor", "baseline", *DEFAULTS)  # what compare() takes from a plan
NUMBERS = ("margin", "alpha", "tolerance", "range_margin", "rate_margin")
FLAGS = ("higher_is_better", "window_error", "stability")
BEFORE = "started before the plan was recorded"
__all__ = ["PlanError", "grade", "apply", "parse_plan", "record_plan", "freeze_plan", "read_record", "main"]


def parse_plan(text: str, source: str = "plan", defaults: Mapping[str, Any] = DEFAULTS,
               version: int = RULES_VERSION, designs: bool = True) -> dict:
    """The plan of a YAML text, checked and with ``defaults`` filled in; PlanError naming the field otherwise.
    From rules version 3 on the plan names its design (two-stage unless it says single-stage); ``designs`` False:
    a plan recorded before the designs (single-stage, without the field)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PlanError(f"{source}: not valid YAML ({' '.join(str(err).split())})") from None
    if not isinstance(raw, dict):
        raise PlanError(f"{source}: a plan is a mapping of {', '.join(FIELDS)}")

    def bad(field: str, allowed: str) -> PlanError:
        return PlanError(f"{source}: {field}={raw.get(field)!r} is invalid; allowed: {allowed}")

    designs = designs and version >= 3
    fields = FIELDS if designs else FIELDS[:-len(design.FIELDS)]
    unknown = sorted(set(map(str, raw)) - set(fields))
    if unknown:
        raise PlanError(f"{source}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(fields)}")
    missing = [f for f in REQUIRED if raw.get(f) in (None, "", [], {})]
    if missing:
        raise PlanError(f"{source}: {', '.join(missing)} missing; a plan needs {', '.join(REQUIRED)}")
    plan = {**defaults, **raw}
    for field in ("factor", "metric"):
        if not isinstance(plan[field], str):
            raise bad(field, "a key of summary.json")
    if isinstance(plan["baseline"], (dict, list)):
        raise bad("baseline", "one value of the factor")
    plan["baseline"] = label(plan["baseline"])
    for field in FLAGS:
        if not isinstance(plan[field], bool):
            raise bad(field, "true or false")
    for field in NUMBERS:
        value = number(plan[field])
        plan[field] = value if value is not None else plan[field]
    if plan["lr"] not in LR_RULES:
        lr = number(plan["lr"])
        plan["lr"] = lr if lr is not None else plan["lr"]
    try:
        Rules(**{k: plan[k] for k in RULES}).check()
    except CompareError as err:
        field = next(k for k, option in OPTIONS.items() if option == err.option)
        raise bad(field, str(err).split("allowed: ", 1)[-1]) from None
    seeds = plan["seeds"]
    if (not isinstance(seeds, list) or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds)
            or len(set(seeds)) != len(seeds)):
        raise bad("seeds", "a list of distinct integers")
    expected = plan["expected"]
    if not isinstance(expected, dict) or any(v not in EXPECTED for v in expected.values()):
        raise bad("expected", f"a mapping of arm -> {' | '.join(EXPECTED)}")
    plan["expected"] = {label(k): v for k, v in expected.items()}
    if "question" in plan and not isinstance(plan["question"], str):
        raise bad("question", "text")
    if designs:
        plan["design"] = plan.get("design", design.default_design(version))
        design.check_fields(raw, plan, source, bad)
    return plan


# the defaults of rules version 2, frozen: a plan recorded under it is graded by them, whatever today's defaults
DEFAULTS_V2 = {"metric": "auto", "higher_is_better": False, "margin": 0.02, "alpha": 0.05, "lr": "tuned",
               "lr_choice": "auto", "failures": "penalize", "adjust": "holm", "equivalence": "tost",
               "paired_by": "auto", "interval": "t", "window_error": False, "stability": False, "tolerance": 0.1,
               "range_margin": 0.25, "rate_margin": 0.1}


def recorded_defaults(record: Mapping) -> dict[str, Any]:
    """The defaults a recorded plan is graded with: those of the rules version it was recorded under (before
    versions: REGISTERED_BEFORE over version 2's)."""
    version = record.get("rules_version")
    if version in VERSIONS and version >= 3:  # version 4 changed no default of version 3
        return DEFAULTS
    if version == 2:
        return DEFAULTS_V2
    return {**DEFAULTS_V2, **{k: v for k, v in REGISTERED_BEFORE.items() if k in DEFAULTS_V2}}


def recorded_version(record: Mapping) -> int:
    """The rules version a recorded plan is graded by: the one it was recorded under (2 before versions)."""
    version = record.get("rules_version")
    return version if isinstance(version, int) else 2


def record_plan(plan_file: str | Path, sweep: str, logs: str | Path = "logs", force: bool = False) -> Path:
    """Check PLAN.yaml and record it in ``<logs>/<sweep>/plan.json``; a plan already there is kept and this one
    appended as its next version only with ``force``."""
    plan_file = Path(plan_file)
    if not plan_file.is_file():
        raise PlanError(f"{plan_file}: no such file")
    if not sweep or "/" in sweep or sweep in (".", ".."):
        raise PlanError(f"--sweep {sweep!r} is invalid; allowed: the sweep's name (train.py's name=...)")
    data = plan_file.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise PlanError(f"{plan_file}: not UTF-8 text") from None
    plan = parse_plan(text, str(plan_file))
    path = Path(logs) / sweep / "plan.json"
    before = read_record(path) if path.exists() else None
    if before is not None and not force:
        raise PlanError(f"{path} already holds a plan (recorded {plan_record.current(before)[0].get('recorded_at')});"
                        " a plan is recorded once, before its runs: pass --force to record a new version (the old "
                        "ones are kept)")
    version = 1 + max((s.get("version", 1) for s in plan_record.stages_of(before)), default=0) if before else 1
    stage = {"stage": "plan", "version": version, "sweep": sweep, "plan": plan, "plan_file": str(plan_file.resolve()),
             "plan_sha256": sha256(data), "recorded_at": utc_now(), "plan_text": text, "rules_version": RULES_VERSION}
    return write_json(path, plan_record.append(before, sweep, stage))


def freeze_plan(sweep: str, pilot_dirs: Sequence[str | Path], logs: str | Path = "logs",
                neighbours: bool = False) -> tuple[Path, dict]:
    """Append the freeze stage of ``<logs>/<sweep>/plan.json``'s two-stage plan from the pilot runs under
    ``pilot_dirs`` (minillm.analysis.design.freeze); (plan.json, the stage)."""
    path = Path(logs) / sweep / "plan.json"
    if not path.is_file():
        raise PlanError(f"{path}: no plan recorded; record one first: minillm-plan PLAN.yaml --sweep {sweep}")
    record = read_record(path)
    try:
        records = records_of(load_runs(pilot_dirs))
    except (FileNotFoundError, RunsError) as err:
        raise PlanError(f"pilot: {err}") from None
    stage = design.freeze(record, records, pilot_dirs, path, neighbours)
    write_json(path, plan_record.append(record, sweep, stage))
    return path, stage


def read_record(path: str | Path) -> dict:
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise PlanError(f"{path}: not a readable plan.json ({err})") from None
    return plan_record.check(record, path)


def find_record(sweep_dirs: Sequence[str | Path], given: str | None = None) -> Path:
    """plan.json: the given path (a file or a folder holding it), else the first in a sweep folder or above it
    (logs/<name>/plan.json for logs/<name>/multiruns/<id>)."""
    if given and given != "auto":
        path = Path(given)
        path = path / "plan.json" if path.is_dir() else path
        if not path.is_file():
            raise PlanError(f"--plan: {path} does not exist")
        return path
    for folder in map(Path, sweep_dirs):
        for candidate in dict.fromkeys([folder, *list(folder.parents)[:3], *list(folder.resolve().parents)[:3]]):
            if (candidate / "plan.json").is_file():
                return candidate / "plan.json"
    raise PlanError("--plan: no plan.json in the sweep folder or the 3 folders above it; record one with "
                    "'minillm-plan PLAN.yaml --sweep NAME' before the runs, or give its path")


def grade(record: Mapping, records: Sequence[Mapping], path: str | Path = "plan.json") -> tuple[dict, list, Any, dict]:
    """(the compare() rules of the recorded plan's current version, the runs it judges, a run_check that flags runs
    started before the plan, the plan's facts for the report)."""
    stage, frozen = plan_record.current(record)
    version = recorded_version(stage)
    plan = parse_plan(stage["plan_text"], f"{path} (its recorded plan)", recorded_defaults(stage), version,
                      designs=plan_record.staged(record))
    recorded = parse_time(stage["recorded_at"])
    plan_file = Path(stage.get("plan_file") or "")
    now = sha256(plan_file.read_bytes()) if plan_file.is_file() else None

    def before(r: Mapping) -> bool:
        started = parse_time(r.get("started_at"))
        return started is not None and recorded is not None and started < recorded

    info = {"path": str(path), "plan_hash": stage["plan_sha256"], "recorded_at": stage["recorded_at"],
            "plan_file": str(plan_file), "plan_file_changed": None if now is None else now != stage["plan_sha256"],
            "plan_record_intact": sha256(stage["plan_text"]) == stage["plan_sha256"]
            and stage.get("plan") == plan and plan_record.chain_intact(record), "question": plan.get("question"),
            "seeds": plan["seeds"], "expected": plan["expected"],
            "runs_before_plan": sorted(str(r.get("run_dir")) for r in records if before(r)),
            "runs_without_start_time": sorted(str(r.get("run_dir")) for r in records
                                              if parse_time(r.get("started_at")) is None),
            "unplanned_runs": sorted(str(r.get("run_dir")) for r in records if r.get("seed") not in plan["seeds"])}
    info["all_runs_after_plan"] = not info["runs_before_plan"] and not info["runs_without_start_time"]
    if plan_record.staged(record):  # which version graded it, and that stage's hash
        graded_by = frozen or stage
        info.update(version=stage["version"], versions=sum(s.get("stage") == "plan" for s in record["stages"]),
                    stage=graded_by["stage"], stage_sha256=plan_record.stage_sha256(graded_by))
    rules = {**{k: plan[k] for k in RULES}, "version": version}
    if plan.get("design") == design.DESIGNS[0]:
        kept, facts = design_check.judge(plan, frozen, records, record.get("sweep") or stage.get("sweep"), path)
        info.update(facts, unplanned_runs=sorted(str(r.get("run_dir")) for r in records
                                                 if r.get("seed") not in [*plan["seeds"], *plan["pilot_seeds"]]))
        return rules, kept, None, info
    kept = [r for r in records if r.get("seed") in plan["seeds"]]
    return rules, kept, (lambda r: BEFORE if before(r) else None), info


def apply(result: dict, info: Mapping) -> dict:
    """Add the plan's facts to a compare() result: per comparison plan_hash, expected, as_expected and warnings
    for a changed plan and missing planned seeds; under a two-stage design whether it is pre-registered."""
    result["plan"] = dict(info)
    result["plan_hash"] = info["plan_hash"]
    shared = []
    if info["plan_file_changed"]:
        shared.append(f"the plan file {info['plan_file']} changed after the plan was recorded: graded by the "
                      "recorded rules")
    if info["plan_file_changed"] is None:
        shared.append(f"the plan file {info['plan_file']} is gone: it cannot be checked against the record")
    if not info["plan_record_intact"]:
        shared.append(f"{info['path']} was edited: its plan does not match its hash")
    seen = set()
    for c in result["comparisons"]:
        names = [c["arm"], *([c["arm_value"]] if "arm_value" in c else [])]  # an option variant: its value's word
        named = [k for k in info["expected"] if any(matches(name, k) for name in names)]
        expected = next((info["expected"][k] for k in named if matches(c["arm"], k)),
                        info["expected"][named[0]] if named else None)
        seen |= set(named)
        missing = [f"{who} lacks planned seeds {', '.join(map(str, s))}" for who, s in (
            ("the arm", sorted(set(info["seeds"]) - set(c["arm_seeds"]))),
            ("the baseline", sorted(set(info["seeds"]) - set(c["baseline_seeds"])))) if s]
        c.update(plan_hash=info["plan_hash"], expected=expected,
                 as_expected=None if expected is None else c["verdict"] == expected)
        c["warnings"] = [*c["warnings"], *shared, *missing]
    result["plan"]["expected_without_runs"] = sorted(set(info["expected"]) - seen)
    if info.get("design") == design.DESIGNS[0]:
        design_check.mark(result, info)
    return result


def _record_main(argv: Sequence[str]) -> None:
    parser = ArgumentParser(prog="minillm-plan", description=__doc__.split("\n")[0],
                            epilog="PLAN.yaml's fields: " + ", ".join(FIELDS) + " (docs/comparing.md). After a "
                            "two-stage plan's pilot: minillm-plan freeze --sweep NAME PILOT")
    parser.add_argument("plan_file", type=Path, metavar="PLAN.yaml")
    parser.add_argument("--sweep", required=True, help="the sweep's name (train.py's name=...): the plan goes to "
                                                       "<logs>/<sweep>/plan.json")
    parser.add_argument("--logs", type=Path, default=Path("logs"), help="the log folder (default: logs)")
    parser.add_argument("--force", action="store_true", help="record a new version of an existing plan.json (the "
                                                             "old ones are kept)")
    args = parser.parse_args(argv)
    existed = (args.logs / args.sweep / "plan.json").exists()
    try:
        path = record_plan(args.plan_file, args.sweep, args.logs, args.force)
    except PlanError as err:
        parser.error(str(err))
    stage, _ = plan_record.current(read_record(path))
    done = f"recorded version {stage['version']} (--force)" if existed else "recorded"
    print(f"{done} {path}: sha256 {stage['plan_sha256'][:12]}, {stage['recorded_at']}")
    if stage["plan"].get("design") == design.DESIGNS[0]:
        print("the pilot (then freeze it: minillm-plan freeze --sweep "
              f"{args.sweep} {args.logs / args.sweep}):\n  {design.pilot_command(stage['plan'], args.sweep)}")
    else:
        print("grade the sweep with: minillm-report <sweep folder> --plan")


def _freeze_main(argv: Sequence[str]) -> None:
    parser = ArgumentParser(prog="minillm-plan freeze", description="Fix a two-stage plan's design from its pilot: "
                            "each value's lr, the pilot's spread and the judged seeds (appended to plan.json).")
    parser.add_argument("pilot", type=Path, nargs="+", metavar="PILOT", help="folder(s) holding the pilot's runs "
                        "(e.g. logs/NAME: only the plan's pilot seeds, family and lr grid are read)")
    parser.add_argument("--sweep", required=True, help="the sweep's name: its plan is <logs>/<sweep>/plan.json")
    parser.add_argument("--logs", type=Path, default=Path("logs"), help="the log folder (default: logs)")
    parser.add_argument("--neighbours", action="store_true", help="also judge each value at the grid lrs beside its "
                        "chosen one (lr ± 1 grid step; no test reads them yet)")
    args = parser.parse_args(argv)
    try:
        path, stage = freeze_plan(args.sweep, args.pilot, args.logs, args.neighbours)
    except PlanError as err:
        parser.error(str(err))
    lrs = ", ".join(f"{v} {label(lr)}" for v, lr in stage["lrs"].items())
    spread = "; ".join(f"{arm} sd {s['sd']:.4g} (upper {100 * s['confidence']:.0f}% bound {s['sd_upper']:.4g}, "
                       f"{s['pairs']} pairs)" if s["sd"] is not None else f"{arm}: no spread ({s['pairs']} pairs)"
                       for arm, s in stage["spread"].items())
    print(f"froze version {stage['version']} of {path}: lrs {lrs}; pilot spread {spread}; "
          f"{len(stage['judged_seeds'])} judged seeds ({', '.join(map(str, stage['judged_seeds']))})")
    for warning in stage["warnings"]:
        print(f"warning: {warning}")
    print("the judged runs, one command per value:")
    for command in stage["commands"]:
        print(f"  {command}")
    print(f"then: minillm-report {args.logs / args.sweep} --plan")


def main(argv: Sequence[str] | None = None) -> None:
    """minillm-plan PLAN.yaml --sweep NAME (record), or minillm-plan freeze --sweep NAME PILOT (two-stage)."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "freeze" and not Path("freeze").is_file():
        _freeze_main(argv[1:])
    else:
        _record_main(argv)


if __name__ == "__main__":
    main()
