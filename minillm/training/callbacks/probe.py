"""Forward hooks that measure the residual stream, the norm sites, log Z and attention logits."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from functools import partial

import torch
from torch import Tensor, nn

from minillm.metrics import LOG_Z_MAX, LOG_Z_MEAN, layer_metric, norm_metric
from minillm.model import soft_cap
from minillm.norms import NORMS, BatchNorm, DyT, NoNorm

FP16_MAX = 65504.0
NORM_TYPES = tuple(cls for cls in NORMS.values() if cls is not NoNorm)


def attention_scores(attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor) -> Iterator[Tensor]:
    """Per sequence of x, the attention scores q_t . k_s times the attention's scale (``attn.scale``; None: divided
    by sqrt(D)) (H, T, T) in fp32 from ``attn.qk``, -inf where s > t (the causal mask); one sequence at
    a time, so at most (H, T, T) values are held."""
    q, k = attn.qk(x, cos, sin)  # (B, H, T, D), (B, Hkv, T, D)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, T, D): query head h uses kv head h // g
    T = q.shape[2]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # (T, T)
    for b in range(q.shape[0]):
        with torch.autocast(q.device.type, enabled=False):  # fp32 even under autocast
            scores = q[b].float() @ k[b].float().transpose(-2, -1)  # (H, T, T)
            scores = scores / math.sqrt(q.shape[-1]) if attn.scale is None else scores * attn.scale
        yield scores.masked_fill(~causal, float("-inf"))


def max_attention_logit(attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Max over batch, heads and causal pairs (t >= s) of the scaled q_t . k_s (attention_scores), 0-d fp32."""
    return attention_stats(attn, x, cos, sin)[0]


def attention_stats(attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """(max attention logit, 0-d; attention entropy per head, (H,)) over the sequences of x. The max logit is that
    of ``max_attention_logit`` (before any soft-cap: how far the scores grow); the entropy, in nats, is that of each
    query's attention distribution as the model computes it (soft-capped with ``attn.softcap``), averaged over the
    queries and sequences: log(t + 1) at most for the query at position t, 0 when every query attends to one key
    (Zhai et al. 2023's entropy collapse)."""
    best, entropy, n = torch.tensor(float("-inf"), device=x.device), None, 0
    cap = getattr(attn, "softcap", None)
    for scores in attention_scores(attn, x, cos, sin):  # (H, T, T)
        best = torch.maximum(best, scores.amax())
        if cap is not None:  # the cap of a masked score (-inf) would be -cap: keep the mask
            scores = soft_cap(scores, cap).masked_fill(scores == float("-inf"), float("-inf"))
        logp = torch.log_softmax(scores, dim=-1)  # -inf at masked keys, whose probability is 0
        h = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1).mean(-1)  # (H,)
        entropy, n = (h if entropy is None else entropy + h), n + 1
    return best, entropy / max(n, 1)


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

    per block the residual RMS, max |h| and median |h| of its output; per norm site the input RMS, max |x| / 65504, the
    outlier ratio max |x| / RMS, the kurtosis of the per-feature RMS (``feature_kurtosis``), (DyT, Derf) the
    fraction of the input in the squashing function's bend (``DyT.saturated``) and (BatchNorm in training mode) the
    batch-vs-running statistic distance; log Z of the model's output logits (after any soft-cap);
    and, when attached with ``attention=True``, per layer the max attention logit and the attention entropy (min and
    mean over heads) on the first ``probe_batch`` sequences (computed again from the block's attention input with
    ``attn.qk``, no grad).
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
        if getattr(self.model, "lm_head", None) is not None:  # the logits as the model returns them (soft-capped)
            self.handles.append(self.model.register_forward_hook(self._head_hook))

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    @torch.no_grad()
    def _block_hook(self, i: int, module: nn.Module, args: tuple, out: Tensor) -> None:
        if self._in_probe:
            return
        self.values[layer_metric(i, "resid_rms")].append(_rms(out))
        magnitude = out.detach().abs()  # in the output's dtype: max and median are exact there, no fp32 copy
        self.values[layer_metric(i, "resid_max")].append(magnitude.amax().float())
        # the median |h| is the scale massive activations are measured against (max / median >= 100 or so)
        self.values[layer_metric(i, "resid_median")].append(magnitude.flatten().median().float())

    @torch.no_grad()
    def _norm_hook(self, name: str, module: nn.Module, args: tuple, out: Tensor) -> None:
        if self._in_probe:
            return
        x = args[0].detach()
        feature_ms = _feature_mean_square(x)  # (C,)
        rms, top = feature_ms.mean().sqrt(), x.abs().amax().float()
        self.values[norm_metric(name, "in_rms")].append(rms)
        self.values[norm_metric(name, "in_max_fp16")].append(top / FP16_MAX)
        self.values[norm_metric(name, "outlier_ratio")].append(top / rms.clamp_min(1e-30))
        self.values[norm_metric(name, "kurtosis")].append(feature_kurtosis(feature_ms))
        if isinstance(module, DyT):  # and Derf: the fraction of the input in the squashing function's bend
            self.values[norm_metric(name, "saturation")].append(module.saturated(x).float().mean())
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
            best, entropy = attention_stats(module, x[: self.probe_batch].detach(), cos, sin)
        finally:
            self._in_probe = False
        self.values[key].append(best)
        self.values[layer_metric(i, "attn_entropy_min")].append(entropy.amin())
        self.values[layer_metric(i, "attn_entropy_mean")].append(entropy.mean())

    def collect_tensors(self) -> dict[str, Tensor]:
        """Aggregate what the hooks recorded (max for maxima, mean otherwise) and the sites' gains, then clear; on
        the device (StabilityMonitor reads them with the step's other values)."""
        keys = sorted(self.values)
        agg = [torch.stack(self.values[k]).amax() if is_max_metric(k) else torch.stack(self.values[k]).mean()
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
        return dict(zip(keys, agg, strict=True))

    def collect(self) -> dict[str, float]:
        """collect_tensors, read in one device sync."""
        tensors = self.collect_tensors()
        if not tensors:
            return {}
        device = next(iter(tensors.values())).device
        return dict(zip(tensors, torch.stack([t.to(device) for t in tensors.values()]).tolist(), strict=True))


def _rms(x: Tensor) -> Tensor:
    return torch.linalg.vector_norm(x.detach(), dtype=torch.float32) / math.sqrt(max(x.numel(), 1))


def _feature_mean_square(x: Tensor) -> Tensor:
    """Mean of x^2 per feature (the last dimension) over every other dimension, fp32: (C,)."""
    dims = tuple(range(x.ndim - 1))
    n = max(x.numel() // max(x.shape[-1], 1), 1)
    return torch.linalg.vector_norm(x, dim=dims, dtype=torch.float32).square() / n


def feature_kurtosis(feature_ms: Tensor) -> Tensor:
    """Kurtosis of the per-feature RMS s_j = sqrt(mean x_j^2) across the features j: mean(s^4) / mean(s^2)^2
    (uncentred, from the per-feature mean squares). 1 when every feature has the same scale; large when a few
    features carry most of the activation (outlier features, massive activations)."""
    return feature_ms.square().mean() / feature_ms.mean().square().clamp_min(1e-30)


def is_max_metric(key: str) -> bool:
    """A probe value aggregated over forwards by its maximum (the others by their mean)."""
    return key.endswith(("_max", "_max_fp16", "outlier_ratio"))

