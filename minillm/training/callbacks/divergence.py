"""DivergenceGuard: a diverging run stops cleanly and is marked diverged (divergence is a result)."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.nn.utils import get_total_norm

from minillm import schema
from minillm.errors import check_bool, check_int, check_number
from minillm.metrics import DIVERGED
from minillm.training.callbacks.common import last_step, log_metrics, train_loss
from minillm.training.callbacks.reads import DeviceReads, step_ended
from minillm.training.callbacks.run_totals import RunTotals


def weights_norm(module: nn.Module) -> Tensor:
    """The 2-norm of all parameters, fp32, without a device sync: fused (torch's foreach norms), it is finite
    whenever every weight is; a non-finite norm (NaN or inf somewhere, or a huge but finite weight whose square
    overflows) is confirmed by params_finite."""
    params = [p.detach() for p in module.parameters()]
    return get_total_norm(params, 2.0).float() if params else torch.zeros(())


def params_finite(module: nn.Module, norm: float | None = None) -> bool:
    """True when every parameter of module is finite: weights_norm (or ``norm``, its value already read) when it
    is finite, else element by element."""
    norm = float(weights_norm(module)) if norm is None else norm
    return math.isfinite(norm) or all(bool(p.isfinite().all()) for p in module.parameters())


class DivergenceGuard(L.Callback):
    """Ends a diverging run cleanly: it stops, is marked diverged (step, reason), and the process goes on.

    Judged on every optimizer step, on the mean train loss of its micro-batches. Diverged: a non-finite train loss,
    non-finite weights after an optimizer step (``check_weights``: one fused norm of the weights per step, see
    weights_norm; also checked before validations and at the end), or a train loss above the ceiling for
    ``patience`` consecutive optimizer steps (ceiling = ``max_loss``, or ``max_loss_factor * ln(vocab_size)`` when
    max_loss is null). The values stay on the device until the steps that log read them with everything else
    (DeviceReads): every step is judged, in order, at the next logging step (or before a validation, a checkpoint,
    the end), so a run stops at most trainer.log_every_n_steps - 1 steps after the step that diverged, which
    ``diverged_step`` names. ``every_n_steps`` reads them every that many steps instead (1: every step, a host
    synchronization each on a GPU). The verdict goes to RunTotals (``stopped_early``, ``diverged_step``,
    ``diverged_reason``), where summary.json and minillm's checkpoint callback read it: after a divergence no
    checkpoint is written, so best.ckpt / last.ckpt keep the last good weights.
    """

    def __init__(self, max_loss: float | None = None, max_loss_factor: float | None = 1.5, patience: int = 20,
                 check_weights: bool = True, every_n_steps: int | None = None):
        check_int("callbacks.divergence.every_n_steps", every_n_steps, low=1, optional=True)
        self.every_n_steps = every_n_steps
        check_number("callbacks.divergence.max_loss", max_loss, low=0.0, low_open=True, optional=True)
        check_number("callbacks.divergence.max_loss_factor", max_loss_factor, low=0.0, low_open=True, optional=True)
        check_int("callbacks.divergence.patience", patience, low=1)
        check_bool("callbacks.divergence.check_weights", check_weights)
        self.max_loss, self.max_loss_factor = max_loss, max_loss_factor
        self.patience, self.check_weights = patience, check_weights
        self.ceiling: float | None = max_loss
        self.diverged, self.step, self.reason = False, None, None
        self._over, self._step = 0, 0
        self._losses: list[Tensor] = []  # the micro-batches' losses of the step in progress
        self._judged: dict[int, list[float]] = {}  # step -> [loss (, weights norm)] as they arrive from the device

    def state_dict(self) -> dict[str, Any]:
        """Consecutive steps above the ceiling so far (and the verdict), so a resumed run keeps counting."""
        return {"over": self._over, "diverged": self.diverged, "step": self.step, "reason": self.reason}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._over, self.diverged = state["over"], state["diverged"]
        self.step, self.reason = state["step"], state["reason"]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        cfg = getattr(getattr(pl_module, "model", None), "cfg", None)
        if self.max_loss is None and self.max_loss_factor is not None and cfg is not None:
            self.ceiling = self.max_loss_factor * math.log(cfg.vocab_size)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = train_loss(outputs, trainer)
        if loss is None or self.diverged:
            return
        self._losses.append(loss.detach().float())
        if not step_ended(trainer, batch_idx):
            return  # the step goes on: judged on its micro-batches' mean, after its optimizer step
        step_loss, self._losses = torch.stack(self._losses).mean(), []
        step, reads = self._step, DeviceReads.of(trainer)
        now = self.every_n_steps is not None and (step + 1) % self.every_n_steps == 0  # else: at the next logging step
        reads.put(step_loss, lambda v: self._judge(trainer, pl_module, step, v), urgent=now)
        if self.check_weights:
            reads.put(weights_norm(pl_module), lambda v: self._judge(trainer, pl_module, step, v))

    def _judge(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, value: float) -> None:
        """One step's verdict, once its values (the loss, and the weights' norm with check_weights) are read."""
        got = self._judged.setdefault(step, [])
        got.append(value)
        if len(got) < 1 + self.check_weights:
            return
        del self._judged[step]
        if self.diverged:  # the steps after the one that tripped
            return
        value, *norm = got
        reason = None
        if not math.isfinite(value):
            reason = f"non-finite train loss ({value})"
        elif self.check_weights and not params_finite(pl_module, norm[0]):
            reason = "non-finite weights after the optimizer step"
        elif self.ceiling is not None and value > self.ceiling:
            self._over += 1
            if self._over >= self.patience:
                reason = f"train loss above {self.ceiling:.4g} for {self._over} consecutive steps"
        else:
            self._over = 0
        # every process stops at the same step (losses are per process): one all-reduce under DDP
        if trainer.world_size > 1 and trainer.strategy.reduce_boolean_decision(reason is not None, all=False):
            reason = reason or "another process diverged"
        if reason is not None:
            self.trip(trainer, reason, step)

    def _check_weights(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Safety net before anything can save a checkpoint: the steps not judged yet first (the per-step check
        is in on_train_batch_end), then the weights as they are."""
        DeviceReads.of(trainer).read(trainer)
        if self.check_weights and not self.diverged and not params_finite(pl_module):
            self.trip(trainer, "non-finite weights", last_step(trainer))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._check_weights(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_weights(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_weights(trainer, pl_module)

    def trip(self, trainer: L.Trainer, reason: str, step: int | None = None) -> None:
        """Mark the run diverged at ``step`` (default: the current one; in RunTotals too) and stop it."""
        step = self._step if step is None else step
        self.diverged, self.step, self.reason = True, step, reason
        trainer.should_stop = True
        totals = RunTotals.of(trainer)
        totals.set(schema.STOPPED_EARLY, True)
        totals.set(schema.DIVERGED_STEP, step)
        totals.set("diverged_reason", reason)
        log_metrics(trainer, {DIVERGED: 1.0}, step)
        rank_zero_warn(f"run diverged at step {step}: {reason}; stopping, checkpoints kept as they are")

