"""Throughput, MFU and data-wait metrics, logged during training (a Lightning callback).

    perf/tokens_per_s         training tokens per second over all processes (over the last log interval)
    perf/tokens_per_s_device  the same per process
    perf/flops_per_s_device   model FLOPs per second per process (FLOPs of one batch x batches / time)
    perf/mfu                  flops_per_s_device / the device's peak (``peak_flops``, else ``device_peak_flops``);
                              not logged where no peak is known (CPUs)
    perf/data_wait_frac       fraction of the step time outside the step: from one batch's end to the next
                              batch's start (fetching the batch, moving it to the device, loop bookkeeping);
                              host-side, so on a GPU it is an upper bound of the time the device starves

Counting uses Lightning's own tools: ``measure_flops`` (torch's FlopCounterMode: matmuls and attention,
forward + backward) on a meta-device copy of the model for one batch, ``Throughput`` for the windowed rates
and ``get_available_flops`` for the device peak, with minillm's own table for cards Lightning's lacks.
``analytic_flops_per_token`` is the usual 6N + attention estimate, the fallback and a cross-check.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.throughput import Throughput, get_available_flops, measure_flops
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from minillm.errors import check_bool, check_number
from minillm.metrics import DATA_WAIT_FRAC, FLOPS_PER_S_DEVICE, MFU, TOKENS_PER_S, TOKENS_PER_S_DEVICE
from minillm.model import ModelConfig, Transformer
from minillm.training.callbacks.common import Observer
from minillm.training.callbacks.reads import DeviceReads, logging_step


def meta_model(cfg: ModelConfig) -> Transformer:
    """The model on the meta device, for counting: its construction warnings were already given by the real
    model's (e.g. batchnorm stats='pooled')."""
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Transformer(cfg)


# dense bf16/fp16 FLOP/s from the vendors' datasheets, for cards Lightning's table lacks (Lightning 2.6.6 has no
# H200); the first name contained in the device's name wins, so "H100 PCIe" is matched before "H100"
PEAK_DENSE_HALF = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200 NVL": 835e12, "H200": 989e12,
                   "A100": 312e12}


def device_peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The device's peak FLOP/s for ``dtype``: Lightning's table, else PEAK_DENSE_HALF for a CUDA device in bf16
    or fp16; None where neither knows it (CPUs). The one place every MFU in minillm takes its peak from."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning warns about a device it does not know
        peak = get_available_flops(device, dtype)
    if peak:
        return float(peak)
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_DENSE_HALF.items() if k in name), None)


def analytic_flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = False) -> float:
    """Training FLOPs per token: 6 N (N: parameters of the matmuls, LM head included, embedding not) plus
    attention. ``causal=False``: 12 L C T, QK^T and AV over all T keys, the convention of PaLM's MFU, nanoGPT and
    FlopCounterMode (so of ``perf/mfu``); ``causal=True``: 6 L C (T + 1), only the keys a causal mask keeps (a
    query at position t sees t keys: (T + 1) / 2 on average), the work a causal kernel actually does."""
    model = meta_model(cfg)
    n_matmul = sum(p.numel() for n, p in model.named_parameters()
                   if p.ndim == 2 and not n.startswith("tok_emb"))
    attention = 6 * cfg.n_layers * cfg.dim * (seq_len + 1) if causal else 12 * cfg.n_layers * cfg.dim * seq_len
    return 6 * n_matmul + attention


def measured_flops_per_batch(cfg: ModelConfig, batch_size: int, seq_len: int) -> int:
    """Forward + backward FLOPs of one (batch_size, seq_len) batch, counted on the meta device."""
    model = meta_model(cfg)
    with torch.device("meta"):
        x = torch.zeros(batch_size, seq_len, dtype=torch.long)
    loss = lambda logits: F.cross_entropy(logits.flatten(0, 1), x.flatten())
    return measure_flops(model, lambda: model(x), loss)


def _compute_dtype(precision: str) -> torch.dtype:
    if "bf16" in precision:
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float64 if precision.startswith("64") else torch.float32


class PerfMonitor(Observer):
    """Logs the ``perf/*`` metrics of this module's docstring every ``trainer.log_every_n_steps`` steps.

    Per step it only reads a clock twice; on logging steps the clock is read after the step's one device read
    (DeviceReads: a synchronization, so the time includes the queued work). FLOPs per batch are counted once, when
    training starts. Validation is not counted.
    ``peak_flops`` overrides the device peak (FLOP/s per device; e.g. a CPU's measured matmul peak).
    """

    def __init__(self, peak_flops: float | None = None, count_flops: bool = True):
        check_number("callbacks.perf.peak_flops", peak_flops, low=0.0, low_open=True, optional=True)
        check_bool("callbacks.perf.count_flops", count_flops)
        self.peak_flops, self.count_flops = peak_flops, count_flops
        self.flops_per_batch: int | None = None
        self.available_flops: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._throughput: Throughput | None = None
        self._busy = self._wait = 0.0  # seconds inside steps / between steps, since training started
        self._wait_logged = self._busy_logged = 0.0
        self._t_start: float | None = None
        self._t_end: float | None = None  # end of the previous step; None after validation or at the start
        self._batches = self._samples = self._tokens = self._batches_logged = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset()
        self._throughput = Throughput(world_size=trainer.world_size, window_size=2)
        self.available_flops = self.peak_flops or device_peak_flops(
            trainer.strategy.root_device, _compute_dtype(str(trainer.precision)))

    def _flops(self, pl_module: L.LightningModule, batch: Any) -> int | None:
        x = batch[0]
        cfg = getattr(getattr(pl_module, "model", None), "cfg", None)
        if cfg is None or not self.count_flops:
            return None
        try:
            return measured_flops_per_batch(cfg, x.shape[0], x.shape[1])
        except Exception as err:  # e.g. a kernel without a meta implementation: the analytic estimate
            rank_zero_warn(f"perf: measure_flops failed ({type(err).__name__}: {err}); using 6N + attention")
            return int(analytic_flops_per_token(cfg, x.shape[1]) * x.numel())

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.flops_per_batch is None and self.count_flops:
            self.flops_per_batch = self._flops(pl_module, batch) or 0  # before the clock: not counted as wait
        self._t_start = time.perf_counter()
        if self._t_end is not None:
            self._wait += self._t_start - self._t_end

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        x = batch[0]
        self._batches += 1
        self._samples += x.shape[0]
        self._tokens += x.numel()
        if logging_step(trainer, batch_idx):  # the clock after the step's one device read: the queued work is done
            DeviceReads.of(trainer).after_read(lambda: self._step_end(trainer, log=True))
        else:
            self._step_end(trainer, log=False)

    def _step_end(self, trainer: L.Trainer, log: bool) -> None:
        self._t_end = time.perf_counter()
        self._busy += self._t_end - self._t_start
        if log:
            self._log(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t_end = None  # the gap across a validation is not data wait

    @rank_zero_only
    def _log(self, trainer: L.Trainer) -> None:
        tp = self._throughput
        new_batches, self._batches_logged = self._batches - self._batches_logged, self._batches
        flops = self.flops_per_batch * new_batches if self.flops_per_batch else None  # since the last update
        tp.update(time=self._busy + self._wait, batches=self._batches, samples=self._samples,
                  lengths=self._tokens, flops=flops)
        m = tp.compute()
        metrics: dict[str, float] = {}
        if "device/items_per_sec" in m:
            metrics[TOKENS_PER_S_DEVICE] = m["device/items_per_sec"]
            metrics[TOKENS_PER_S] = m.get("items_per_sec", m["device/items_per_sec"])
        if "device/flops_per_sec" in m:
            metrics[FLOPS_PER_S_DEVICE] = m["device/flops_per_sec"]
            if self.available_flops:
                metrics[MFU] = m["device/flops_per_sec"] / self.available_flops
        d_wait, d_busy = self._wait - self._wait_logged, self._busy - self._busy_logged
        if d_wait + d_busy > 0 and self._batches > 1:
            metrics[DATA_WAIT_FRAC] = d_wait / (d_wait + d_busy)
        self._wait_logged, self._busy_logged = self._wait, self._busy
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step - 1)
