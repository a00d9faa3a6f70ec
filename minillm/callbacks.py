"""Lightning callbacks: stability instrumentation, the divergence guard, the run summary and a text sample.

Everything is measured from outside the model (DESIGN rule 8): forward hooks registered only on the steps
that are measured and removed right after, gradient and weight reads around the optimizer step.

Metric names (DESIGN rule 11), logged through ``trainer.loggers`` at the index of the optimizer step they
describe (the same step as ``train/loss``):

    stab/grad_norm           L2 norm of all gradients, after AMP unscaling and before clipping
    stab/grad_nonfinite      number of non-finite gradient elements
    stab/update_ratio        ||W_after - W_before|| / ||W_before|| over all parameters, for one optimizer step
    stab/output_change       RMS change of the log-probabilities of the probe sequences over one optimizer
                             step (DeepNet's "model update"; opt-in: output_change=true, two extra forwards)
    stab/max_abs_h           max |h| of the residual stream over all blocks
    stab/log_z_mean, stab/log_z_max   log Z = logsumexp of the LM logits over the vocabulary (train batch)
    stab/max_attn_logit      max over layers of layer/<i>/attn_logit_max   (probe steps only)
    stab/loss_spike_score    (loss - rolling mean) / rolling std of the previous train losses
    stab/loss_spikes         steps so far whose score exceeded spike_k (also logged on every spike step)
    stab/amp_scale, stab/amp_skipped_steps   GradScaler scale and optimizer steps it skipped (16-mixed only)
    stab/diverged            1 at the step where DivergenceGuard stopped the run
    layer/<i>/grad_norm      gradient norm of model.layers[i]
    layer/<i>/update_ratio   update-to-weight ratio of model.layers[i]
    layer/<i>/resid_rms, layer/<i>/resid_max   RMS and max |h| of the output of model.layers[i]
    layer/<i>/attn_logit_max max over heads and causal (query, key) pairs of q.k / sqrt(head_dim)
    norm/<site>/in_rms, norm/<site>/in_max_fp16   input RMS and max |x| / 65504 at a norm module
    norm/<site>/gain_mean, norm/<site>/gain_std   effective gain (weight, or weight + 1 when zero-centered)
    norm/<site>/alpha        a norm's learnable scalar input scale (DyT)
    norm/<site>/bn_mean_dist, norm/<site>/bn_var_dist   BatchNorm only: RMS over (position,) feature of
                             batch statistic - running statistic, with the running statistics as they are
                             after the step's update (so 0 with momentum=1)

<site> is the module path inside the Transformer: ``layers.0.attn_norm``, ``layers.1.attn.q_norm``, ``norm``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import grad_norm, rank_zero_only, rank_zero_warn
from torch import Tensor, nn
from torch.nn.utils import get_total_norm

from minillm.norms import NORMS, BatchNorm, NoNorm

FP16_MAX = 65504.0
NORM_TYPES = tuple(cls for cls in NORMS.values() if cls is not NoNorm)


# --- pure helpers (tested on their own) -----------------------------------------------------------------


def params_finite(module: nn.Module) -> bool:
    """True when every parameter of module is finite.

    Fast path: one fp32 sum per parameter (NaN or inf anywhere makes it non-finite; ~10x cheaper than
    isfinite().all(), which allocates a mask), one device sync; only a non-finite sum (which a huge but
    finite tensor could also give) is confirmed element-wise.
    """
    params = [p.detach() for p in module.parameters()]
    if not params or bool(torch.stack([p.sum(dtype=torch.float32) for p in params]).isfinite().all()):
        return True
    return all(bool(p.isfinite().all()) for p in params)


def max_attention_logit(attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Max over batch, heads and causal pairs (t >= s) of q_t . k_s / sqrt(D), from ``attn.qk`` (0-d fp32)."""
    q, k = attn.qk(x, cos, sin)  # (B, H, T, D), (B, Hkv, T, D)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, T, D): query head h uses kv head h // g
    T = q.shape[2]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # (T, T)
    best = torch.tensor(float("-inf"), device=q.device)
    for b in range(q.shape[0]):  # one sequence at a time: (H, T, T) scores at most
        scores = q[b].float() @ k[b].float().transpose(-2, -1) / math.sqrt(q.shape[-1])  # (H, T, T)
        best = torch.maximum(best, scores.masked_fill(~causal, float("-inf")).amax())
    return best


def bn_stat_distance(bn: BatchNorm, x: Tensor) -> tuple[Tensor, Tensor]:
    """RMS of (batch mean - running mean) and of (batch var - running var) for the input x (B, T, C)."""
    mu, var = bn.batch_stats(x.float())  # (T, C) or (C,)
    rows = slice(0, x.shape[1]) if bn.stats == "position" else slice(None)
    d_mu = (mu - bn.running_mean[rows]).pow(2).mean().sqrt()
    d_var = (var - bn.running_var[rows]).pow(2).mean().sqrt()
    return d_mu, d_var


class LossSpikeDetector:
    """Score each loss against the previous ``window`` finite losses: (loss - mean) / max(std, min_std).

    A loss is a spike when its score exceeds k; scores need ``min_history`` losses first (NaN before).
    Non-finite losses are not scored (they are divergence, DivergenceGuard's business).
    """

    def __init__(self, window: int = 50, k: float = 4.0, min_history: int = 10, min_std: float = 1e-3):
        if window < 2 or not 2 <= min_history <= window:
            raise ValueError(f"need window >= 2 and 2 <= min_history <= window, got {window}, {min_history}")
        self.k, self.min_history, self.min_std = k, min_history, min_std
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
            score = (loss - mean) / max(std, self.min_std)
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


def last_step(trainer: L.Trainer) -> int:
    """0-based index of the last optimizer step taken: the ``step`` of its row in csv/metrics.csv."""
    return max(trainer.global_step - 1, 0)


def _finite_max(current: float | None, value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return current
    return value if current is None else max(current, value)


def _callback(trainer: L.Trainer, kind: type) -> Any:
    return next((c for c in trainer.callbacks if isinstance(c, kind)), None)


def _log(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def _train_loss(outputs: Any) -> Tensor | None:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return loss if isinstance(loss, Tensor) else None


# --- forward hooks ----------------------------------------------------------------------------------------


class ActivationProbe:
    """Forward hooks on a ``minillm.model.Transformer`` that record, for the forwards they see:

    per block the residual RMS and max |h| of its output; per norm site the input RMS, max |x| / 65504 and
    (BatchNorm in training mode) the batch-vs-running statistic distance; log Z of the LM head output; and,
    when attached with ``attention=True``, the max attention logit per layer on the first ``probe_batch``
    sequences (computed again from the block's attention input with ``attn.qk``, no grad).
    """

    def __init__(self, model: nn.Module, probe_batch: int = 4):
        self.model, self.probe_batch = model, probe_batch
        self.blocks = list(getattr(model, "layers", []))
        self.sites = {name: m for name, m in model.named_modules() if isinstance(m, NORM_TYPES)}
        self.handles: list = []
        self.values: dict[str, list[Tensor]] = defaultdict(list)
        self._in_probe = False

    @property
    def attached(self) -> bool:
        return bool(self.handles)

    def attach(self, attention: bool = False) -> None:
        self.detach()
        for i, block in enumerate(self.blocks):
            self.handles.append(block.register_forward_hook(partial(self._block_hook, i)))
            if attention and hasattr(block, "attn"):
                self.handles.append(block.attn.register_forward_pre_hook(partial(self._attn_hook, i)))
        for name, module in self.sites.items():
            self.handles.append(module.register_forward_hook(partial(self._norm_hook, name)))
        head = getattr(self.model, "lm_head", None)
        if head is not None:
            self.handles.append(head.register_forward_hook(self._head_hook))

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    @torch.no_grad()
    def _block_hook(self, i: int, module: nn.Module, args: tuple, out: Tensor) -> None:
        if self._in_probe:
            return
        self.values[f"layer/{i}/resid_rms"].append(_rms(out))
        self.values[f"layer/{i}/resid_max"].append(out.detach().abs().amax().float())

    @torch.no_grad()
    def _norm_hook(self, name: str, module: nn.Module, args: tuple, out: Tensor) -> None:
        if self._in_probe:
            return
        x = args[0].detach()
        self.values[f"norm/{name}/in_rms"].append(_rms(x))
        self.values[f"norm/{name}/in_max_fp16"].append(x.abs().amax().float() / FP16_MAX)
        if isinstance(module, BatchNorm) and module.training:
            d_mu, d_var = bn_stat_distance(module, x)
            self.values[f"norm/{name}/bn_mean_dist"].append(d_mu)
            self.values[f"norm/{name}/bn_var_dist"].append(d_var)

    @torch.no_grad()
    def _head_hook(self, module: nn.Module, args: tuple, out: Tensor) -> None:
        if self._in_probe:
            return
        log_z = torch.logsumexp(out.detach().float(), dim=-1)  # (B, T)
        self.values["stab/log_z_mean"].append(log_z.mean())
        self.values["stab/log_z_max"].append(log_z.amax())

    @torch.no_grad()
    def _attn_hook(self, i: int, module: nn.Module, args: tuple) -> None:
        key = f"layer/{i}/attn_logit_max"
        if self._in_probe or key in self.values:  # once per step (first micro-batch)
            return
        x, cos, sin = args  # (B, T, C), (T, D/2), (T, D/2)
        self._in_probe = True  # qk() runs the QK-norms: keep their hooks quiet
        try:
            self.values[key].append(max_attention_logit(module, x[: self.probe_batch].detach(), cos, sin))
        finally:
            self._in_probe = False

    def collect(self) -> dict[str, float]:
        """Aggregate what the hooks recorded (max for maxima, mean otherwise), then clear; one device sync."""
        keys = sorted(self.values)
        agg = [torch.stack(self.values[k]).amax() if _is_max(k) else torch.stack(self.values[k]).mean()
               for k in keys]
        for name, module in self.sites.items():
            g = module.gain() if hasattr(module, "gain") else getattr(module, "weight", None)
            if g is not None:
                g = g.detach().float()
                keys += [f"norm/{name}/gain_mean", f"norm/{name}/gain_std"]
                agg += [g.mean(), g.std(correction=0)]
            alpha = getattr(module, "alpha", None)  # DyT's learnable input scale
            if isinstance(alpha, Tensor) and alpha.numel() == 1:
                keys.append(f"norm/{name}/alpha")
                agg.append(alpha.detach().float().reshape(()))
        self.values.clear()
        if not agg:
            return {}
        return dict(zip(keys, torch.stack([a.to(agg[0].device) for a in agg]).tolist(), strict=True))


def _rms(x: Tensor) -> Tensor:
    return torch.linalg.vector_norm(x.detach(), dtype=torch.float32) / math.sqrt(max(x.numel(), 1))


def _is_max(key: str) -> bool:
    return key.endswith(("_max", "_max_fp16"))


# --- the callbacks ----------------------------------------------------------------------------------------


class StabilityMonitor(L.Callback):
    """Logs the stability metrics listed in this module's docstring.

    Cheap metrics (gradient norms, residual and norm-site statistics, log Z, update ratio) every
    ``every_n_steps`` optimizer steps; the attention-logit probe every ``probe_every_n_steps``; the loss-spike
    score and the GradScaler bookkeeping every step (both are scalar reads). Hooks exist only during the
    measured steps, so other steps run the model untouched. ``output_change`` runs the model twice more on the
    first ``probe_batch_size`` sequences of a measured step, in eval mode and without gradients, before and
    after the optimizer step (BatchNorm uses its running statistics there and does not update them).
    """

    def __init__(self, every_n_steps: int = 10, probe_every_n_steps: int | None = 100,
                 probe_batch_size: int = 4, update_ratio: bool = True, output_change: bool = False,
                 spike_window: int = 50, spike_k: float = 4.0, spike_min_history: int = 10):
        if every_n_steps < 1 or (probe_every_n_steps is not None and probe_every_n_steps < 1):
            raise ValueError("every_n_steps must be >= 1, probe_every_n_steps >= 1 or null")
        self.every_n_steps, self.probe_every_n_steps = every_n_steps, probe_every_n_steps
        self.probe_batch_size, self.update_ratio, self.output_change = probe_batch_size, update_ratio, output_change
        self.spikes = LossSpikeDetector(spike_window, spike_k, spike_min_history)
        self.probe: ActivationProbe | None = None
        self.scaler = None
        # run totals, read by RunSummary; the gradient ones cover every step and stay on the device
        self._max_grad_norm: Tensor | None = None
        self._nonfinite_grad_steps: Tensor | int = 0
        self._before_resume = {"max_grad_norm": None, "nonfinite_grad_steps": 0, "skipped_steps": 0}
        self.max_attn_logit: float | None = None
        self.max_abs_h: float | None = None
        self.max_log_z: float | None = None
        self.amp_scale: float | None = None
        self._skipped: Tensor | int = 0
        self._reset_step()

    def _reset_step(self) -> None:
        self._step, self._measure, self._stepped = 0, False, False
        self._pending: dict[str, Tensor | float] = {}
        self._w_before: list[Tensor] | None = None
        self._probe_x: Tensor | None = None  # output_change: the probe sequences and their log-probs before
        self._logp_before: Tensor | None = None
        self._scale_before: Tensor | None = None

    @property
    def skipped_steps(self) -> int:
        return self._before_resume["skipped_steps"] + int(self._skipped)

    @property
    def max_grad_norm(self) -> float | None:
        """Largest finite global gradient norm over every optimizer step (after unscaling, before clipping)."""
        now = None if self._max_grad_norm is None else float(self._max_grad_norm)
        return _finite_max(self._before_resume["max_grad_norm"], now)

    @property
    def nonfinite_grad_steps(self) -> int:
        """Optimizer steps whose gradients held an inf or NaN (under 16-mixed: the steps the scaler skipped)."""
        return self._before_resume["nonfinite_grad_steps"] + int(self._nonfinite_grad_steps)

    def state_dict(self) -> dict[str, Any]:
        """The run totals and the spike history (plain values), so a resumed run continues them."""
        return {"spikes": self.spikes.state_dict(), "max_grad_norm": self.max_grad_norm,
                "nonfinite_grad_steps": self.nonfinite_grad_steps, "skipped_steps": self.skipped_steps,
                "max_attn_logit": self.max_attn_logit, "max_abs_h": self.max_abs_h, "max_log_z": self.max_log_z,
                "amp_scale": self.amp_scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.spikes.load_state_dict(state["spikes"])
        self._before_resume = {k: state[k] for k in ("max_grad_norm", "nonfinite_grad_steps", "skipped_steps")}
        self._max_grad_norm, self._nonfinite_grad_steps, self._skipped = None, 0, 0
        self.max_attn_logit, self.max_abs_h = state["max_attn_logit"], state["max_abs_h"]
        self.max_log_z, self.amp_scale = state["max_log_z"], state["amp_scale"]

    @property
    def spike_count(self) -> int:
        return self.spikes.count

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.probe = ActivationProbe(getattr(pl_module, "model", pl_module), self.probe_batch_size)
        self.scaler = getattr(trainer.precision_plugin, "scaler", None)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._step = trainer.global_step
        self._measure = self._step % self.every_n_steps == 0
        if self._measure and self.probe is not None and not self.probe.attached:
            probe_attn = self.probe_every_n_steps is not None and self._step % self.probe_every_n_steps == 0
            self.probe.attach(attention=probe_attn)
        if self._measure and self.output_change and self._probe_x is None:  # first micro-batch of the step
            self._probe_x = batch[0][: self.probe_batch_size].detach()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        self._stepped = True
        if self.scaler is not None and getattr(self.scaler, "_scale", None) is not None:
            self._scale_before = self.scaler._scale.detach().clone()
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads:  # every step: one fused norm, no device sync (read once, at the end)
            total = get_total_norm(grads, 2.0)
            finite = total.isfinite()
            self._nonfinite_grad_steps = self._nonfinite_grad_steps + (~finite).long()
            total = torch.where(finite, total, torch.zeros_like(total))
            self._max_grad_norm = total if self._max_grad_norm is None else torch.maximum(self._max_grad_norm, total)
        if not self._measure:
            return
        if self.probe is not None:
            self.probe.detach()  # every forward of this step has run
        model = getattr(pl_module, "model", pl_module)
        params = self._params(model)
        norms = grad_norm(model, 2.0)  # {"grad_2.0_norm/<param>": tensor, "grad_2.0_norm_total": tensor}
        if "grad_2.0_norm_total" in norms:
            self._pending["stab/grad_norm"] = norms.pop("grad_2.0_norm_total")
        per_layer: dict[int, list[Tensor]] = defaultdict(list)
        for name, layer, _ in params:
            if layer is not None and f"grad_2.0_norm/{name}" in norms:
                per_layer[layer].append(norms[f"grad_2.0_norm/{name}"])
        for i, values in per_layer.items():
            self._pending[f"layer/{i}/grad_norm"] = torch.stack(values).norm()
        nonfinite = 0  # counted element-wise only when the total norm, then a parameter's norm, is not finite
        total = self._pending.get("stab/grad_norm")
        if total is not None and not math.isfinite(float(total)):
            for name, _, p in params:
                value = norms.get(f"grad_2.0_norm/{name}")
                if value is not None and not math.isfinite(float(value)):
                    nonfinite += int((~p.grad.isfinite()).sum())
        self._pending["stab/grad_nonfinite"] = torch.tensor(float(nonfinite))
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

    def _update_ratios(self, model: nn.Module) -> dict[str, Tensor]:
        """||W_after - W_before|| / ||W_before|| per block and over all parameters (Frobenius norms)."""
        params = self._params(model)
        delta = torch.stack([torch.linalg.vector_norm(p.detach() - b, dtype=torch.float32)
                             for (_, _, p), b in zip(params, self._w_before, strict=True)])  # (P,)
        weight = torch.stack([torch.linalg.vector_norm(b, dtype=torch.float32) for b in self._w_before])
        self._w_before = None
        out = {"stab/update_ratio": delta.norm() / weight.norm().clamp_min(1e-12)}
        layers = torch.tensor([-1 if layer is None else layer for _, layer, _ in params], device=delta.device)
        for i in sorted({layer for _, layer, _ in params if layer is not None}):
            sel = layers == i
            out[f"layer/{i}/update_ratio"] = delta[sel].norm() / weight[sel].norm().clamp_min(1e-12)
        return out

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        metrics: dict[str, float] = {}
        report = self._measure and self._stepped  # the measured step is complete (last micro-batch)
        loss = _train_loss(outputs)
        if loss is not None:
            score, spike = self.spikes.update(float(loss.detach()))
            if (report or spike) and math.isfinite(score):  # no score before spike_min_history losses
                metrics["stab/loss_spike_score"] = score
            if report or spike:
                metrics["stab/loss_spikes"] = float(self.spikes.count)
        if self._stepped and self.scaler is not None:
            scale = getattr(self.scaler, "_scale", None)
            if scale is not None and self._scale_before is not None:
                self._skipped = self._skipped + (scale < self._scale_before).long()  # backoff: inf/NaN found
            if report:
                self.amp_scale = float(self.scaler.get_scale())
                metrics["stab/amp_scale"] = self.amp_scale
                metrics["stab/amp_skipped_steps"] = float(self.skipped_steps)
        if report:
            tensors = dict(self._pending)
            if self._w_before is not None:
                tensors.update(self._update_ratios(getattr(pl_module, "model", pl_module)))
            if self._logp_before is not None:
                after = self._probe_logp(getattr(pl_module, "model", pl_module))
                tensors["stab/output_change"] = (after - self._logp_before).pow(2).mean().sqrt()
            if tensors:
                keys = list(tensors)
                values = torch.stack([tensors[k].detach().float().cpu() for k in keys]).tolist()
                metrics.update(zip(keys, values, strict=True))
            if self.probe is not None:
                metrics.update(self.probe.collect())
            self._summarize(metrics)
        if metrics:
            _log(trainer, metrics, self._step)
        if self._stepped:
            self._reset_step()

    def _summarize(self, metrics: dict[str, float]) -> None:
        """Add the step's derived maxima to metrics and fold them into the run totals."""
        resid = [v for k, v in metrics.items() if k.startswith("layer/") and k.endswith("/resid_max")]
        logits = [v for k, v in metrics.items() if k.endswith("/attn_logit_max")]
        if resid:
            metrics["stab/max_abs_h"] = max(resid)
            self.max_abs_h = _finite_max(self.max_abs_h, metrics["stab/max_abs_h"])
        if logits:
            metrics["stab/max_attn_logit"] = max(logits)
            self.max_attn_logit = _finite_max(self.max_attn_logit, metrics["stab/max_attn_logit"])
        if "stab/log_z_max" in metrics:
            self.max_log_z = _finite_max(self.max_log_z, metrics["stab/log_z_max"])

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.probe is not None:
            self.probe.detach()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        if self.probe is not None:
            self.probe.detach()


class DivergenceGuard(L.Callback):
    """Ends a diverging run cleanly: it stops, is marked diverged (step, reason), and the process goes on.

    Diverged: a non-finite train loss, non-finite weights after an optimizer step (``check_weights``: one
    fp32 sum per parameter per step, see params_finite; also checked before validations and at the end), or a
    train loss above the ceiling for ``patience`` consecutive steps (ceiling = ``max_loss``, or
    ``max_loss_factor * ln(vocab_size)`` when max_loss is null). On divergence every ModelCheckpoint stops
    saving (save_top_k=0, save_last=False), so best.ckpt / last.ckpt keep the last good weights.
    """

    def __init__(self, max_loss: float | None = None, max_loss_factor: float | None = 1.5, patience: int = 20,
                 check_weights: bool = True):
        if patience < 1:
            raise ValueError(f"patience={patience} must be >= 1")
        self.max_loss, self.max_loss_factor = max_loss, max_loss_factor
        self.patience, self.check_weights = patience, check_weights
        self.ceiling: float | None = max_loss
        self.diverged, self.step, self.reason = False, None, None
        self._over, self._step = 0, 0

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
        loss = _train_loss(outputs)
        if loss is None or self.diverged:
            return
        value = float(loss.detach())
        if not math.isfinite(value):
            self.trip(trainer, f"non-finite train loss ({value})")
        elif self.check_weights and not params_finite(pl_module):
            self.trip(trainer, "non-finite weights after the optimizer step")
        elif self.ceiling is not None and value > self.ceiling:
            self._over += 1
            if self._over >= self.patience:
                self.trip(trainer, f"train loss above {self.ceiling:.4g} for {self._over} consecutive steps")
        else:
            self._over = 0

    def _check_weights(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Safety net before anything can save a checkpoint (the per-step check is in on_train_batch_end)."""
        if self.check_weights and not self.diverged and not params_finite(pl_module):
            self._step = last_step(trainer)
            self.trip(trainer, "non-finite weights")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._check_weights(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_weights(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_weights(trainer, pl_module)

    def trip(self, trainer: L.Trainer, reason: str) -> None:
        """Mark the run diverged at the current step, stop it and freeze the checkpoints."""
        self.diverged, self.step, self.reason = True, self._step, reason
        trainer.should_stop = True
        for ckpt in trainer.checkpoint_callbacks:
            ckpt.save_top_k, ckpt.save_last = 0, False
        _log(trainer, {"stab/diverged": 1.0}, self._step)
        rank_zero_warn(f"run diverged at step {self._step}: {reason}; stopping, checkpoints kept as they are")


class RunSummary(L.Callback):
    """Writes ``summary.json`` to ``trainer.default_root_dir`` after fit, after test, and on a crash.

    One flat JSON object (non-finite numbers written as null):
      config   name, norm, placement, lr, warmup_steps, precision (asked), precision_used, seed, tags, dim,
               n_layers, n_heads, n_kv_heads, qk_norm, vocab_size, max_seq_len, norm_eps, norm_options,
               weight_decay, z_loss, grad_clip, max_steps, batch_size, seq_len, n_params, loss_init = ln V,
               unigram_loss (val loss of the train split's unigram frequencies, from the datamodule)
      results  status (completed | diverged | failed), error, steps, final_val_loss, best_val_loss,
               best_val_step, test_loss, diverged, diverged_step, diverged_reason, stopped_early, failed,
               max_grad_norm, nonfinite_grad_steps, spike_count, max_attn_logit, max_abs_h, max_log_z,
               skipped_steps, amp_scale, tokens, train_time_s (validation excluded), tokens_per_s,
               wall_time_s (from the callback's creation), run_dir
    A resumed run (``ckpt_path``) continues the totals of the run it resumes: the three callbacks keep them
    in the checkpoint (state_dict), so the summary covers the whole run, not only its last segment.
    Steps: ``steps`` counts optimizer steps; ``diverged_step`` and ``best_val_step`` are 0-based step
    indices, as the ``step`` column of csv/metrics.csv (a validation after k steps is at index k - 1).
    diverged and failed follow EXPERIMENTS.md: diverged = DivergenceGuard stopped the run, or the final val
    loss is >= ln V; failed = diverged, crashed (status failed), no finite final val loss, or a final val
    loss >= unigram_loss.
    max_grad_norm and nonfinite_grad_steps cover every step; the other StabilityMonitor maxima its measured
    steps. ``config`` (from the YAML, e.g.
    ``seed: ${seed}``) is written as given; the rest is read from the module, the trainer's optimizer and
    the other callbacks.
    """

    def __init__(self, filename: str = "summary.json", config: dict | None = None):
        self.filename, self.config = filename, dict(config or {})
        self._t0 = time.time()
        self._fit_seen = False
        self.val_history: list[tuple[int, float]] = []
        self.tokens, self.batch_shape = 0, None
        self._t_train: float | None = None  # when this process started training
        self._val_t: float | None = None  # when the running validation started (None outside one)
        self._val_time = 0.0  # validation seconds since _t_train
        self._before = {"train_time": 0.0, "wall_time": 0.0}  # earlier segments of a resumed run
        self.test_loss: float | None = None

    def train_time(self) -> float:
        """Seconds spent training (validation excluded), over every segment of the run."""
        if self._t_train is None:
            return self._before["train_time"]
        now = time.time()
        running_val = now - self._val_t if self._val_t is not None else 0.0
        return self._before["train_time"] + now - self._t_train - self._val_time - running_val

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to summarize the whole run (plain values for weights_only loading)."""
        return {"val_history": [list(v) for v in self.val_history], "tokens": self.tokens,
                "batch_shape": list(self.batch_shape) if self.batch_shape else None,
                "train_time": self.train_time(), "wall_time": self._before["wall_time"] + time.time() - self._t0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.val_history = [(int(s), float(v)) for s, v in state["val_history"]]
        self.tokens = state["tokens"]
        self.batch_shape = tuple(state["batch_shape"]) if state["batch_shape"] else None
        self._before = {"train_time": state["train_time"], "wall_time": state["wall_time"]}

    # timing and counting
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_seen = True
        self._t_train, self._val_time = time.time(), 0.0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        if isinstance(x, Tensor):
            self.batch_shape = self.batch_shape or tuple(x.shape)
            self.tokens += x.numel() * trainer.world_size

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._t_train is not None:
            self._val_t = time.time()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_t is not None:
            self._val_time += time.time() - self._val_t
            self._val_t = None
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get("val/loss")
        if value is not None:
            self.val_history.append((last_step(trainer), float(value)))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._before["train_time"], self._t_train = self.train_time(), None  # training is over: freeze

    # writing
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.write(trainer, pl_module, "completed")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get("test/loss")
        self.test_loss = float(value) if value is not None else None
        self.write(trainer, pl_module, "completed")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        self.write(trainer, pl_module, "failed", error=f"{type(exception).__name__}: {exception}")

    @rank_zero_only
    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, status: str,
              error: str | None = None) -> Path:
        path = Path(trainer.default_root_dir) / self.filename
        summary = self.build(trainer, pl_module, status, error)
        if not self._fit_seen and path.exists():  # a test-only run adds to the summary of its fit
            summary = {**json.loads(path.read_text()), **{k: v for k, v in summary.items() if v is not None}}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(_json_safe(summary), indent=2, sort_keys=False) + "\n")
        tmp.replace(path)
        return path

    def build(self, trainer: L.Trainer, pl_module: L.LightningModule, status: str,
              error: str | None = None) -> dict[str, Any]:
        """The summary as a flat dict (fields in the class docstring)."""
        model = getattr(pl_module, "model", pl_module)
        cfg = getattr(model, "cfg", None)
        hp = getattr(pl_module, "hparams", {})
        group = trainer.optimizers[0].param_groups[0] if trainer.optimizers else {}
        opt_kw = {"lr": group.get("initial_lr", group.get("lr")), "weight_decay": group.get("weight_decay")}
        sched = getattr(pl_module, "scheduler_factory", None) or hp.get("scheduler")
        sched_kw = getattr(sched, "keywords", None) or {}
        vocab = getattr(cfg, "vocab_size", None)
        loss_init = math.log(vocab) if vocab else None
        s: dict[str, Any] = {
            "name": None, "norm": getattr(cfg, "norm", None), "placement": getattr(cfg, "placement", None),
            "lr": opt_kw.get("lr"), "warmup_steps": sched_kw.get("warmup_steps"),
            "precision": str(trainer.precision), "seed": _env_int("PL_GLOBAL_SEED"),
        }
        s.update(self.config)
        s["precision_used"] = str(trainer.precision)
        for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "qk_norm", "vocab_size", "max_seq_len",
                    "norm_eps", "tie_embeddings"):
            s[key] = getattr(cfg, key, None)
        s.update({
            "norm_options": dict(getattr(cfg, "norm_options", None) or {}),
            "weight_decay": opt_kw.get("weight_decay"), "z_loss": hp.get("z_loss"),
            "grad_clip": trainer.gradient_clip_val, "max_steps": trainer.max_steps,
            "batch_size": self.batch_shape[0] if self.batch_shape else None,
            "seq_len": self.batch_shape[1] if self.batch_shape and len(self.batch_shape) > 1 else None,
            "n_params": model.num_params() if hasattr(model, "num_params") else
            sum(p.numel() for p in model.parameters()),
            "loss_init": loss_init,
            "unigram_loss": getattr(trainer.datamodule, "unigram_loss", None) if trainer.datamodule else None,
        })
        finite_vals = [(st, v) for st, v in self.val_history if math.isfinite(v)]
        best = min(finite_vals, key=lambda sv: sv[1]) if finite_vals else (None, None)
        final_val = self.val_history[-1][1] if self.val_history else None
        guard = _callback(trainer, DivergenceGuard)
        diverged, step, reason = (guard.diverged, guard.step, guard.reason) if guard else (False, None, None)
        if not diverged and final_val is not None and loss_init is not None and not final_val < loss_init:
            diverged, step = True, last_step(trainer)
            reason = f"final val loss {final_val:.4g} >= ln(vocab_size) = {loss_init:.4g}"
        monitor = _callback(trainer, StabilityMonitor)
        train_time = self.train_time()
        s.update({
            "status": "diverged" if diverged and status == "completed" else status,
            "error": error,
            "steps": trainer.global_step,
            "final_val_loss": final_val, "best_val_loss": best[1], "best_val_step": best[0],
            "test_loss": self.test_loss,
            "diverged": diverged, "diverged_step": step, "diverged_reason": reason,
            "stopped_early": bool(guard and guard.diverged),
            "failed": status == "failed" or diverged or final_val is None or not math.isfinite(final_val)
            or (s["unigram_loss"] is not None and final_val >= s["unigram_loss"]),
            "max_grad_norm": getattr(monitor, "max_grad_norm", None),
            "nonfinite_grad_steps": getattr(monitor, "nonfinite_grad_steps", None),
            "spike_count": getattr(monitor, "spike_count", None),
            "max_attn_logit": getattr(monitor, "max_attn_logit", None),
            "max_abs_h": getattr(monitor, "max_abs_h", None),
            "max_log_z": getattr(monitor, "max_log_z", None),
            "skipped_steps": monitor.skipped_steps if monitor else None,
            "amp_scale": getattr(monitor, "amp_scale", None),
            "tokens": self.tokens,
            "train_time_s": round(train_time, 3),
            "tokens_per_s": self.tokens / train_time if train_time > 0 else None,
            "wall_time_s": round(self._before["wall_time"] + time.time() - self._t0, 3),
            "run_dir": str(trainer.default_root_dir),
        })
        return s


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") and value.lstrip("-").isdigit() else None


def _json_safe(value: Any) -> Any:
    """Strict JSON: non-finite floats become null, mappings dicts, sequences lists, other objects strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, Tensor) and value.numel() == 1:
        return _json_safe(value.item())
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [_json_safe(v) for v in value]
    return str(value)


class ProgressBar(RichProgressBar):
    """Lightning's rich progress bar; with max_epochs=-1 (training by steps) the label is "Epoch N", not
    "Epoch N/-2". The bar's total is already the steps left to max_steps."""

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs is not None and self.trainer.max_epochs < 0:
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"
        return super()._get_train_description(current_epoch)


class TextSample(L.Callback):
    """Generate text from ``prompt`` when training ends: printed, written to samples.txt and logged to W&B."""

    def __init__(self, prompt: str = "\n", max_new_tokens: int = 300, temperature: float = 0.8,
                 top_k: int | None = None, seed: int = 0):
        self.prompt, self.max_new_tokens = prompt, max_new_tokens
        self.temperature, self.top_k, self.seed = temperature, top_k, seed

    def prompt_ids(self, tokenizer) -> list[int]:
        """The prompt's token ids; characters the tokenizer does not know are dropped with a warning."""
        try:
            return [int(i) for i in tokenizer.encode(self.prompt)]
        except ValueError:
            ids = []
            for ch in self.prompt:
                try:
                    ids += [int(i) for i in tokenizer.encode(ch)]
                except ValueError:
                    pass
            rank_zero_warn(f"text_sample: prompt {self.prompt!r} has characters outside the vocabulary; "
                           f"sampling from the known ones ({len(ids)} tokens)")
            return ids or [0]

    def sample(self, pl_module: L.LightningModule, tokenizer) -> str:
        ids = torch.tensor([self.prompt_ids(tokenizer)], dtype=torch.long, device=pl_module.device)
        gen = torch.Generator(device=pl_module.device).manual_seed(self.seed)
        was_training = pl_module.training
        pl_module.eval()
        out = pl_module.model.generate(ids, self.max_new_tokens, self.temperature, self.top_k, gen)
        pl_module.train(was_training)
        return tokenizer.decode(out[0].tolist())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Every process generates (a sharded model needs all of them in each forward); rank 0 reports."""
        tokenizer = getattr(trainer.datamodule, "tokenizer", None)
        if tokenizer is None or self.max_new_tokens <= 0:
            return
        finite = trainer.strategy.reduce_boolean_decision(params_finite(pl_module), all=True)
        if not finite:  # a diverged model cannot be sampled (NaN probabilities)
            if trainer.is_global_zero:
                print(f"\n--- no sample after {trainer.global_step} steps: non-finite weights ---")
            return
        text = self.sample(pl_module, tokenizer)
        if not trainer.is_global_zero:
            return
        print(f"\n--- sample after {trainer.global_step} steps ---\n{text}\n---")
        Path(trainer.default_root_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(trainer.default_root_dir) / "samples.txt", "a") as f:
            f.write(f"step {trainer.global_step}:\n{text}\n\n")
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_text("samples", columns=["step", "text"], data=[[trainer.global_step, text]])


__all__: Sequence[str] = ("ActivationProbe", "DivergenceGuard", "LossSpikeDetector", "ProgressBar", "RunSummary",
                          "StabilityMonitor", "TextSample", "bn_stat_distance", "max_attention_logit",
                          "params_finite", "spike_scores")
