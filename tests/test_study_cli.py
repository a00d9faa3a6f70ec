"""A study round's analysis CLI (experiments/common/study.py): the steps a two-stage round's run.sh takes between its
stages are options of the CLI, listed in its --help, and run instead of the analysis."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from experiments.common.study import analysis_main, printed_sweeps

STAGES = {"experiments.studies.s13_ngpt.r1_budgets.analyze": ("--choose-lr",),
          "experiments.studies.s13_ngpt.r2_steps_to_target.analyze": ("--choose-lr",),
          "experiments.studies.s5_precision.r4_peri_budget.analyze": ("--pilot",),
          "experiments.studies.s8_dyt.r5_recipe.analyze": ("--choose", "--print-sweeps"),
          "experiments.studies.s7_depth.r7_own_lr.analyze": ("--choose", "--print-sweeps")}


@pytest.mark.parametrize("module", STAGES)
def test_a_two_stage_rounds_step_between_its_stages_is_in_its_help(module, capsys):
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(module).main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert all(f"{flag} SWEEP [SWEEP ...]" in out for flag in STAGES[module])


def test_a_stage_runs_on_its_sweep_folders_instead_of_the_analysis(tmp_path):
    seen = []
    never = lambda *_: pytest.fail("the analysis ran")  # noqa: E731
    analysis_main("doc", tmp_path, lambda _: True, never, never, ["--choose", "a", "b"],
                  stages={"--choose": ("the pilot's lr", seen.append)})
    assert seen == [["a", "b"]] and list(tmp_path.iterdir()) == []


def test_a_stage_named_like_the_analysiss_own_argument_is_refused():
    """A stage --sweeps would share its destination with the sweep folders: the stage would never run."""
    with pytest.raises(ValueError, match="--sweeps would take the place of the analysis's own argument"):
        analysis_main("doc", Path("."), lambda _: True, print, None, ["--sweeps", "pilot"],
                      stages={"--sweeps": ("a stage's sweeps", print)})


def test_printed_sweeps_are_split_as_run_sh_reads_them_and_a_folder_printed_twice_is_refused():
    def main(lines):
        return lambda argv: print(*lines.get(argv[1], []), sep="\n")
    printed = {"pilot": ["pilot_a norm=dyt optimizer.lr=0.001,0.003 seed=0,1", "", "pilot_b norm=rmsnorm seed=0,1"]}
    assert printed_sweeps(main(printed), "pilot") == {"pilot_a": ["norm=dyt", "optimizer.lr=0.001,0.003", "seed=0,1"],
                                                       "pilot_b": ["norm=rmsnorm", "seed=0,1"]}
    printed["pilot"].append("pilot_a norm=derf seed=0,1")
    with pytest.raises(ValueError, match="prints the folder pilot_a twice"):
        printed_sweeps(main(printed), "pilot")
