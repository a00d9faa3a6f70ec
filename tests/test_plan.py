"""minillm/analysis/plans.py: a comparison pre-registered with `minillm-plan`, and a sweep graded against it with
`minillm-report ... --plan` (runs started before the plan, a plan edited after the sweep, expectations)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from helpers import call_main
from test_report import report_main
from test_verdicts import planted_runs, write_sweep

from minillm.analysis.plans import DEFAULTS_V2, RULES_VERSION, PlanError, grade, parse_plan, record_plan


def plan_main(args: list, capsys) -> tuple[int, str, str]:
    """minillm-plan in this process: (exit code, stdout, stderr)."""
    from minillm.analysis.plans import main

    return call_main(main, args, capsys)


PLAN = """\
question: Are RMSNorm and ScaleNorm as good as LayerNorm, at each one's own learning rate?
factor: norm
baseline: layernorm
margin: 0.02
lr: tuned
seeds: [0, 1, 2, 3, 4, 5, 6, 7]
expected: {rmsnorm: equivalent, scalenorm: equivalent, dyt: better}
"""


def planted_after(started_at: str) -> list[dict]:
    return [{**r, "started_at": started_at} for r in planted_runs()]


def test_plan_records_its_hash_and_time_and_is_not_overwritten_without_force(tmp_path, capsys):
    (tmp_path / "plan.yaml").write_text(PLAN)
    code, out, err = plan_main([tmp_path / "plan.yaml", "--sweep", "s", "--logs", tmp_path / "logs"],
                                 capsys)
    assert code == 0, err
    record = json.loads((tmp_path / "logs" / "s" / "plan.json").read_text())
    assert record["plan_sha256"] == hashlib.sha256(PLAN.encode()).hexdigest() and record["plan_text"] == PLAN
    recorded = datetime.fromisoformat(record["recorded_at"])
    assert recorded.tzinfo is not None and abs((datetime.now(timezone.utc) - recorded).total_seconds()) < 60
    assert record["plan"] == {**parse_plan(PLAN), "question": record["plan"]["question"]}
    assert record["plan"]["metric"] == "auto" and record["plan"]["alpha"] == 0.05  # the defaults, recorded
    assert record["rules_version"] == RULES_VERSION == 3 and record["plan"]["failures"] == "penalize"
    assert f"recorded {tmp_path / 'logs' / 's' / 'plan.json'}" in out
    code, _, err = plan_main([tmp_path / "plan.yaml", "--sweep", "s", "--logs", tmp_path / "logs"], capsys)
    assert code == 2 and "already holds a plan" in err and "pass --force to replace it" in err
    code, out, _ = plan_main([tmp_path / "plan.yaml", "--sweep", "s", "--logs", tmp_path / "logs",
                                "--force"], capsys)
    assert code == 0 and out.startswith("replaced (--force)")


@pytest.mark.parametrize(("change", "error"), [
    ({"margin": "-1"}, "margin=-1 is invalid; allowed: a number > 0"),
    ({"alpha": "2"}, "alpha=2 is invalid; allowed: a number in (0, 1)"),
    ({"lr": "fast"}, "lr='fast' is invalid; allowed: tuned, common or a learning rate > 0"),
    ({"seeds": "[0, 0, 1]"}, "seeds=[0, 0, 1] is invalid; allowed: a list of distinct integers"),
    ({"expected": "{rmsnorm: faster}"}, "expected={'rmsnorm': 'faster'} is invalid; allowed: a mapping of arm -> "
                                        "better | worse | equivalent"),
    ({"factor": None}, "factor missing; a plan needs factor, baseline, seeds, expected"),
    ({"colour": "blue"}, "unknown field(s) colour; allowed: question, factor"),
])
def test_plan_fields_are_checked_with_one_error_line(change, error, tmp_path, capsys):
    lines = [line for line in PLAN.splitlines() if line.split(":")[0] not in change]
    lines += [f"{k}: {v}" for k, v in change.items() if v is not None]
    (tmp_path / "plan.yaml").write_text("\n".join(lines) + "\n")
    code, _, err = plan_main([tmp_path / "plan.yaml", "--sweep", "s", "--logs", tmp_path / "logs"], capsys)
    assert code == 2, err
    assert err.splitlines()[-1].startswith(f"minillm-plan: error: {tmp_path / 'plan.yaml'}: {error}"), err
    assert not (tmp_path / "logs").exists()


def test_a_sweep_graded_by_its_plan_follows_the_plan_whatever_the_command_line_says(tmp_path, capsys):
    (tmp_path / "plan.yaml").write_text(PLAN)
    path = record_plan(tmp_path / "plan.yaml", "s", tmp_path / "logs")
    sweep = write_sweep(tmp_path / "logs" / "s" / "multiruns" / "t1", planted_after("2099-01-01T00:00:00+00:00"))
    extra = write_sweep(tmp_path / "logs" / "s" / "multiruns" / "t2", [  # a seed the plan did not list
        {**r, "seed": 99} for r in planted_after("2099-01-01T00:00:00+00:00")
        if (r["seed"], r["norm"], r["lr"]) == (0, "layernorm", 3e-3)])
    code, out, err = report_main([sweep, extra, "--plan", "--metric", "best_val_loss", "--lr", "common"], capsys)
    assert code == 0, err
    assert f"note: --metric best_val_loss ignored: the plan {path} fixes metric=auto" in out
    assert "note: --lr common ignored: the plan" in out
    data = json.loads((sweep / "report" / "verdicts.json").read_text())
    assert data["metric"] == "final_val_loss" and data["lr_rule"] == "tuned" and data["margin"] == 0.02
    plan = data["plan"]
    assert plan["plan_hash"] == hashlib.sha256(PLAN.encode()).hexdigest() == data["plan_hash"]
    assert plan["plan_file_changed"] is False and plan["plan_record_intact"] and plan["all_runs_after_plan"]
    assert plan["runs_before_plan"] == [] and plan["unplanned_runs"] == [str(extra / "0")]
    arms = {c["arm"]: c for c in data["comparisons"]}
    assert all(c["plan_hash"] == plan["plan_hash"] for c in arms.values())
    assert (arms["rmsnorm"]["expected"], arms["rmsnorm"]["as_expected"]) == ("equivalent", True)
    assert (arms["scalenorm"]["arm_lr"], arms["scalenorm"]["as_expected"]) == (1e-2, True)
    assert (arms["dyt"]["verdict"], arms["dyt"]["expected"], arms["dyt"]["as_expected"]) == ("inconclusive", "better",
                                                                                           False)
    assert arms["powernorm"]["expected"] is None and arms["powernorm"]["as_expected"] is None
    assert all([w[:37] for w in c["warnings"]] == ["the lr was chosen on the runs that ju"] for c in arms.values())
    assert "equivalent (met)" in (sweep / "report" / "verdicts.md").read_text()


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_a_run_started_before_the_plan_and_a_plan_edited_after_the_sweep_are_reported(tmp_path, capsys):
    (tmp_path / "plan.yaml").write_text(PLAN)
    record_plan(tmp_path / "plan.yaml", "s", tmp_path / "logs")
    runs = planted_after("2099-01-01T00:00:00+00:00")
    early = next(i for i, r in enumerate(runs) if (r["norm"], r["lr"], r["seed"]) == ("rmsnorm", 3e-3, 2))
    runs[early]["started_at"] = "2020-01-01T00:00:00+00:00"  # before the plan: its numbers were seen first
    sweep = write_sweep(tmp_path / "logs" / "s" / "multiruns" / "t1", runs)
    (tmp_path / "plan.yaml").write_text(PLAN.replace("margin: 0.02", "margin: 0.05"))  # edited after the sweep
    code, _, err = report_main([sweep, "--plan", tmp_path / "logs" / "s" / "plan.json"], capsys)
    assert code == 0, err
    data = json.loads((sweep / "report" / "verdicts.json").read_text())
    assert data["margin"] == 0.02  # the recorded rule, not the edited file's
    plan = data["plan"]
    assert plan["plan_file_changed"] is True and plan["runs_before_plan"] == [str(sweep / str(early))]
    assert plan["all_runs_after_plan"] is False
    arms = {c["arm"]: c for c in data["comparisons"]}
    assert any(f"1 compared run(s) started before the plan was recorded: {sweep / str(early)}" == w
               for w in arms["rmsnorm"]["warnings"])
    assert not any("started before" in w for w in arms["dyt"]["warnings"])  # its runs all came after
    assert all(any("changed after the plan was recorded" in w for w in c["warnings"]) for c in arms.values())
    md = (sweep / "report" / "verdicts.md").read_text()
    assert "Plan file changed since: yes" in md and "runs started before the plan: 1" in md
    # plan.json edited by hand: its plan no longer matches its hash
    path = tmp_path / "logs" / "s" / "plan.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "plan_text": record["plan_text"].replace("0.02", "0.5")}))
    code, _, err = report_main([sweep, "--plan"], capsys)
    data = json.loads((sweep / "report" / "verdicts.json").read_text())
    assert code == 0 and data["plan"]["plan_record_intact"] is False
    assert any("was edited: its plan does not match its hash" in w for w in data["comparisons"][0]["warnings"])


def test_record_plan_refuses_a_missing_file_and_a_bad_sweep_name(tmp_path):
    with pytest.raises(PlanError, match="no such file"):
        record_plan(tmp_path / "nope.yaml", "s", tmp_path)
    (tmp_path / "plan.yaml").write_text(PLAN)
    with pytest.raises(PlanError, match="--sweep 'a/b' is invalid"):
        record_plan(tmp_path / "plan.yaml", "a/b", tmp_path)
    assert not Path(tmp_path / "a").exists()


def test_a_plan_is_graded_by_the_rules_version_it_was_recorded_under(tmp_path):
    """A plan recorded under rules version 2 (or before versions) keeps its rules when the engine's rules change:
    grade() returns its version and the frozen defaults of that version for every field its text leaves out."""
    (tmp_path / "plan.yaml").write_text(PLAN)
    record = json.loads(record_plan(tmp_path / "plan.yaml", "s", tmp_path / "logs").read_text())
    assert grade(record, [])[0]["version"] == RULES_VERSION
    rules, *_ = grade({**record, "rules_version": 2}, [])
    assert rules["version"] == 2 and {k: rules[k] for k in DEFAULTS_V2 if k not in ("margin", "lr")} == {
        k: v for k, v in DEFAULTS_V2.items() if k not in ("margin", "lr")}
    before = {k: v for k, v in record.items() if k != "rules_version"}
    rules, *_ = grade(before, [])
    assert (rules["version"], rules["failures"], rules["adjust"], rules["metric"]) == (2, "drop", "none",
                                                                                      "final_val_loss")
