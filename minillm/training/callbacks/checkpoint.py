"""Checkpoint: Lightning's ModelCheckpoint that writes nothing once the run has diverged (its end-of-fit save of
last.ckpt included), so best.ckpt and last.ckpt keep the last good weights, or do not exist (the divergence is
RunTotals' ``stopped_early``, set by DivergenceGuard, which judges the steps when their values are read: before a
step checkpoint and at the end of the fit, the device values are read first)."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from minillm import schema
from minillm.training.callbacks.reads import DeviceReads
from minillm.training.callbacks.run_totals import RunTotals


class Checkpoint(ModelCheckpoint):
    """ModelCheckpoint (same arguments) that stops saving when the run diverged."""

    def _diverged(self, trainer: L.Trainer) -> bool:
        return bool(RunTotals.of(trainer).get(schema.STOPPED_EARLY))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        every = self._every_n_train_steps
        if every and trainer.global_step % every == 0:  # a step checkpoint is due: the steps not judged yet first
            DeviceReads.of(trainer).read(trainer)
        if not self._diverged(trainer):
            super().on_train_batch_end(trainer, pl_module, *args, **kwargs)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._diverged(trainer):
            super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._diverged(trainer):
            super().on_validation_end(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Lightning's save of last.ckpt at the end of a fit that has not written one: not for a run that diverged
        (before its first validation, it then has no last.ckpt rather than non-finite weights)."""
        DeviceReads.of(trainer).read(trainer)  # the steps not judged yet first
        if not self._diverged(trainer):
            super().on_train_end(trainer, pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not self._diverged(trainer):
            super().on_exception(trainer, pl_module, exception)
