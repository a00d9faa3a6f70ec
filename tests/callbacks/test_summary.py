"""RunSummary (minillm/callbacks/summary.py): a crashed run's summary."""


from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import compose_cfg

import minillm.train as train_script


def test_a_crashed_run_is_failed_in_its_summary_even_with_a_good_validation(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=2",
                      "+callbacks.crash={_target_:helpers.CrashAt,at_step:3}")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_script.train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["status"] == "failed" and "simulated crash" in summary["error"]
    assert summary["diverged"] is False and math.isfinite(summary["final_val_loss"])  # a validation at step 2
    assert summary["failed"] is True  # so no analysis counts its partial loss as a result


def test_the_steady_rate_starts_at_half_of_max_steps_and_survives_a_resume(monkeypatch):
    """steady_tokens_per_s counts from the step at half of trainer.max_steps (a compile or warm-up in the first
    steps left out), on the training clock (validation excluded); a resumed run keeps the mark of its first segment."""
    from types import SimpleNamespace

    import torch

    from minillm.callbacks import RunSummary

    clock = iter([0.0, 100.0, 132.0])  # the callback's creation, training's start, the end of step 3
    monkeypatch.setattr("minillm.callbacks.summary.time.time", lambda: next(clock))
    summary = RunSummary()
    summary.on_train_start(None, None)
    batch = (torch.zeros(2, 8, dtype=torch.long),)
    for step in (1, 2, 3):
        summary.on_train_batch_end(SimpleNamespace(max_steps=6, global_step=step), None, None, batch, step - 1)
    assert summary._half == (3, 32.0)  # recorded once, at step 3 of 6, after 32 s of training
    monkeypatch.setattr("minillm.callbacks.summary.time.time", lambda: 140.0)
    state = summary.state_dict()  # what the checkpoint holds
    assert state["half"] == [3, 32.0] and state["train_time"] == 40.0
    resumed = RunSummary()
    resumed.load_state_dict(state)
    assert resumed._half == (3, 32.0)
    resumed.load_state_dict({"val_history": [], "batch_shape": None, "train_time": 1.0, "wall_time": 1.0})
    assert resumed._half is None  # a checkpoint written before the mark existed
