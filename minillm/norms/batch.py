"""The norms that normalize by statistics over the batch: BatchNorm (per position, or pooled) and PowerNorm."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from minillm.distributed import batch_mean, global_mean_var, is_synced
from minillm.errors import ConfigError, check_choice, check_int, check_number, invalid
from minillm.norms.base import _AffineNorm, register
from minillm.norms.impl import inv_scale


@register("batchnorm")
class BatchNorm(_AffineNorm):
    """BatchNorm for (B, T, C) with running statistics used in eval mode.

    stats="position" (default): mean and variance over the batch for each (position, feature),
        so position t only ever sees position t of other sequences: a causal LM stays causal. Running
        statistics are kept per position, buffers of shape (max_seq_len, C); a step of length T updates
        rows 0..T-1 and eval at position t uses row t.
    stats="pooled": statistics over (batch, time) per feature, as nn.BatchNorm1d; running statistics of
        shape (C,). In training mode position t then depends on later tokens (a leak); it warns when built.

    Running update: r <- (1 - momentum) * r + momentum * batch_stat, with the *biased*
    batch variance (nn.BatchNorm1d stores the unbiased one; the normalization itself is identical).

    sync=True: under DDP the batch statistics are those of every process's batch together (an all-reduce of
    sums, sums of squares and counts, differentiable: minillm.distributed), as nn.SyncBatchNorm.
    """

    STATS = ("position", "pooled")
    uses_positions = True  # the model passes max_seq_len
    normalizes_by_the_batch = True  # training mode uses the current batch's statistics (batch_statistics)

    def __init__(self, dim: int, eps: float = 1e-5, eps_mode: str = "inside", affine: bool = True,
                 bias: bool = True, zero_centered: bool = False, momentum: float = 0.1,
                 stats: str = "position", max_seq_len: int | None = None, sync: bool = False):
        check_choice("stats", stats, self.STATS)
        self.sync = bool(sync)
        check_number("momentum", momentum, low=0.0, high=1.0)
        if stats == "position" and (max_seq_len is None or max_seq_len <= 0):
            raise ConfigError("batchnorm with stats='position' needs max_seq_len (a positive int)")
        self.momentum, self.stats, self.max_seq_len = momentum, stats, max_seq_len
        shape = (max_seq_len, dim) if stats == "position" else (dim,)
        super().__init__(dim, eps, eps_mode, affine, bias, zero_centered)
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long))
        if stats == "pooled":
            warnings.warn("batchnorm stats='pooled' normalizes over (batch, time): in training mode "
                          "position t sees later tokens, so a causal LM can cheat. Use it only to show the "
                          "leak; stats='position' keeps the model causal.", UserWarning, stacklevel=2)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "running_mean"):  # not yet registered when the base class calls this
            self.running_mean.zero_()
            self.running_var.fill_(1.0)
            self.num_batches_tracked.zero_()

    def batch_stats(self, x32: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and biased variance of a fp32 (B, T, C) batch: (T, C) per position or (C,) pooled."""
        dims = (0,) if self.stats == "position" else (0, 1)
        if is_synced(self.sync):  # over every process's batch
            return global_mean_var(x32, dims)
        var, mu = torch.var_mean(x32, dim=dims, correction=0)
        return mu, var

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()  # (B, T, C)
        T = x.shape[1]
        if self.stats == "position" and T > self.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds batchnorm max_seq_len={self.max_seq_len}")
        if self.training:
            mu, var = self.batch_stats(x32)  # (T, C) or (C,)
            with torch.no_grad():
                m = self.momentum
                rows = slice(0, T) if self.stats == "position" else slice(None)
                self.running_mean[rows].mul_(1 - m).add_(m * mu.detach())
                self.running_var[rows].mul_(1 - m).add_(m * var.detach())
                self.num_batches_tracked += 1
        else:
            mu, var = (self.running_mean[:T], self.running_var[:T]) if self.stats == "position" else (
                self.running_mean, self.running_var)
        x_hat = (x32 - mu) * inv_scale(var, self.eps, self.eps_mode)
        return self._affine32(x_hat).to(x.dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", momentum={self.momentum}, stats={self.stats}, sync={self.sync}"


class _PowerNormApproxGrad(torch.autograd.Function):
    """x_hat = x * inv_psi, where inv_psi comes from the running psi_{t-1}, with the approximate backward
    of Shen et al. 2020 (Algorithm 1):

        dL/dx = (dL/dx_hat - nu_{t-1} * x_hat) * inv_psi
        nu_t  = nu_{t-1} * (1 - (1 - alpha) * Gamma_t) + (1 - alpha) * Lambda_t
        Gamma_t = mean_batch(x_hat * x_hat),  Lambda_t = mean_batch(dL/dx_hat * x_hat)

    ``nu`` is the module's buffer (rows of it), updated in place during backward. The update is skipped
    where it would not be finite (an fp16 step with an overflowed, loss-scaled gradient).
    """

    @staticmethod
    def forward(ctx, x32: Tensor, inv_psi: Tensor, nu: Tensor, alpha: float, dims: tuple[int, ...],
                sync: bool = False) -> Tensor:
        x_hat = x32 * inv_psi  # (B, T, C)
        ctx.save_for_backward(x_hat, inv_psi)
        ctx.nu, ctx.alpha, ctx.dims, ctx.sync = nu, alpha, dims, sync
        return x_hat

    @staticmethod
    def backward(ctx, grad_x_hat: Tensor):
        x_hat, inv_psi = ctx.saved_tensors
        nu, a = ctx.nu, ctx.alpha
        grad_x = (grad_x_hat - nu * x_hat) * inv_psi  # uses nu_{t-1}
        with torch.no_grad():
            gamma = batch_mean(x_hat * x_hat, ctx.dims, ctx.sync)  # (T, C) or (C,); all processes if sync
            lam = batch_mean(grad_x_hat * x_hat, ctx.dims, ctx.sync)
            new = nu * (1 - (1 - a) * gamma) + (1 - a) * lam
            nu.copy_(torch.where(torch.isfinite(new), new, nu))
        return grad_x, None, None, None, None, None


@register("powernorm")
class PowerNorm(_AffineNorm):
    """Power Normalization (Shen, Yao, Gholami, Mahoney, Keutzer, "PowerNorm: Rethinking Batch
    Normalization in Transformers", ICML 2020), Algorithm 1, for (B, T, C):

        forward (train)  x_hat = x / psi_{t-1};  y = weight * x_hat + bias
                         psi_t^2 = alpha_fwd * psi_{t-1}^2 + (1 - alpha_fwd) * mean_batch(x^2)
        backward         the approximate gradient of ``_PowerNormApproxGrad`` (running nu, alpha_bwd)
        eval             y = weight * x / psi_T + bias

    No mean is subtracted (a constant shift of x changes y, unlike BatchNorm), and the forward divides by
    the *running* quadratic mean of the previous steps, not by the current batch's. "psi" above includes
    eps: 1/psi = 1/sqrt(psi^2 + eps) (eps_mode "inside") or 1/(sqrt(psi^2) + eps) ("outside").
    Buffers: ``running_psi2`` (psi^2, starts at 1), ``running_nu`` (nu, starts at 0), ``num_batches_tracked``.

    stats="position" (default): psi^2, nu, Gamma and Lambda are per (position, feature) over the batch,
        buffers of shape (max_seq_len, C), like ``BatchNorm(stats="position")``.
    stats="pooled": over (batch, time) per feature, buffers (C,), as the paper (tokens form the batch).
        With the running statistics the train-mode forward never mixes positions, so both modes are causal
        in training; only the warmup below normalizes by the current batch, and pooled it leaks the future
        (it warns).

    Implemented from the paper: no centering, the running quadratic mean in the forward, its EMA update,
    the approximate backward with the running nu, inference with psi_T, learnable weight/bias.
    Not implemented: the masking of padded tokens (there is none here).
    Options beyond the printed algorithm (defaults keep Algorithm 1 exactly):
    - alpha_bwd separate from alpha_fwd (the paper uses one alpha; both default 0.9, as the authors' code);
    - ``warmup_steps``: for the first k training steps normalize by the batch quadratic mean (PN-V, exact
      autograd) while psi^2 accumulates the cumulative average of the batch values, so Algorithm 1 starts
      from a measured psi instead of 1 (the authors' code has such a warmup; default 0 = off);
    - ``group_scaling=G``: first divide each token by its RMS over each of G groups of features (exact
      autograd), as the authors' released code does before PN ("GroupScaling1D"; default 0 = off).
      It matters: nu's update multiplies nu by 1 - (1 - alpha_bwd) * Gamma, which flips and grows once
      Gamma = mean(x_hat^2) > 2 / (1 - alpha_bwd), i.e. when activations outgrow the lagging running psi.
      Branch outputs (placement peri/branch) start near 0 and grow fast; there Algorithm 1 alone diverges
      in tests/test_model.py's overfit run, and with group_scaling=1 it trains. Even as a Pre-LN norm,
      psi starting at 1 against inputs of RMS ~0.02 makes Algorithm 1 alone learn slowly; warmup_steps
      (e.g. 50) or group_scaling=1 remove the lag (docs/norms_and_placements.md).
    - ``sync=True``: under DDP, mean_batch (of x^2, Gamma, Lambda) is over every process's batch (all-reduced
      sums and counts, minillm.distributed), as one process on the concatenated batch (default False).
    """

    STATS = ("position", "pooled")
    uses_positions = True  # the model passes max_seq_len

    def __init__(self, dim: int, eps: float = 1e-5, eps_mode: str = "inside", affine: bool = True,
                 bias: bool = True, zero_centered: bool = False, alpha_fwd: float = 0.9,
                 alpha_bwd: float = 0.9, warmup_steps: int = 0, group_scaling: int = 0,
                 stats: str = "position", max_seq_len: int | None = None, sync: bool = False):
        check_choice("stats", stats, self.STATS)
        self.sync = bool(sync)
        for name, a in (("alpha_fwd", alpha_fwd), ("alpha_bwd", alpha_bwd)):
            check_number(name, a, low=0.0, high=1.0)
        check_int("warmup_steps", warmup_steps, low=0)
        if not isinstance(group_scaling, int) or group_scaling < 0 or (group_scaling and dim % group_scaling):
            raise invalid("group_scaling", group_scaling, f"0 (off) or a divisor of dim={dim}")
        if stats == "position" and (max_seq_len is None or max_seq_len <= 0):
            raise ConfigError("powernorm with stats='position' needs max_seq_len (a positive int)")
        self.alpha_fwd, self.alpha_bwd, self.warmup_steps = float(alpha_fwd), float(alpha_bwd), warmup_steps
        self.group_scaling = group_scaling
        self.stats, self.max_seq_len = stats, max_seq_len
        shape = (max_seq_len, dim) if stats == "position" else (dim,)
        super().__init__(dim, eps, eps_mode, affine, bias, zero_centered)
        self.register_buffer("running_psi2", torch.ones(shape))
        self.register_buffer("running_nu", torch.zeros(shape))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long))
        if stats == "pooled" and warmup_steps > 0:
            warnings.warn("powernorm stats='pooled' with warmup_steps > 0 normalizes by (batch, time) "
                          "statistics during the warmup: position t then sees later tokens. Use "
                          "stats='position' or warmup_steps=0 to keep a causal LM causal.", UserWarning,
                          stacklevel=2)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "running_psi2"):  # not yet registered when the base class calls this
            self.running_psi2.fill_(1.0)
            self.running_nu.zero_()
            self.num_batches_tracked.zero_()

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()  # (B, T, C)
        B, T, C = x.shape
        if self.stats == "position" and T > self.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds powernorm max_seq_len={self.max_seq_len}")
        if self.group_scaling:  # per token: x / rms over each group of C / G features
            xg = x32.reshape(B, T, self.group_scaling, C // self.group_scaling)  # (B, T, G, C/G)
            x32 = (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + self.eps)).reshape(B, T, C)
        dims = (0,) if self.stats == "position" else (0, 1)
        rows = slice(0, T) if self.stats == "position" else slice(None)
        psi2 = self.running_psi2[rows]  # (T, C) or (C,)
        if not self.training:
            return self._affine32(x32 * inv_scale(psi2, self.eps, self.eps_mode)).to(x.dtype)
        batch_psi2 = batch_mean(x32.pow(2), dims, self.sync)  # (T, C) or (C,); all processes if sync
        k = int(self.num_batches_tracked) if self.warmup_steps else 0  # no device sync when warmup is off
        if k < self.warmup_steps:  # PN-V: the batch's quadratic mean, exact gradient
            x_hat = x32 * inv_scale(batch_psi2, self.eps, self.eps_mode)
            with torch.no_grad():  # cumulative average of the warmup batches
                psi2.copy_(batch_psi2.detach() if k == 0 else psi2 + (batch_psi2.detach() - psi2) / (k + 1))
        else:
            inv_psi = inv_scale(psi2, self.eps, self.eps_mode)  # a new tensor: psi_{t-1}, before the update
            x_hat = _PowerNormApproxGrad.apply(x32, inv_psi, self.running_nu[rows], self.alpha_bwd, dims,
                                               is_synced(self.sync))
            with torch.no_grad():
                psi2.mul_(self.alpha_fwd).add_((1 - self.alpha_fwd) * batch_psi2.detach())
        with torch.no_grad():
            self.num_batches_tracked += 1
        return self._affine32(x_hat).to(x.dtype)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", alpha_fwd={self.alpha_fwd}, alpha_bwd={self.alpha_bwd}, "
                f"warmup_steps={self.warmup_steps}, group_scaling={self.group_scaling}, stats={self.stats}, "
                f"sync={self.sync}")
