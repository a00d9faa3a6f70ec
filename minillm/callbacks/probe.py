"""Forward hooks that measure the residual stream, the norm sites, log Z and attention logits."""

from __future__ import annotations

import math
from collections import defaultdict
from functools import partial

import torch
from torch import Tensor, nn

from minillm.metrics import LOG_Z_MAX, LOG_Z_MEAN, layer_metric, norm_metric
from minillm.norms import NORMS, BatchNorm, NoNorm

FP16_MAX = 65504.0
NORM_TYPES = tuple(cls for cls in NORMS.values() if cls is not NoNorm)


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


def bn_stat_distance(bn: BatchNorm, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """How far the batch statistics of the input x (B, T, C) are from the running statistics, as RMS over
    (position,) feature, against the running statistics as they are after this step's update:

    - ``d_mu``, ``d_var``: RMS of (batch mean - running mean) and of (batch var - running var), raw units;
    - ``z_mu``, ``z_var``: the same in units of the running statistics, RMS of (batch mean - running mean) /
      sqrt(running var + eps) and of (batch var - running var) / (running var + eps). Sampling alone gives
      ``bn_sampling_null`` (about 1/sqrt(B - 1)); more means the batch statistics fluctuate beyond sampling.
    """
    mu, var = bn.batch_stats(x.float())  # (T, C) or (C,)
    rows = slice(0, x.shape[1]) if bn.stats == "position" else slice(None)
    r_mu, r_var = bn.running_mean[rows], bn.running_var[rows]
    d_mu, d_var = mu - r_mu, var - r_var
    scale = r_var + bn.eps
    return (d_mu.pow(2).mean().sqrt(), d_var.pow(2).mean().sqrt(),
            (d_mu.pow(2) / scale).mean().sqrt(), (d_var / scale).pow(2).mean().sqrt())


def bn_sampling_null(batch: int, momentum: float) -> tuple[float, float]:
    """Expected ``z_mu`` and ``z_var`` of ``bn_stat_distance`` when every (position, feature) draws its B values
    independently from one fixed Gaussian: the floor that sampling alone sets (Shen et al. 2020 compare raw
    distances, which have no such floor). With m the momentum, after the update the distance is (1 - m) times
    that to the previous running statistic, whose EMA variance adds m / (2 - m) of a batch statistic's; the
    running variance averages biased batch variances, (B - 1) / B of the true one:

        z_mu = (1 - m) sqrt(2 / (2 - m)) / sqrt(B - 1)
        z_var = (1 - m) sqrt(2 / (2 - m)) sqrt(2 / (B - 1))

    (to first order: the running variance's own noise adds about 2% at B = 4, less at larger B).
    """
    lag = (1 - momentum) * math.sqrt(2 / (2 - momentum))
    return lag / math.sqrt(batch - 1), lag * math.sqrt(2 / (batch - 1))


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
        self.values[layer_metric(i, "resid_rms")].append(_rms(out))
        self.values[layer_metric(i, "resid_max")].append(out.detach().abs().amax().float())

    @torch.no_grad()
    def _norm_hook(self, name: str, module: nn.Module, args: tuple, out: Tensor) -> None:
        if self._in_probe:
            return
        x = args[0].detach()
        self.values[norm_metric(name, "in_rms")].append(_rms(x))
        self.values[norm_metric(name, "in_max_fp16")].append(x.abs().amax().float() / FP16_MAX)
        if isinstance(module, BatchNorm) and module.training:
            d_mu, d_var, z_mu, z_var = bn_stat_distance(module, x)
            self.values[norm_metric(name, "bn_mean_dist")].append(d_mu)
            self.values[norm_metric(name, "bn_var_dist")].append(d_var)
            self.values[norm_metric(name, "bn_mean_z")].append(z_mu)
            self.values[norm_metric(name, "bn_var_z")].append(z_var)

    @torch.no_grad()
    def _head_hook(self, module: nn.Module, args: tuple, out: Tensor) -> None:
        if self._in_probe:
            return
        log_z = torch.logsumexp(out.detach().float(), dim=-1)  # (B, T)
        self.values[LOG_Z_MEAN].append(log_z.mean())
        self.values[LOG_Z_MAX].append(log_z.amax())

    @torch.no_grad()
    def _attn_hook(self, i: int, module: nn.Module, args: tuple) -> None:
        key = layer_metric(i, "attn_logit_max")
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
                keys += [norm_metric(name, "gain_mean"), norm_metric(name, "gain_std")]
                agg += [g.mean(), g.std(correction=0)]
            alpha = getattr(module, "alpha", None)  # DyT's learnable input scale
            if isinstance(alpha, Tensor) and alpha.numel() == 1:
                keys.append(norm_metric(name, "alpha"))
                agg.append(alpha.detach().float().reshape(()))
        self.values.clear()
        if not agg:
            return {}
        return dict(zip(keys, torch.stack([a.to(agg[0].device) for a in agg]).tolist(), strict=True))


def _rms(x: Tensor) -> Tensor:
    return torch.linalg.vector_norm(x.detach(), dtype=torch.float32) / math.sqrt(max(x.numel(), 1))


def _is_max(key: str) -> bool:
    return key.endswith(("_max", "_max_fp16"))

