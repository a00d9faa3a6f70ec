"""Small helpers the callbacks share: step index, run totals, logging to every logger, and Observer, the
base of the callbacks that only watch (their failure never stops training)."""

from __future__ import annotations

import functools
import logging
from typing import Any

import lightning as L
from torch import Tensor

log = logging.getLogger("minillm")
HOOKS = tuple(name for name in vars(L.Callback) if name.startswith("on_") or name in ("setup", "teardown"))


class Observer(L.Callback):
    """A callback that logs or measures and never steers training: an exception in one of its hooks is
    reported once (a warning with the error; the traceback at debug level), the callback turns itself off
    for the rest of the run (``release`` undoes what it left attached to the model, such as forward hooks),
    and training goes on. The failure is kept in ``failure`` (``"<hook>: <error>"``), which summary.json
    lists under ``callback_errors``. The callbacks that steer the run (DivergenceGuard, the preemption
    checkpoint, ModelCheckpoint) and RunSummary are not Observers: their errors stop the run as usual.
    Under DDP a hook that fails on one process only leaves that process's copy off."""

    failure: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in HOOKS:  # the hooks this class defines or inherits from a Lightning callback
            hook = getattr(cls, name, None)
            if hook is not None and hook is not getattr(L.Callback, name) and not getattr(hook, "_guarded", False):
                setattr(cls, name, _guarded(name, hook))

    def release(self, pl_module: L.LightningModule | None) -> None:
        """Undo what a failed hook may have left attached (forward hooks, eager mode); nothing by default."""


def _guarded(name: str, hook: Any) -> Any:
    @functools.wraps(hook)
    def call(self: Observer, *args: Any, **kwargs: Any) -> Any:
        if self.failure is not None:
            return None
        try:
            return hook(self, *args, **kwargs)
        except Exception as err:  # not KeyboardInterrupt / SystemExit (Lightning's stop signals)
            self.failure = f"{name}: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
            log.warning(f"callback {type(self).__name__} failed in {self.failure}; it is off for the rest of "
                        "this run, training goes on")
            log.debug("where it failed", exc_info=err)
            pl_module = next((a for a in args if isinstance(a, L.LightningModule)), None)
            try:
                self.release(pl_module)
            except Exception as cleanup_err:
                log.debug("release after the failure failed too", exc_info=cleanup_err)
            return None

    call._guarded = True  # type: ignore[attr-defined]
    return call


def eager(pl_module: L.LightningModule, requester: object, on: bool) -> None:
    """Ask the module to run uncompiled (or take the request back) while the requester's hooks are attached;
    a module without compilation (no ``run_eagerly``) runs eagerly anyway."""
    if hasattr(pl_module, "run_eagerly"):
        pl_module.run_eagerly(requester, on)


def last_step(trainer: L.Trainer) -> int:
    """0-based index of the last optimizer step taken: the ``step`` of its row in csv/metrics.csv."""
    return max(trainer.global_step - 1, 0)


def find_callback(trainer: L.Trainer, kind: type) -> Any:
    return next((c for c in trainer.callbacks if isinstance(c, kind)), None)


def log_metrics(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def train_loss(outputs: Any, trainer: L.Trainer) -> Tensor | None:
    """The micro-batch's train/loss: ``ce`` of minillm's training_step (the cross entropy, without z-loss), else
    the loss another module returned, which Lightning hands on_train_batch_end divided by
    trainer.accumulate_grad_batches (what the backward uses), so it is multiplied back."""
    if isinstance(outputs, dict) and isinstance(outputs.get("ce"), Tensor):
        return outputs["ce"]
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if not isinstance(loss, Tensor):
        return None
    accumulate = getattr(trainer, "accumulate_grad_batches", 1)
    return loss * accumulate if isinstance(accumulate, int) and accumulate > 1 else loss

