"""StabilityMonitor: the stability metrics, logged from outside the model, and the loss-spike detector.

Everything is measured from outside the model: forward hooks registered only on the steps
that are measured and removed right after, gradient and weight reads around the optimizer step.

The names are those of minillm/metrics.py (``stab/...``, ``layer/<i>/...``, ``norm/<site>/...``), logged through
``trainer.loggers`` at the index of the optimizer step they describe (the same step as ``train/loss``);
docs/definitions.md says what each one measures.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import get_total_norm

from minillm import _compat, schema
from minillm.errors import check_bool, check_int, check_number
from minillm.metrics import (
    AMP_SCALE,
    AMP_SKIPPED_STEPS,
    GRAD_NONFINITE,
    GRAD_NORM,
    GRAD_NORM_SPIKE_SCORE,
    GRAD_NORM_SPIKES,
    LOG_Z_MAX,
    LOSS_SPIKE_SCORE,
    LOSS_SPIKES,
    MAX_ABS_H,
    MAX_ATTN_LOGIT,
    OUTPUT_CHANGE,
    TRAIN_LOSS,
    UPDATE_RATIO,
    layer_metric,
)
from minillm.training.callbacks.common import Observer, eager, find_callback, log_metrics, train_loss
from minillm.training.callbacks.probe import ActivationProbe
from minillm.training.callbacks.reads import DeviceReads
from minillm.training.callbacks.run_totals import RunTotals
from minillm.training.callbacks.spike import SpikeCapture

_GRAD_TOTAL = "_grad_total"  # the step's total gradient norm, for the gradient-norm spike detector (not logged)


class LossSpikeDetector:
    """Score each loss against the previous ``window`` finite losses: (loss - mean) / max(std, floor), the floor
    ``min_std`` (in the value's units: nats for a loss) or, with ``relative``, ``min_std * |mean|`` (for a
    series of any scale, such as the gradient norm), so a flat history does not make every wiggle a spike.

    A loss is a spike when its score exceeds k; scores need ``min_history`` losses first (NaN before).
    Non-finite losses are not scored (they are divergence, DivergenceGuard's business).
    """

    def __init__(self, window: int = 50, k: float = 4.0, min_history: int = 10, min_std: float = 1e-3,
                 relative: bool = False):
        check_int("callbacks.stability.spike_window", window, low=2)
        check_int("callbacks.stability.spike_min_history", min_history, low=2, high=window)
        check_number("callbacks.stability.spike_k", k, low=0.0, low_open=True)
        self.k, self.min_history, self.min_std, self.relative = k, min_history, min_std, relative
        self.history: deque[float] = deque(maxlen=window)
        self.count = 0

    def update(self, loss: float) -> tuple[float, bool]:
        """Score loss against the history, then add it; returns (score, is_spike)."""
        if not math.isfinite(loss):
            return float("nan"), False
        score = float("nan")
        if len(self.history) >= self.min_history:
            n = len(self.history)
            mean = math.fsum(self.history) / n
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in self.history) / n)
            floor = self.min_std * abs(mean) if self.relative else self.min_std
            score = (loss - mean) / max(std, floor, 1e-30)
        self.history.append(loss)
        spike = score > self.k
        self.count += spike
        return score, spike

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.clear()
        self.history.extend(state["history"])
        self.count = state["count"]


def spike_scores(losses: Iterable[float], **kwargs) -> tuple[list[float], list[bool]]:
    """Scores and spike flags of a whole loss series (LossSpikeDetector options as keywords)."""
    det = LossSpikeDetector(**kwargs)
    scores, spikes = zip(*(det.update(float(v)) for v in losses), strict=True) if losses else ((), ())
    return list(scores), list(spikes)





class StabilityMonitor(Observer):
    """Logs the stability metrics listed in this module's docstring.

    Cheap metrics (gradient norms, weight norms, residual and norm-site statistics, log Z, update ratio) every
    ``every_n_steps`` optimizer steps; the attention probe (max logit, entropy) every ``probe_every_n_steps``; the
    loss-spike and gradient-norm-spike scores and the GradScaler bookkeeping every step (scalar reads: the loss and
    the gradient norm in one). With a SpikeCapture (``callbacks.spike``) on, every step it keeps is measured too,
    the attention probe included, and handed to it; those steps are logged only on the regular cadence. Hooks exist
    only during the
    measured steps, so other steps run the model untouched; with ``model.compile=true`` the measured steps run
    the model uncompiled (``LitLM.run_eagerly``), because hooks added to a compiled model are never called.
    ``output_change`` runs the model twice more on the first ``probe_batch_size`` sequences of a measured step,
    in eval mode and without gradients, before and after the optimizer step (BatchNorm uses its running
    statistics there and does not update them).
    """

    def __init__(self, every_n_steps: int = 10, probe_every_n_steps: int | None = 100,
                 probe_batch_size: int = 4, update_ratio: bool = True, output_change: bool = False,
                 spike_window: int = 50, spike_k: float = 4.0, spike_min_history: int = 10):
        check_int("callbacks.stability.every_n_steps", every_n_steps, low=1)
        check_int("callbacks.stability.probe_every_n_steps", probe_every_n_steps, low=1, optional=True)
        check_int("callbacks.stability.probe_batch_size", probe_batch_size, low=1)
        check_bool("callbacks.stability.update_ratio", update_ratio)
        check_bool("callbacks.stability.output_change", output_change)
        self.every_n_steps, self.probe_every_n_steps = every_n_steps, probe_every_n_steps
        self.probe_batch_size, self.update_ratio, self.output_change = probe_batch_size, update_ratio, output_change
        self.spikes = LossSpikeDetector(spike_window, spike_k, spike_min_history)
        # the same rule on the gradient norm, its floor relative to the norm's own scale
        self.grad_spikes = LossSpikeDetector(spike_window, spike_k, spike_min_history, relative=True)
        self.history: SpikeCapture | None = None  # the spike capture this callback feeds, if on (on_fit_start)
        self.probe: ActivationProbe | None = None
        self.scaler = None
        self.totals: RunTotals | None = None  # the run's totals this callback feeds (set in on_fit_start)
        self._reset_step()

    def _reset_step(self) -> None:
        self._step, self._measure, self._stepped, self._log_step, self._record = 0, False, False, False, False
        self._grad_total: Tensor | None = None  # this step's total gradient norm (every step)
        self._pending: dict[str, Tensor | float] = {}
        self._w_before: list[Tensor] | None = None
        self._w_norms: Tensor | None = None  # (P,) the parameters' norms before the step (measured steps)
        self._probe_x: Tensor | None = None  # output_change: the probe sequences and their log-probs before
        self._logp_before: Tensor | None = None
        self._scale_before: Tensor | None = None

    def state_dict(self) -> dict[str, Any]:
        """The spike detector's history (plain values), so a resumed run continues it; the run totals this
        callback measures (max_grad_norm, nonfinite_grad_steps, skipped_steps, spike_count, max_attn_logit,
        max_abs_h, max_log_z, amp_scale) are RunTotals', in its state."""
        return {"spikes": self.spikes.state_dict(), "grad_spikes": self.grad_spikes.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.spikes.load_state_dict(state["spikes"])
        if "grad_spikes" in state:  # older checkpoints lack it: its history starts again
            self.grad_spikes.load_state_dict(state["grad_spikes"])

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.probe = ActivationProbe(getattr(pl_module, "model", pl_module), self.probe_batch_size)
        self.scaler = getattr(trainer.precision_plugin, "scaler", None)
        self.totals = RunTotals.of(trainer)
        for count in ("nonfinite_grad_steps", "skipped_steps", schema.SPIKE_COUNT, schema.GRAD_SPIKE_COUNT):
            self.totals.add(count, 0)  # 0 from the start: measured, none seen
        capture = find_callback(trainer, SpikeCapture)
        self.history = capture if capture is not None and capture.active(trainer) else None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._step = trainer.global_step
        self._log_step = self._step % self.every_n_steps == 0
        self._record = self.history is not None and self.history.wants(self._step)
        self._measure = self._log_step or self._record
        if self._measure and self.probe is not None and not self.probe.attached:
            probe_attn = self.probe_every_n_steps is not None and self._step % self.probe_every_n_steps == 0
            self.probe.attach(attention=probe_attn or (self._record and self.history.attention))
            eager(pl_module, self, True)  # a compiled model would not call the hooks
        if self._measure and self.output_change and self._probe_x is None:  # first micro-batch of the step
            self._probe_x = batch[0][: self.probe_batch_size].detach()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        self._stepped = True
        scale = _compat.grad_scaler_scale(self.scaler) if self.scaler is not None else None
        if scale is not None:
            self._scale_before = scale.detach().clone()
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads:  # every step: one fused norm, no device sync (RunTotals reads them once, at the end)
            total = get_total_norm(grads, 2.0)
            self.totals.add("nonfinite_grad_steps", (~total.isfinite()).long())  # inf or NaN gradients
            self.totals.record_max(schema.MAX_GRAD_NORM, total)  # after unscaling, before clipping
            self._grad_total = total  # scored with the loss when the logging step reads them
        if not self._measure:
            return
        if self.probe is not None:
            self.probe.detach()  # every forward of this step has run
        model = getattr(pl_module, "model", pl_module)
        params = self._params(model)
        self._weight_norms(params)
        with_grad = [(layer, p.grad) for _, layer, p in params if p.grad is not None]
        if with_grad:  # per parameter, on the device: the total, each block's, and the non-finite elements
            norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for _, g in with_grad])
            self._pending[GRAD_NORM] = norms.norm()
            layers = torch.tensor([-1 if layer is None else layer for layer, _ in with_grad], device=norms.device)
            for i in sorted({layer for layer, _ in with_grad if layer is not None}):
                self._pending[layer_metric(i, "grad_norm")] = norms[layers == i].norm()
            self._pending[GRAD_NONFINITE] = torch.stack([(~g.isfinite()).sum() for _, g in with_grad]).sum().float()
        if self.update_ratio:
            self._w_before = [p.detach().clone() for _, _, p in params]
        if self._probe_x is not None:
            self._logp_before = self._probe_logp(model)

    def _probe_logp(self, model: nn.Module) -> Tensor:
        """Log-probabilities of the probe sequences, eval mode, no gradients, fp32 (outside autocast)."""
        training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return torch.log_softmax(model(self._probe_x).float(), dim=-1)
        finally:
            model.train(training)

    @staticmethod
    def _params(model: nn.Module) -> list[tuple[str, int | None, Tensor]]:
        """(name, index of its block in model.layers or None, parameter) for every parameter."""
        out = []
        for name, p in model.named_parameters():
            parts = name.split(".")
            layer = int(parts[1]) if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit() else None
            out.append((name, layer, p))
        return out

    def _weight_norms(self, params: list[tuple[str, int | None, Tensor]]) -> None:
        """||W|| per block (Frobenius norm of all its parameters) before the optimizer step; the per-parameter norms
        are kept as the update ratio's denominators."""
        self._w_norms = torch.stack([torch.linalg.vector_norm(p.detach(), dtype=torch.float32) for _, _, p in params])
        layers = torch.tensor([-1 if layer is None else layer for _, layer, _ in params], device=self._w_norms.device)
        for i in sorted({layer for _, layer, _ in params if layer is not None}):
            self._pending[layer_metric(i, "weight_norm")] = self._w_norms[layers == i].norm()

    def _update_ratios(self, model: nn.Module) -> dict[str, Tensor]:
        """||W_after - W_before|| / ||W_before|| per block and over all parameters (Frobenius norms)."""
        params = self._params(model)
        delta = torch.stack([torch.linalg.vector_norm(p.detach() - b, dtype=torch.float32)
                             for (_, _, p), b in zip(params, self._w_before, strict=True)])  # (P,)
        weight = self._w_norms
        self._w_before = None
        out = {UPDATE_RATIO: delta.norm() / weight.norm().clamp_min(1e-12)}
        layers = torch.tensor([-1 if layer is None else layer for _, layer, _ in params], device=delta.device)
        for i in sorted({layer for _, layer, _ in params if layer is not None}):
            sel = layers == i
            out[layer_metric(i, "update_ratio")] = delta[sel].norm() / weight[sel].norm().clamp_min(1e-12)
        return out

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """This micro-batch's values (the loss, the gradient norm, and on a measured step every metric) go to the
        device read of the next logging step (DeviceReads), where _arrived scores and logs them at their own step; a
        step the spike capture keeps is read at once (it acts on the step)."""
        values: dict[str, Tensor] = {}
        loss = train_loss(outputs, trainer)
        if loss is not None:
            values[TRAIN_LOSS] = loss.detach().float()
            if self._stepped and self._grad_total is not None:
                values[_GRAD_TOTAL] = self._grad_total
        report = self._measure and self._stepped  # the measured step is complete (last micro-batch)
        if self._stepped and self.scaler is not None:
            scale = _compat.grad_scaler_scale(self.scaler)
            if scale is not None and self._scale_before is not None:
                self.totals.add("skipped_steps", (scale < self._scale_before).long())  # backoff: inf/NaN found
            if report and scale is not None:
                values[AMP_SCALE] = scale
                values[AMP_SKIPPED_STEPS] = torch.as_tensor(self.totals.get("skipped_steps", 0))
        if report:
            values.update(self._measured(pl_module))
        if values:
            names, step = list(values), self._step
            flags = dict(logs=self._log_step and self._stepped, record=self._record, report=report)
            device = values[names[0]].device
            stacked = torch.stack([v.detach().float().reshape(()).to(device) for v in values.values()])
            DeviceReads.of(trainer).put(stacked, lambda v: self._arrived(trainer, step, names, v, **flags),
                                        urgent=self._record)
        if self._stepped:
            self._reset_step()
            eager(pl_module, self, False)

    def _arrived(self, trainer: L.Trainer, step: int, names: list[str], values: Any, logs: bool, record: bool,
                 report: bool) -> None:
        """One step's values, read: the spike scores (every step), the measured metrics (measured steps), logged
        at the step they describe."""
        read = dict(zip(names, np.atleast_1d(values).tolist(), strict=True))
        metrics: dict[str, float] = {}
        scores: dict[str, Any] = {}
        if TRAIN_LOSS in read:
            scores.update(self._score(self.spikes, read[TRAIN_LOSS], LOSS_SPIKE_SCORE, LOSS_SPIKES, schema.SPIKE_COUNT))
            if _GRAD_TOTAL in read:
                scores.update(self._score(self.grad_spikes, read[_GRAD_TOTAL], GRAD_NORM_SPIKE_SCORE,
                                          GRAD_NORM_SPIKES, schema.GRAD_SPIKE_COUNT))
            scores[TRAIN_LOSS] = read[TRAIN_LOSS]
            spiked = scores.pop("spike", False)
            metrics.update({k: v for k, v in scores.items() if k != TRAIN_LOSS and (logs or spiked)})
        if AMP_SCALE in read:
            metrics[AMP_SCALE], metrics[AMP_SKIPPED_STEPS] = read[AMP_SCALE], read[AMP_SKIPPED_STEPS]
            self.totals.set("amp_scale", metrics[AMP_SCALE])
        if report:
            step_values = (TRAIN_LOSS, _GRAD_TOTAL, AMP_SCALE, AMP_SKIPPED_STEPS)
            measured = {k: v for k, v in read.items() if k not in step_values}
            self._summarize(measured)
            if record:
                self.history.record(step, {**scores, **metrics, **measured})
            if logs:
                metrics.update(measured)
        if metrics:
            log_metrics(trainer, metrics, step)

    def _score(self, detector: LossSpikeDetector, value: float, score_name: str, count_name: str,
               total: str) -> dict[str, Any]:
        """Score a value with its spike detector: its score (when it has one) and the count so far; ``spike``: True
        when this value is one (the score and count are logged on measured steps and on spike steps)."""
        score, spike = detector.update(value)
        out: dict[str, Any] = {count_name: float(detector.count)}
        if math.isfinite(score):  # no score before spike_min_history values
            out[score_name] = score
        if spike:
            self.totals.add(total)
            out["spike"] = True
        return out

    def _measured(self, pl_module: L.LightningModule) -> dict[str, Tensor]:
        """The measured step's metrics, on the device (read with the rest at the next logging step)."""
        tensors = dict(self._pending)
        if self._w_before is not None:
            tensors.update(self._update_ratios(getattr(pl_module, "model", pl_module)))
        if self._logp_before is not None:
            after = self._probe_logp(getattr(pl_module, "model", pl_module))
            tensors[OUTPUT_CHANGE] = (after - self._logp_before).pow(2).mean().sqrt()
        if self.probe is not None:
            tensors.update(self.probe.collect_tensors())
        return tensors

    def _summarize(self, metrics: dict[str, float]) -> None:
        """Add the step's derived maxima to metrics and fold them into the run totals."""
        resid = [v for k, v in metrics.items() if k.startswith("layer/") and k.endswith("/resid_max")]
        logits = [v for k, v in metrics.items() if k.endswith("/attn_logit_max")]
        if resid:
            metrics[MAX_ABS_H] = max(resid)
            self.totals.record_max("max_abs_h", metrics[MAX_ABS_H])
        if logits:
            metrics[MAX_ATTN_LOGIT] = max(logits)
            self.totals.record_max("max_attn_logit", metrics[MAX_ATTN_LOGIT])
        if LOG_Z_MAX in metrics:
            self.totals.record_max("max_log_z", metrics[LOG_Z_MAX])
        if ratios := [v for k, v in metrics.items() if k.endswith("/update_ratio")]:
            self.totals.record_max("max_update_ratio", max(ratios))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.probe is not None:
            self.probe.detach()
        eager(pl_module, self, False)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        if self.probe is not None:
            self.probe.detach()

    def release(self, pl_module: L.LightningModule | None) -> None:
        if self.probe is not None:
            self.probe.detach()
        if pl_module is not None:
            eager(pl_module, self, False)
