"""Pre-registration: a comparison's rules recorded before its sweep runs, and a sweep graded against them.

    minillm-plan PLAN.yaml --sweep NAME [--logs logs] [--force]    records logs/NAME/plan.json
    minillm-report logs/NAME/multiruns/<id> --plan                         grades the sweep by the recorded rules

PLAN.yaml holds the question (FIELDS; factor, baseline, seeds and expected are required):

    question: Is RMSNorm as good as LayerNorm?    # free text, optional
    factor: norm
    baseline: layernorm
    metric: auto                  # default: test_loss, else final_val_loss; higher_is_better: false
    margin: 0.02                  # default, in the metric's units
    alpha: 0.05                   # default: the family-wise error of the words
    lr: tuned                     # tuned (default) | common | a learning rate
    seeds: [0, 1, 2, 3, 4, 5, 6, 7]
    expected: {rmsnorm: equivalent}   # per arm: better | worse | equivalent
    # and any other rule of minillm.analysis.rules.Rules (lr_choice, failures, adjust, equivalence, stability, ...)

plan.json keeps the validated plan, the YAML's text, its sha256, the UTC time it was recorded and the rules version.
Grading takes the rules from the recorded text (whatever the command line or the YAML file now say; a field the text
leaves out takes the default of the recorded rules version, so a plan recorded before the versions is graded by the
rules of its time), leaves out runs of seeds the plan
did not list, and records: the plan's hash, whether the YAML file changed since (its sha256 differs), whether
plan.json itself still matches its hash, the runs whose ``started_at`` precedes the recording (a warning on each
verdict they enter), planned seeds an arm lacks, and whether each verdict is the one expected.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from minillm.analysis.rules import LR_RULES, OPTIONS, REGISTERED_BEFORE, VERSION, CompareError, Rules
from minillm.analysis.runs import label
from minillm.analysis.strata import matches
from minillm.errors import ArgumentParser
from minillm.files import write_json

# the rules a plan may fix, with the engine's defaults (minillm.analysis.rules.Rules); a plan recorded before the rules
# had a
# version is graded with the rules of that time (REGISTERED_BEFORE) for every field its text does not set
PLAN_RULES = ("metric", "higher_is_better", "margin", "alpha", "lr", "lr_choice", "failures", "adjust", "equivalence",
              "paired_by", "interval", "window_error", "stability", "tolerance", "range_margin", "rate_margin")
DEFAULTS = {name: getattr(Rules(), name) for name in PLAN_RULES}
RULES_VERSION = VERSION  # plan.json's rules_version (minillm.analysis.rules.VERSION); none: the rules before 2
REQUIRED = ("factor", "baseline", "seeds", "expected")
FIELDS = ("question", *REQUIRED, *DEFAULTS)
EXPECTED = ("better", "worse", "equivalent")
RULES = ("factor", "baseline", *DEFAULTS)  # what compare() takes from a plan
NUMBERS = ("margin", "alpha", "tolerance", "range_margin", "rate_margin")
FLAGS = ("higher_is_better", "window_error", "stability")
BEFORE = "started before the plan was recorded"


class PlanError(ValueError):
    """A plan that cannot be recorded or read; the message names the file and the field."""


def _number(value: Any) -> float | None:
    """A YAML number (PyYAML reads 3e-3 as text) or None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def parse_plan(text: str, source: str = "plan", defaults: Mapping[str, Any] = DEFAULTS) -> dict:
    """The plan of a YAML text, checked and with ``defaults`` filled in; PlanError naming the field otherwise."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PlanError(f"{source}: not valid YAML ({' '.join(str(err).split())})") from None
    if not isinstance(raw, dict):
        raise PlanError(f"{source}: a plan is a mapping of {', '.join(FIELDS)}")

    def bad(field: str, allowed: str) -> PlanError:
        return PlanError(f"{source}: {field}={raw.get(field)!r} is invalid; allowed: {allowed}")

    unknown = sorted(set(map(str, raw)) - set(FIELDS))
    if unknown:
        raise PlanError(f"{source}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(FIELDS)}")
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
        number = _number(plan[field])
        plan[field] = number if number is not None else plan[field]
    if plan["lr"] not in LR_RULES:
        lr = _number(plan["lr"])
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
    if version == RULES_VERSION:
        return DEFAULTS
    if version == 2:
        return DEFAULTS_V2
    return {**DEFAULTS_V2, **{k: v for k, v in REGISTERED_BEFORE.items() if k in DEFAULTS_V2}}


def recorded_version(record: Mapping) -> int:
    """The rules version a recorded plan is graded by: the one it was recorded under (2 before versions)."""
    version = record.get("rules_version")
    return version if isinstance(version, int) else 2


def _sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def record_plan(plan_file: str | Path, sweep: str, logs: str | Path = "logs", force: bool = False) -> Path:
    """Check PLAN.yaml and write ``<logs>/<sweep>/plan.json``; an existing one is replaced only with ``force``."""
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
    if path.exists() and not force:
        raise PlanError(f"{path} already holds a plan (recorded {read_record(path).get('recorded_at')}); a plan is "
                        "recorded once, before its runs: pass --force to replace it")
    record = {"sweep": sweep, "plan": plan, "plan_file": str(plan_file.resolve()), "plan_sha256": _sha256(data),
              "recorded_at": _utc_now(), "plan_text": text, "rules_version": RULES_VERSION}
    return write_json(path, record)


def read_record(path: str | Path) -> dict:
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise PlanError(f"{path}: not a readable plan.json ({err})") from None
    if not all(k in record for k in ("plan", "plan_sha256", "recorded_at", "plan_text")):
        raise PlanError(f"{path}: not a plan.json written by minillm-plan")
    return record


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


def _time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def grade(record: Mapping, records: Sequence[Mapping], path: str | Path = "plan.json") -> tuple[dict, list, Any, dict]:
    """(the compare() rules of the recorded plan, the runs of planned seeds, a run_check that flags runs started
    before the plan, the plan's facts for the report)."""
    plan = parse_plan(record["plan_text"], f"{path} (its recorded plan)", recorded_defaults(record))
    recorded = _time(record["recorded_at"])
    plan_file = Path(record.get("plan_file") or "")
    now = _sha256(plan_file.read_bytes()) if plan_file.is_file() else None

    def before(r: Mapping) -> bool:
        started = _time(r.get("started_at"))
        return started is not None and recorded is not None and started < recorded

    info = {"path": str(path), "plan_hash": record["plan_sha256"], "recorded_at": record["recorded_at"],
            "plan_file": str(plan_file), "plan_file_changed": None if now is None else now != record["plan_sha256"],
            "plan_record_intact": _sha256(record["plan_text"]) == record["plan_sha256"]
            and record.get("plan") == plan, "question": plan.get("question"), "seeds": plan["seeds"],
            "expected": plan["expected"],
            "runs_before_plan": sorted(str(r.get("run_dir")) for r in records if before(r)),
            "runs_without_start_time": sorted(str(r.get("run_dir")) for r in records
                                              if _time(r.get("started_at")) is None),
            "unplanned_runs": sorted(str(r.get("run_dir")) for r in records if r.get("seed") not in plan["seeds"])}
    info["all_runs_after_plan"] = not info["runs_before_plan"] and not info["runs_without_start_time"]
    kept = [r for r in records if r.get("seed") in plan["seeds"]]
    rules = {**{k: plan[k] for k in RULES}, "version": recorded_version(record)}
    return rules, kept, (lambda r: BEFORE if before(r) else None), info


def apply(result: dict, info: Mapping) -> dict:
    """Add the plan's facts to a compare() result: per comparison plan_hash, expected, as_expected and warnings
    for a changed plan and missing planned seeds."""
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
        expected = next((v for k, v in info["expected"].items() if matches(c["arm"], k)), None)
        seen |= {k for k in info["expected"] if matches(c["arm"], k)}
        missing = [f"{who} lacks planned seeds {', '.join(map(str, s))}" for who, s in (
            ("the arm", sorted(set(info["seeds"]) - set(c["arm_seeds"]))),
            ("the baseline", sorted(set(info["seeds"]) - set(c["baseline_seeds"])))) if s]
        c.update(plan_hash=info["plan_hash"], expected=expected,
                 as_expected=None if expected is None else c["verdict"] == expected)
        c["warnings"] = [*c["warnings"], *shared, *missing]
    result["plan"]["expected_without_runs"] = sorted(set(info["expected"]) - seen)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="minillm-plan", description=__doc__.split("\n")[0],
                                     epilog="PLAN.yaml's fields: " + ", ".join(FIELDS) + " (docs/comparing.md)")
    parser.add_argument("plan_file", type=Path, metavar="PLAN.yaml")
    parser.add_argument("--sweep", required=True, help="the sweep's name (train.py's name=...): the plan goes to "
                                                       "<logs>/<sweep>/plan.json")
    parser.add_argument("--logs", type=Path, default=Path("logs"), help="the log folder (default: logs)")
    parser.add_argument("--force", action="store_true", help="replace an existing plan.json")
    args = parser.parse_args(argv)
    existed = (args.logs / args.sweep / "plan.json").exists()
    try:
        path = record_plan(args.plan_file, args.sweep, args.logs, args.force)
    except PlanError as err:
        parser.error(str(err))
    record = read_record(path)
    print(f"{'replaced (--force)' if existed else 'recorded'} {path}: sha256 {record['plan_sha256'][:12]}, "
          f"{record['recorded_at']}; grade the sweep with: minillm-report <sweep folder> --plan")
