"""Progress output: a rich bar on a terminal, plain log lines elsewhere (a SLURM .out file, nohup, CI).

``progress_bar(mode="auto")`` picks by whether stdout is a terminal. The plain lines go through logging (so
they are in train.log too), on the steps that log metrics (every trainer.log_every_n_steps), at most every
``interval_s`` seconds, plus the first of those steps and the end of training. Neither reads the device on any
other step: the train loss they show is read with the step's other values (DeviceReads).

    step 400/1600 (25%) | train/loss 1.9310 | lr 2.97e-03 | 14.6k tok/s | elapsed 0:01:02 | ETA 0:03:07

Both report each validation as a log line (``validation after step 400: val/loss 1.9310, ...``).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar

from minillm import _compat
from minillm.errors import check_choice, check_number
from minillm.metrics import TRAIN_LOSS
from minillm.training.callbacks.common import Observer, train_loss
from minillm.training.callbacks.reads import DeviceReads, logging_step

log = logging.getLogger("minillm.progress")
MODES = ("auto", "rich", "plain")


def progress_bar(mode: str = "auto", interval_s: float = 30.0) -> ProgressBar:
    """The rich bar on a terminal (mode auto or rich), else plain log lines (auto or plain)."""
    check_choice("callbacks.progress_bar.mode", mode, MODES)
    check_number("callbacks.progress_bar.interval_s", interval_s, low=0.0)
    rich = mode == "rich" or (mode == "auto" and sys.stdout.isatty())
    return RichBar() if rich else LogProgress(interval_s)


def log_validation(trainer: L.Trainer) -> None:
    """One line with the validation metrics just computed (rank 0, not during the sanity check)."""
    if trainer.sanity_checking or not trainer.is_global_zero:
        return
    values = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    if values:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(values.items()))
        log.info(f"validation after step {trainer.global_step}: {shown}")


class _Current:
    """Writes to whatever ``sys.<name>`` is at that moment: while rich's live display runs, that is its proxy,
    which prints above the bar (a handler that kept the original stream would print into the bar's line)."""

    def __init__(self, name: str):
        self.name = name

    def write(self, text: str) -> int:
        return getattr(sys, self.name).write(text)

    def flush(self) -> None:
        getattr(sys, self.name).flush()


def follow_console(logger: logging.Logger | None = None) -> None:
    """Point the logger's console handlers (the root logger's: Hydra's, hence minillm's and Lightning's lines)
    at the current sys.stdout / sys.stderr instead of the stream they were made with."""
    for handler in (logger or logging.getLogger()).handlers:
        if type(handler) is logging.StreamHandler:
            for name in ("stdout", "stderr"):
                if handler.stream in (getattr(sys, name), getattr(sys, f"__{name}__")):
                    handler.setStream(_Current(name))


@_compat.label_training_by_steps
class RichBar(RichProgressBar, Observer):
    """Lightning's rich progress bar, for runs that train by steps: the label is "Epoch N", not "Epoch N/-2",
    and the bar counts the optimizer steps of the whole run, ``global_step / max_steps`` (Lightning's counts
    this epoch's batches against the steps left, which reads 940/61 after a resume mid-epoch and mixes
    micro-batches with steps under gradient accumulation). Log lines print above the bar."""

    _shown: dict[str, float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown = {}  # the train loss of the last logging step

    def _by_steps(self) -> bool:
        trainer = self.trainer
        return trainer.max_epochs is not None and trainer.max_epochs < 0 and (trainer.max_steps or 0) > 0

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps if self._by_steps() else super().total_train_batches

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        follow_console()
        super().on_train_start(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._by_steps() and self.progress is not None and self.train_progress_bar_id is not None:
            self.progress.update(self.train_progress_bar_id, completed=trainer.global_step)
        loss = train_loss(outputs, trainer)
        if loss is not None and logging_step(trainer, batch_idx):  # the loss shown: read with the step's values
            DeviceReads.of(trainer).put(loss, lambda v: self._shown.update({TRAIN_LOSS: v}))

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        return {**super().get_metrics(trainer, pl_module), **self._shown}

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        log_validation(trainer)


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(max(seconds, 0.0))))


class LogProgress(ProgressBar, Observer):
    """Plain progress lines for logs that are not a terminal (it also stands in for Lightning's own bar)."""

    def __init__(self, interval_s: float = 30.0):
        super().__init__()
        self.interval_s = interval_s
        self._enabled = True
        self._t0 = self._t_line = 0.0
        self._step0 = self._step_line = 0
        self._tokens = 0
        self._t_val: float | None = None
        self._last_loss: Any = None  # the last step's train loss, on the device

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t0 = self._t_line = time.monotonic()
        self._step0 = self._step_line = trainer.global_step  # > 0 when resumed
        self._tokens = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        self._tokens += x.numel() * trainer.world_size
        self._last_loss = train_loss(outputs, trainer)
        now = time.monotonic()
        due = self._step_line == self._step0 or now - self._t_line >= self.interval_s
        if (self._enabled and trainer.is_global_zero and due and logging_step(trainer, batch_idx)
                and self._last_loss is not None):
            self._line(trainer, self._last_loss, now)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The last line, when the last step's is not printed yet (read at the end: no step waits for it)."""
        pending = trainer.global_step > self._step_line and self._last_loss is not None
        if self._enabled and trainer.is_global_zero and pending:
            self._line(trainer, self._last_loss, time.monotonic())

    def _line(self, trainer: L.Trainer, loss: Any, now: float) -> None:
        """Log the line of this step once its loss is read (with the step's other values)."""
        step, tokens, t_line = trainer.global_step, self._tokens, self._t_line
        self._t_line, self._step_line, self._tokens = now, step, 0
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else math.nan

        def show(value: float) -> None:
            rate = tokens / max(now - t_line, 1e-9)
            per_step = (now - self._t0) / max(step - self._step0, 1)
            total = trainer.max_steps if trainer.max_steps > 0 else step
            log.info(f"step {step}/{total} ({100 * step / total:.0f}%) | train/loss {value:.4f} | lr {lr:.2e} | "
                     f"{rate / 1e3:.1f}k tok/s | elapsed {_clock(now - self._t0)} | "
                     f"ETA {_clock(per_step * (total - step))}")

        DeviceReads.of(trainer).put(loss, show)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t_val = time.monotonic()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._t_val is not None:  # tokens/s counts training time only
            self._t_line += time.monotonic() - self._t_val
            self._t_val = None
        log_validation(trainer)
