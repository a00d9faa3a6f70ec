"""How often the default callbacks read the device during training: on a GPU each read waits for the queued
work (a host sync), so a plain step (not a logging, probe or validation step) reads only what divergence and spike
detection need, in one read each."""

from __future__ import annotations

import traceback
from collections import defaultdict
from pathlib import Path

import lightning as L
import torch
from helpers import compose_cfg

import minillm.train as train_script

CALLBACKS = str(Path(train_script.__file__).parent / "callbacks")
READS = ("tolist", "item", "__float__", "__bool__", "__int__", "cpu", "numpy")


class StepOf(L.Callback):
    """Keeps the step being trained, for the counts."""
    step = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        StepOf.step = trainer.global_step


def test_a_plain_training_step_reads_the_device_once_per_callback_that_must(tmp_path, corpus, monkeypatch):
    reads: dict[int | None, list[str]] = defaultdict(list)

    def counted(name, original):
        def read(self, *args, **kwargs):
            frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(CALLBACKS)]
            if frames:
                reads[StepOf.step].append(f"{Path(frames[-1].filename).stem}.{name}")
            return original(self, *args, **kwargs)
        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    cfg = compose_cfg(tmp_path, corpus, "callbacks=default", "logger=wandb", "trainer.max_steps=12",
                      "trainer.val_check_interval=12", "trainer.log_every_n_steps=10", "test=false")
    init = L.Trainer.__init__
    monkeypatch.setattr(L.Trainer, "__init__", lambda self, *a, callbacks=(), **k: init(
        self, *a, callbacks=[StepOf(), *callbacks], **k))
    train_script.train(cfg)
    plain = [s for s in range(1, 11) if s % 10]  # steps 1-9: no logging, probe or validation
    assert all(reads[s] == ["stability.tolist", "divergence.tolist"] for s in plain), {s: reads[s] for s in plain}
    assert len(reads[10]) > 2  # a logging step reads its metrics: the count above is not blind
