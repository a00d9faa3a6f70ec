"""RunSummary (minillm/training/callbacks/summary.py): a crashed run's summary."""


from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import compose_cfg

import minillm.training.train as train_script


def test_a_crashed_run_is_failed_in_its_summary_even_with_a_good_validation(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=2",
                      "+callbacks.crash={_target_:helpers.CrashAt,at_step:3}")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_script.train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["status"] == "failed" and "simulated crash" in summary["error"]
    assert summary["diverged"] is False and math.isfinite(summary["final_val_loss"])  # a validation at step 2
    assert summary["failed"] is True  # so no analysis counts its partial loss as a result
    assert summary["deterministic"] is True  # trainer.deterministic=auto, resolved for the CPU


def test_the_summary_records_the_deterministic_mode_as_it_ran(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "trainer.deterministic=false", "test=false")
    train_script.train(cfg)
    assert json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())["deterministic"] is False


def test_the_steady_window_starts_at_half_of_max_steps_and_leaves_out_a_resumed_segments_first_step(monkeypatch):
    """steady_tokens_per_s counts the steps after half of trainer.max_steps over their training time (a compile or
    warm-up in the first steps left out); a resumed segment counts from its first completed step (its recompile
    left out), added to what the checkpoint recorded; a checkpoint from before the field resumes with none."""
    from types import SimpleNamespace

    import torch

    from minillm.training.callbacks import RunSummary

    now = [0.0]
    monkeypatch.setattr("minillm.training.callbacks.summary.time.time", lambda: now[0])
    batch = (torch.zeros(2, 8, dtype=torch.long),)

    def run(summary, steps_and_times):
        for step, t in steps_and_times:
            now[0] = t
            summary.on_train_batch_end(SimpleNamespace(max_steps=8, global_step=step), None, None, batch, step - 1)

    first = RunSummary()
    now[0] = 100.0
    first.on_train_start(SimpleNamespace(global_step=0), None)
    run(first, [(1, 130.0), (2, 131.0), (3, 132.0), (4, 133.0), (5, 134.0), (6, 136.0)])  # step 1: a compile
    assert first.steady(6) == (2, 3.0)  # from step 4 (half of 8) at 33 s to step 6 at 36 s
    state = first.state_dict()  # a checkpoint at step 6
    assert state["steady"] == [2, 3.0] and state["train_time"] == 36.0

    resumed = RunSummary()
    resumed.load_state_dict(state)
    now[0] = 200.0
    resumed.on_train_start(SimpleNamespace(global_step=6), None)
    run(resumed, [(7, 220.0), (8, 221.5)])  # step 7: the recompile
    assert resumed.steady(8) == (3, 4.5)  # 2 steps in 3 s, then step 8 in 1.5 s
    assert state["trained_steps"] == 6 and resumed.trained_steps(8) == 8  # the steps tokens/s counts
    resumed.load_state_dict({"val_history": [], "batch_shape": None, "train_time": 1.0, "wall_time": 1.0})
    assert resumed.steady(8) == (0, 0.0)  # a checkpoint written before the field: nothing carried over
