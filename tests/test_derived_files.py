"""Every file derived from a run tells the same numbers: summary.json, csv/metrics.csv, the W&B run summary and the
report, for a run stopped and resumed, a decay branch and a replay (the DDP run: tests/test_journey.py), each made as a
user makes it."""

from __future__ import annotations

import json

import pytest
from helpers import ROOT, check_derived_files, logged, read_rows
from processes import cli, ok

CORPUS_CHARS = 20_000
TRAIN = str(ROOT / "train.py")


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_summary_metrics_wandb_and_report_agree_for_resumed_branched_and_replayed_runs(tmp_path, shared_cache,
                                                                                        corpus):
    base = [TRAIN, "model=tiny", "data=files", f"data.files=[{corpus}]", "data.batch_size=4", "data.val_windows=4",
            "trainer.log_every_n_steps=1", "callbacks.text_sample.max_new_tokens=8", "scheduler=wsd",
            "scheduler.decay_fraction=0", "trainer.max_steps=6", "trainer.val_check_interval=4",
            "callbacks.step_checkpoints.every_n_train_steps=2", "name=d"]
    runs = tmp_path / "logs" / "d" / "runs"
    stop = ["+callbacks.signal._target_=helpers.SignalAt", "+callbacks.signal.signum=15", "+callbacks.signal.step=3"]
    assert cli([*base, "run_id=r", *stop], tmp_path, shared_cache).returncode == 143
    ok(cli([*base, "run_id=r", "ckpt_path=auto"], tmp_path, shared_cache))  # two segments, one W&B run
    resumed = check_derived_files(runs / "r")
    assert resumed["steps"] == 6 and len(list((runs / "r" / "wandb").glob("offline-run-*"))) == 2

    parent = runs / "r" / "checkpoints" / "step-4.ckpt"
    ok(cli([*base, "run_id=b", "scheduler.decay_fraction=0.2", f"decay_from={parent}"], tmp_path,
           shared_cache))  # decays over step 4 alone: off the validation grid
    branch = check_derived_files(runs / "b")
    assert branch["steps"] == 5 and sorted(logged(read_rows(runs / "b"), "val/loss")) == [4]

    ok(cli([*base, "run_id=p"], tmp_path, shared_cache))  # a replay runs its run's command: one without a signal
    ok(cli(["-m", "minillm.tools.replay", str(runs / "p" / "checkpoints" / "step-2.ckpt"), "--steps", "2:6"], tmp_path,
           shared_cache))
    (folder,) = (runs / "p" / "replays").iterdir()
    replayed = check_derived_files(folder)
    train = logged(read_rows(folder), "train/loss")
    assert replayed["replay"]["final_train_loss"] == train[5] and replayed["failed"] is False

    ok(cli(["-m", "minillm.analysis.report", str(tmp_path / "logs" / "d")], tmp_path, shared_cache))
    report = (tmp_path / "logs" / "d" / "report" / "report.md").read_text()
    for summary in (resumed, branch, check_derived_files(runs / "p")):
        assert f"{summary['final_val_loss']:.4f}" in report, (summary["final_val_loss"], report)
    assert json.loads((runs / "r" / "summary.json").read_text()) == resumed  # the report changed no record

    # the resumed run's command sends SIGTERM at step 3: so does its replay, which ends as stopped, not as a success
    stopped = cli(["-m", "minillm.tools.replay", str(runs / "r" / "checkpoints" / "step-2.ckpt"), "--steps", "2:6"],
                  tmp_path, shared_cache)
    assert stopped.returncode == 143 and "minillm-replay: stopped by SIGTERM" in stopped.output, stopped.output[-2000:]
