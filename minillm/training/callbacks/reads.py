"""DeviceReads: every value the training loop needs from the device, read in one transfer on the steps that log.

On a GPU, reading a tensor on the host (``.item()``, ``.tolist()``, ``float()``, ``.cpu()``) waits for every kernel
queued before it: a host synchronization. One per step keeps the host from running ahead of the GPU, and several
per step (a progress bar's loss, a divergence check, a spike detector, the logged metrics) each wait again. So the
callbacks and the LightningModule do not read: they ``put`` a device tensor with the function that will receive
its value, and the trainer's DeviceReads reads everything put since the last read in one transfer, at the end of
the steps that log (``logging_step``: every trainer.log_every_n_steps optimizer steps, Lightning's own cadence),
then hands each value over in the order it was put (step by step, so a detector sees the steps in order and logs
each at its own step index). A step that logs nothing reads nothing. ``read(trainer)`` reads at once: before a
validation or a checkpoint, at the end of training, or every step for a callback that must act on the step it
measures (``urgent``; e.g. a spike capture that keeps the last steps).

``DeviceReads.of(trainer)`` gives the trainer's, made on first use and added as the trainer's last callback, so
it reads after every other callback has put its values for the step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor


def step_ended(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether the micro-batch batch_idx (at on_train_batch_end) is the last of its optimizer step."""
    accumulate = getattr(trainer, "accumulate_grad_batches", 1)
    return (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == getattr(trainer, "num_training_batches", None)


def logging_step(trainer: L.Trainer, batch_idx: int, stepped: bool = True) -> bool:
    """Whether the optimizer step that ends with micro-batch batch_idx is one whose metrics are logged: every
    trainer.log_every_n_steps steps, the 0-based steps N - 1, 2N - 1, ... (Lightning's cadence). ``stepped``: asked
    after the optimizer step (on_train_batch_end), else before it (training_step), when global_step is one less."""
    every = max(int(getattr(trainer, "log_every_n_steps", 1) or 1), 1)
    return step_ended(trainer, batch_idx) and (trainer.global_step + (not stepped)) % every == 0


class DeviceReads(L.Callback):
    """The device values put since the last read, and the functions that receive them (module docstring)."""

    def __init__(self) -> None:
        self._pending: list[tuple[Tensor, Callable[[Any], None]]] = []
        self._after: list[Callable[[], None]] = []
        self._urgent = False
        self.reads = 0  # transfers made (each one a host synchronization on a GPU)

    @staticmethod
    def of(trainer: L.Trainer) -> DeviceReads:
        found = next((c for c in trainer.callbacks if isinstance(c, DeviceReads)), None)
        if found is None:
            found = DeviceReads()
            trainer.callbacks.append(found)  # the last callback: it reads after the others have put their values
        return found

    def put(self, value: Tensor, receive: Callable[[Any], None], urgent: bool = False) -> None:
        """Receive ``value`` at the next read: a float for a one-element tensor, else a numpy array of its shape;
        ``urgent``: read at the end of this step even if it logs nothing."""
        self._pending.append((value.detach(), receive))
        self._urgent |= urgent

    def after_read(self, fn: Callable[[], None]) -> None:
        """Call fn after the next read, once every value is handed over (when nothing was put, after a device
        synchronization in its place: a clock read then includes the queued work)."""
        self._after.append(fn)

    def read(self, trainer: L.Trainer | None = None) -> None:
        """Read every pending value in one transfer and hand each over, in the order they were put."""
        pending, after, self._pending, self._after, self._urgent = self._pending, self._after, [], [], False
        if pending:
            device = pending[0][0].device
            flat = torch.cat([v.reshape(-1).to(device=device, dtype=torch.float32) for v, _ in pending])
            values = flat.tolist()  # the one transfer (and wait) for all of them
            self.reads += 1
            start = 0
            for value, receive in pending:
                part = values[start:start + value.numel()]
                start += value.numel()
                receive(part[0] if value.numel() == 1 else np.asarray(part, dtype=np.float32).reshape(value.shape))
        elif after and trainer is not None and trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
            self.reads += 1
        for fn in after:
            fn()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._urgent or (logging_step(trainer, batch_idx) and (self._pending or self._after)):
            self.read(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.read(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.read(trainer)
