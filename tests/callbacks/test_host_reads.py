"""How often training reads the device: on a GPU each read (.item(), .tolist(), float(), .cpu(), ...) waits for
the queued work, a host synchronization. In the default GPU path with the default callbacks, a step that logs
nothing reads nothing, and a logging step reads once (DeviceReads, minillm/training/callbacks/reads.py), whoever asks:
Lightning, the LightningModule, the callbacks, the optimizer.

On the CPU every tensor read of a training step is counted, from anywhere, except those of the data pipeline (the
loader, the datamodule's check of the batch before it moves to the device), which read host tensors on a GPU too.
On a GPU (marked gpu) torch.cuda.set_sync_debug_mode counts the synchronizations themselves."""

from __future__ import annotations

import traceback
import warnings
from collections import defaultdict
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import compose_cfg

import minillm.training.train as train_script

READS = ("tolist", "item", "__float__", "__bool__", "__int__", "__index__", "cpu", "numpy")
HOST_SIDE = ("torch/utils/data/", "lightning/pytorch/loops/fetchers.py", "lightning/pytorch/utilities/combined_loader",
             "/minillm/training/data/")  # the data pipeline: host tensors on a GPU as well
# the default GPU path on the CPU: trainer=gpu's bf16-mixed, and what auto picks on a GPU (fused AdamW, chunked loss)
GPU_PATH = ("callbacks=default", "logger=wandb", "trainer.precision=bf16-mixed", "+optimizer.fused=true",
            "module.loss_impl=chunked", "trainer.max_steps=22", "trainer.val_check_interval=22",
            "trainer.log_every_n_steps=10", "test=false")


class StepOf(L.Callback):
    """Keeps the step being trained, for the counts (None outside the training steps)."""
    step = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        StepOf.step = trainer.global_step

    def on_validation_start(self, trainer, pl_module) -> None:
        StepOf.step = None

    def on_train_end(self, trainer, pl_module) -> None:
        StepOf.step = None


def _with_step_of(monkeypatch) -> None:
    init = L.Trainer.__init__
    monkeypatch.setattr(L.Trainer, "__init__", lambda self, *a, callbacks=(), **k: init(
        self, *a, callbacks=[StepOf(), *callbacks], **k))


@pytest.mark.slow  # long (end to end); `-m slow` runs it
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_step_that_logs_nothing_reads_nothing_and_a_logging_step_reads_once(tmp_path, corpus, monkeypatch,
                                                                              compiled):
    reads: dict[int | None, list[str]] = defaultdict(list)

    def counted(name, original):
        def read(self, *args, **kwargs):
            stack = traceback.extract_stack()[:-1]
            if StepOf.step is not None and not any(h in f.filename for f in stack for h in HOST_SIDE):
                where = next(f for f in reversed(stack) if "site-packages/torch/" not in f.filename)
                reads[StepOf.step].append(f"{Path(where.filename).stem}.{name}")
            return original(self, *args, **kwargs)
        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    _with_step_of(monkeypatch)
    extra = ("model.compile=true", "module.compile_backend=aot_eager") if compiled else ()
    train_script.train(compose_cfg(tmp_path, corpus, *GPU_PATH, *extra))
    logging = {9, 19}  # log_every_n_steps=10: the 0-based steps 9 and 19
    assert {s: r for s, r in reads.items() if s not in logging} == {}  # steps 0 and 10 are measured, 20-21 the end
    assert {s: reads[s] for s in logging} == {s: ["reads.tolist"] for s in logging}


def test_the_values_read_once_are_the_values_logged(tmp_path, corpus):
    """The logging step's one read carries the train metrics and the callbacks' values: the CSV has train/loss at
    the logging steps, the stability metrics at the measured steps, the perf metrics at the logging steps (from
    the second: a rate needs two)."""
    from helpers import logged, read_rows

    cfg = compose_cfg(tmp_path, corpus, *GPU_PATH[:2], "logger=csv", *GPU_PATH[3:])
    train_script.train(cfg)
    rows = read_rows(cfg.paths.output_dir)
    assert sorted(logged(rows, "train/loss")) == [9, 19] and sorted(logged(rows, "train/tokens")) == [9, 19]
    assert sorted(logged(rows, "stab/grad_norm")) == [0, 10, 20]
    assert sorted(logged(rows, "perf/tokens_per_s")) == [19]  # a rate needs two logging steps
    assert all(v > 0 for v in logged(rows, "train/loss").values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_step_that_logs_nothing_synchronizes_nothing(tmp_path, corpus, monkeypatch):
    """The same count by CUDA itself: torch.cuda.set_sync_debug_mode warns at every synchronizing call."""
    synced: dict[int | None, list[str]] = defaultdict(list)
    _with_step_of(monkeypatch)
    cfg = compose_cfg(tmp_path, corpus, *GPU_PATH[:3], "trainer.accelerator=gpu", *GPU_PATH[5:])  # auto: fused, chunked
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: synced[StepOf.step].append(
            str(message).splitlines()[0]) if "synchroniz" in str(message) else None)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_script.train(cfg)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    logging = {9, 19}
    assert {s: r for s, r in synced.items() if s is not None and s not in logging} == {}
    assert all(len(synced[s]) <= 1 for s in logging), {s: synced[s] for s in logging}
