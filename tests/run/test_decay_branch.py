"""Decay branches (decay_from=, minillm/training/run/resume.py): from a stable run's checkpoint, a new run that decays
and
records its parent; the same losses as the WSD run of that budget; every other settings change refused; the report's
loss-vs-tokens plot across branches (minillm/analysis/branches.py). Run as a user runs them, W&B on."""

from __future__ import annotations

import json
import re

import pytest
from helpers import ROOT, logged, read_rows
from processes import cli, ok, summaries

CORPUS_CHARS = 20_000
TRAIN = str(ROOT / "train.py")
WSD = ["model=tiny", "data=files", "data.batch_size=4", "data.val_windows=4", "trainer.log_every_n_steps=1",
       "callbacks.text_sample.max_new_tokens=8", "scheduler=wsd", "scheduler.warmup_steps=2", "name=wsd"]


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_decay_branches_are_new_runs_with_the_losses_of_the_wsd_run_of_their_budget(tmp_path, shared_cache, corpus):
    base = [TRAIN, *WSD, f"data.files=[{corpus}]"]
    runs = tmp_path / "logs" / "wsd" / "runs"
    stable = ["run_id=stable", "scheduler.decay_fraction=0", "trainer.max_steps=12", "trainer.val_check_interval=4",
              "callbacks.step_checkpoints.every_n_train_steps=4", "test=false"]
    ok(cli([*base, *stable], tmp_path, shared_cache))
    assert sorted(p.name for p in (runs / "stable" / "checkpoints").glob("step-*.ckpt")) == [
        "step-12.ckpt", "step-4.ckpt", "step-8.ckpt"]
    # the WSD run of 10 steps (decays over its last 20%: steps 8, 9) and the branch from step 8 of the stable run
    ok(cli([*base, "run_id=fresh", "trainer.max_steps=10", "trainer.val_check_interval=5", "test=false"], tmp_path,
           shared_cache))
    ckpt = runs / "stable" / "checkpoints" / "step-8.ckpt"
    out = ok(cli([*base, f"decay_from={ckpt}", "run_id=b8", "trainer.val_check_interval=4"], tmp_path, shared_cache))
    assert f"decay branch of {runs / 'stable'} from step 8: sqrt decay over 2 steps to step 10" in out
    fresh, branch = logged(read_rows(runs / "fresh"), "train/loss"), logged(read_rows(runs / "b8"), "train/loss")
    assert sorted(branch) == [8, 9] and branch == {s: fresh[s] for s in (8, 9)}  # bit-exact, in its own folder
    lrs = logged(read_rows(runs / "b8"), "train/lr")
    fresh_lrs = logged(read_rows(runs / "fresh"), "train/lr")
    assert lrs == {s: fresh_lrs[s] for s in (8, 9)} and lrs[9] < lrs[8] == pytest.approx(3e-3)
    (summary,) = summaries(runs / "b8")
    assert summary["parent"] == {"run_dir": str(runs / "stable"), "checkpoint": str(ckpt), "step": 8}
    vals = logged(read_rows(runs / "b8"), "val/loss")  # validated at its end (step 10 is off the grid of 4)
    assert sorted(vals) == [9] and summary["final_val_loss"] == summary["best_val_loss"] == vals[9]
    parent = json.loads((runs / "stable" / "summary.json").read_text())
    assert summary["best_val_step"] == 9 and summary["started_at"] != parent["started_at"]  # its own record
    assert summary["steps"] == summary["max_steps"] == 10 and summary["test_loss"] is not None
    ids = [{p.name.rsplit("-", 1)[-1] for p in (runs / r / "wandb").glob("offline-run-*")} for r in ("stable", "b8")]
    assert ids[0].isdisjoint(ids[1])  # a W&B run of its own
    assert not list((runs / "stable").glob("summary.json")) or json.loads(
        (runs / "stable" / "summary.json").read_text())["steps"] == 12  # the parent is left as it was

    ok(cli([*base, f"decay_from={runs / 'stable' / 'checkpoints' / 'step-4.ckpt'}", "run_id=b4",
            "scheduler.decay_shape=linear", "trainer.val_check_interval=5", "test=false"], tmp_path, shared_cache))
    out = ok(cli(["-m", "minillm.analysis.report", str(tmp_path / "logs" / "wsd")], tmp_path, shared_cache))
    report = (tmp_path / "logs" / "wsd" / "report" / "report.md").read_text()
    assert (tmp_path / "logs" / "wsd" / "report" / "loss_vs_tokens.png").stat().st_size > 10_000, out
    assert re.search(r"\| stable \| 4 \| 5 \| 640 \| [\d.]+ \| - \| b4 \|", report), report
    assert re.search(r"\| stable \| 8 \| 10 \| 1280 \| [\d.]+ \| [\d.]+ \| b8 \|", report), report


def test_a_branch_refuses_every_other_change_and_a_checkpoint_past_the_stable_phase(tmp_path, shared_cache, corpus):
    base = [TRAIN, *WSD, f"data.files=[{corpus}]", "trainer.val_check_interval=2", "test=false"]
    ok(cli([*base, "run_id=run", "trainer.max_steps=10"], tmp_path, shared_cache))  # decays from step 8
    last = tmp_path / "logs" / "wsd" / "runs" / "run" / "checkpoints" / "last.ckpt"
    cases = [
        ([f"decay_from={last}"], f"config error: decay_from='{last}' is at step 10, in its run's decay (from step 8)"),
        ([f"decay_from={last}", "scheduler=cosine"], "config error: decay_from='"),
        ([f"decay_from={last}", "optimizer.lr=1e-2", "scheduler.decay_fraction=0"], "scheduler.decay_fraction=0 is "
                                                                                    "invalid for a decay branch"),
        ([f"decay_from={last}", "train=false"], "config error: decay_from starts a decay branch (training)"),
    ]
    for overrides, message in cases:
        out = cli([*base, *overrides], tmp_path, shared_cache)
        lines = [line for line in out.output.splitlines() if "error: " in line]
        assert out.returncode == 2 and len(lines) == 1 and message in lines[0], out.output[-2000:]
    stable = tmp_path / "logs" / "wsd" / "runs" / "stable"
    ok(cli([*base, "run_id=stable", "scheduler.decay_fraction=0", "trainer.max_steps=4"], tmp_path, shared_cache))
    out = cli([*base, f"decay_from={stable / 'checkpoints' / 'last.ckpt'}", "optimizer.lr=1e-2",
               "scheduler.warmup_steps=3"], tmp_path, shared_cache)
    (line,) = [line for line in out.output.splitlines() if "error: " in line]
    assert out.returncode == 2 and "was trained with other settings (optimizer.lr: checkpoint 0.003, config 0.01; " \
                                   "scheduler.warmup_steps: checkpoint 2, config 3)" in line, line
