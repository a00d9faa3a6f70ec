"""Progress output (minillm/training/callbacks/progress.py): the rich bar's label and step count, log lines above it."""


from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
from helpers import compose_cfg
from omegaconf import open_dict

import minillm.training.train as train_script


def test_progress_bar_labels_step_based_runs_without_a_negative_epoch_count():

    from minillm.training.callbacks import RichBar

    bar = RichBar()
    bar._trainer = SimpleNamespace(max_epochs=-1)  # training by steps (trainer.max_epochs=-1)
    assert bar._get_train_description(0).strip() == "Epoch 0"
    bar._trainer = SimpleNamespace(max_epochs=3)
    assert bar._get_train_description(1).strip() == "Epoch 1/2"


def test_the_rich_bar_counts_the_steps_of_the_whole_run_after_a_resume(tmp_path, corpus):
    """Resumed mid-epoch at step 3 of 6: the bar reads 6/6 at the end (Lightning's reads batches of this epoch
    against the steps left: 6/3)."""
    from minillm.training.callbacks.progress import RichBar

    first = compose_cfg(tmp_path, corpus, "trainer.max_steps=3", "scheduler=constant", "test=false")
    train_script.train(first)
    ckpt = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=6", "scheduler=constant", "test=false",
                      f"ckpt_path={ckpt}", "callbacks.progress_bar.mode=rich")
    with open_dict(cfg):
        cfg.callbacks.look = {"_target_": "test_progress.LookAtTheBar"}
    train_script.train(cfg)
    assert LookAtTheBar.seen == {"kind": RichBar, "total": 6, "completed": 6}


class LookAtTheBar(L.Callback):
    seen: dict = {}

    def on_train_end(self, trainer, pl_module) -> None:
        bar = trainer.progress_bar_callback
        task = bar.progress.tasks[bar.train_progress_bar_id]
        LookAtTheBar.seen = {"kind": type(bar), "total": task.total, "completed": task.completed}


def test_log_lines_print_above_the_rich_bar(monkeypatch):
    """A console handler made before the bar writes to whatever sys.stdout is when it logs (rich's proxy while
    the bar is live), not into the bar's line through the stream it was made with."""
    import io
    import logging

    from minillm.training.callbacks.progress import follow_console

    logger = logging.getLogger("test-follow-console")
    handler = logging.StreamHandler(sys.stdout)
    logger.addHandler(handler)
    try:
        follow_console(logger)
        live = io.StringIO()
        monkeypatch.setattr(sys, "stdout", live)
        logger.warning("a line")
        assert live.getvalue() == "a line\n"
    finally:
        logger.removeHandler(handler)
