"""NormHistograms: W&B histograms of every norm's gain and of the activations it normalizes."""

from __future__ import annotations

from functools import partial
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import WandbLogger
from torch import Tensor, nn

from minillm.errors import check_int
from minillm.metrics import hist_metric
from minillm.training.callbacks.common import Observer, eager, last_step
from minillm.training.callbacks.probe import NORM_TYPES
from minillm.training.callbacks.reads import DeviceReads

BINS = 64


def histogram(values: Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(counts, bin edges) of the finite values, in float64; None when there is none. Constant values (a gain
    that has not moved yet) or values a float32 step apart get one bin of width 1e-6 around them instead of
    numpy's refusal; non-finite values (a diverged run) are left out."""
    if isinstance(values, Tensor):
        values = values.detach().double().cpu().numpy()
    data = np.asarray(values, dtype=np.float64).reshape(-1)
    data = data[np.isfinite(data)]
    if data.size == 0:
        return None
    low, high = float(data.min()), float(data.max())
    if high - low < 1e-6 * max(1.0, abs(low), abs(high)):
        half = 5e-7 * max(1.0, abs(low))
        counts, edges = np.histogram(data, bins=1, range=(low - half, high + half))
    else:
        counts, edges = np.histogram(data, bins=BINS, range=(low, high))
    return counts, edges


class NormHistograms(Observer):
    """Every ``every_n_steps`` steps, per norm site: a histogram of the effective gain and one of a sample of
    the inputs (``max_values`` values of the step's first micro-batch). W&B only: without a W&B logger it does
    nothing (the CSV log has the sites' summary statistics, ``norm/<site>/...``). Non-finite values are left
    out of a histogram; a site whose values are all non-finite logs none. The values stay on the device until the
    next logging step reads them with everything else (DeviceReads)."""

    def __init__(self, every_n_steps: int = 200, max_values: int = 4096):
        check_int("callbacks.histograms.every_n_steps", every_n_steps, low=1)
        check_int("callbacks.histograms.max_values", max_values, low=1)
        self.every_n_steps, self.max_values = every_n_steps, max_values
        self._handles: list = []
        self._inputs: dict[str, Tensor] = {}

    @staticmethod
    def _wandb(trainer: L.Trainer) -> WandbLogger | None:
        return next((lg for lg in trainer.loggers if isinstance(lg, WandbLogger)), None)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._handles or trainer.global_step % self.every_n_steps or not trainer.is_global_zero:
            return
        if self._wandb(trainer) is None:
            return
        model = getattr(pl_module, "model", pl_module)
        for name, module in model.named_modules():
            if isinstance(module, NORM_TYPES):
                self._handles.append(module.register_forward_pre_hook(partial(self._keep_input, name)))
        eager(pl_module, self, True)

    @torch.no_grad()
    def _keep_input(self, name: str, module: nn.Module, args: tuple) -> None:
        if name not in self._inputs:  # the first micro-batch's
            self._inputs[name] = args[0].detach().flatten()[: self.max_values].float().clone()  # not a view

    def release(self, pl_module: L.LightningModule | None) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if pl_module is not None:
            eager(pl_module, self, False)  # a compiled model runs compiled again

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._handles or (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        self.release(pl_module)
        model, step, reads = getattr(pl_module, "model", pl_module), last_step(trainer), DeviceReads.of(trainer)
        host: dict[str, np.ndarray] = {}
        for name, module in model.named_modules():
            if name not in self._inputs:
                continue
            gain = module.gain() if hasattr(module, "gain") else getattr(module, "weight", None)
            for kind, values in (("input", self._inputs[name]), ("gain", gain)):
                if values is not None:
                    key = hist_metric(name, kind)
                    reads.put(values.detach().float().flatten(), lambda v, key=key: host.__setitem__(key, v))
        self._inputs.clear()
        reads.after_read(lambda: self._log(trainer, host, step))

    def _log(self, trainer: L.Trainer, host: dict[str, Any], step: int) -> None:
        import wandb

        logged = {key: wandb.Histogram(np_histogram=hist) for key, values in host.items()
                  if (hist := histogram(np.atleast_1d(values))) is not None}
        self._wandb(trainer).experiment.log({**logged, "trainer/global_step": step})
