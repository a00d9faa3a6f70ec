"""Normalization layers, chosen by name through one registry.

Every norm takes and returns ``(B, T, C)`` in the input's dtype, reduces in fp32 whatever the input
dtype (an fp16 ``x**2`` overflows once |x| > ~256), names its parameters ``weight`` / ``bias`` and has
``reset_parameters()``. ``build_norm(name, dim, eps, **options)`` is the only way the model makes one.

Options shared where they make sense:
    eps_mode   "inside": (x - mu) / sqrt(var + eps)  (default, as torch and the papers)
               "outside": (x - mu) / (std + eps)     (as some from-scratch write-ups do)
    affine     learnable gain (and bias where the norm has one)
    bias       learnable shift (LayerNorm, BatchNorm)
    zero_centered  store the gain as w - 1 (init 0), so weight decay pulls the gain towards 1
"""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from minillm.distributed import batch_mean, global_mean_var, is_synced
from minillm.errors import ConfigError

EPS_MODES = ("inside", "outside")


def _inv_scale(second_moment: Tensor, eps: float, eps_mode: str) -> Tensor:
    """1 / sqrt(m + eps) or 1 / (sqrt(m) + eps), from a fp32 variance or mean square."""
    if eps_mode == "inside":
        return torch.rsqrt(second_moment + eps)
    return 1.0 / (second_moment.sqrt() + eps)


def _check_choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{field}={value!r} is not valid; allowed: {', '.join(allowed)}")


class _AffineNorm(nn.Module):
    """Shared parameter handling: gain ``weight`` (optionally stored as w - 1) and optional ``bias``."""

    def __init__(self, dim: int, eps: float, eps_mode: str, affine: bool, bias: bool, zero_centered: bool):
        super().__init__()
        _check_choice("eps_mode", eps_mode, EPS_MODES)
        if dim <= 0:
            raise ConfigError(f"dim={dim} must be a positive integer")
        self.dim, self.eps, self.eps_mode, self.zero_centered = dim, float(eps), eps_mode, zero_centered
        self.weight = nn.Parameter(torch.empty(dim)) if affine else None
        self.bias = nn.Parameter(torch.empty(dim)) if affine and bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.constant_(self.weight, 0.0 if self.zero_centered else 1.0)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def gain(self) -> Tensor | None:
        """The effective multiplicative gain (weight + 1 when zero-centered)."""
        if self.weight is None:
            return None
        return self.weight + 1.0 if self.zero_centered else self.weight

    def _affine32(self, x_hat: Tensor) -> Tensor:
        """Apply gain and bias in fp32."""
        g = self.gain()
        if g is not None:
            x_hat = x_hat * g.float()
        if self.bias is not None:
            x_hat = x_hat + self.bias.float()
        return x_hat

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, eps_mode={self.eps_mode}, zero_centered={self.zero_centered}"


class LayerNorm(_AffineNorm):
    """y = (x - mean) / sqrt(var + eps) * w + b over the last dim, with the biased variance (divide by C)."""

    def __init__(self, dim: int, eps: float = 1e-5, eps_mode: str = "inside", affine: bool = True,
                 bias: bool = True, zero_centered: bool = False):
        super().__init__(dim, eps, eps_mode, affine, bias, zero_centered)

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()  # (B, T, C)
        mu = x32.mean(-1, keepdim=True)  # (B, T, 1)
        xc = x32 - mu
        var = (xc * xc).mean(-1, keepdim=True)  # biased: / C, not / (C - 1)
        return self._affine32(xc * _inv_scale(var, self.eps, self.eps_mode)).to(x.dtype)


class RMSNorm(_AffineNorm):
    """LLaMA's RMSNorm: y = x / sqrt(mean(x^2) + eps) * w. No centering, no bias, C parameters.

    cast="llama": normalize in fp32, cast to the input dtype, then multiply by the gain (LLaMA's order);
    cast="fp32": multiply by the gain in fp32 and cast once at the end.
    """

    CASTS = ("llama", "fp32")

    def __init__(self, dim: int, eps: float = 1e-5, eps_mode: str = "inside", affine: bool = True,
                 zero_centered: bool = False, cast: str = "llama"):
        _check_choice("cast", cast, self.CASTS)
        self.cast = cast
        super().__init__(dim, eps, eps_mode, affine, False, zero_centered)

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()  # (B, T, C)
        x_hat = x32 * _inv_scale(x32.pow(2).mean(-1, keepdim=True), self.eps, self.eps_mode)
        g = self.gain()
        if g is None:
            return x_hat.to(x.dtype)
        if self.cast == "llama":
            return x_hat.to(x.dtype) * g.to(x.dtype)
        return (x_hat * g.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", cast={self.cast}"


class FusedRMSNorm(RMSNorm):
    """RMSNorm computed by the Triton kernel of ``minillm.kernels.rmsnorm``; same parameters and state_dict.

    Built only where the kernel can run (CUDA, or TRITON_INTERPRET=1 on the CPU); never falls back.
    """

    kernel = "triton"  # runs a compiled kernel (tests: tests/test_kernels.py, under the interpreter on a CPU)
    same_as = "rmsnorm"  # same state_dict and function: checkpoints move between them (canonical_norm)

    def __init__(self, dim: int, eps: float = 1e-5, eps_mode: str = "inside", affine: bool = True,
                 zero_centered: bool = False, cast: str = "llama"):
        from minillm.kernels import rmsnorm as kernel

        if eps_mode != "inside" or not affine:
            raise ConfigError("fused_rmsnorm supports eps_mode='inside' with affine=True only; "
                             "use norm=rmsnorm for other options")
        kernel.require_fused()
        self._fused = kernel.fused_rms_norm
        super().__init__(dim, eps, eps_mode, affine, zero_centered, cast)

    def forward(self, x: Tensor) -> Tensor:
        return self._fused(x, self.weight, self.eps, offset=1.0 if self.zero_centered else 0.0, cast=self.cast)


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
        _check_choice("stats", stats, self.STATS)
        self.sync = bool(sync)
        if not 0.0 <= momentum <= 1.0:
            raise ConfigError(f"momentum={momentum} must be in [0, 1]")
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
        x_hat = (x32 - mu) * _inv_scale(var, self.eps, self.eps_mode)
        return self._affine32(x_hat).to(x.dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", momentum={self.momentum}, stats={self.stats}, sync={self.sync}"


class DyT(nn.Module):
    """Dynamic Tanh (Zhu, Chen, He, LeCun, Liu, "Transformers without Normalization", CVPR 2025).

    y = weight * tanh(alpha * x) + bias, elementwise: no statistics at all. ``alpha`` is one learnable
    scalar (shape (1,)) initialized to ``alpha0``; ``weight`` (gamma) starts at 1 and ``bias`` (beta) at 0,
    both of size C. |y| <= |weight| + |bias| elementwise whatever x is. ``eps`` is accepted and unused.

    alpha0: the paper's default is 0.5 and works unchanged for its non-LLM models; for LLaMA it tunes
    alpha0, larger for the DyT before attention than for the others and smaller the wider the model
    (e.g. 0.8 before attention, 0.2 elsewhere at 7B). minillm uses one alpha0 for every DyT layer of a run.
    As a Post-LN norm (on the residual stream) alpha0 = 0.5 halves the stream at every sublayer
    (tanh(x / 2) ~ x / 2 near 0); alpha0 = 1 does not.
    """

    def __init__(self, dim: int, eps: float = 1e-5, alpha0: float = 0.5, affine: bool = True,
                 bias: bool = True):
        super().__init__()
        if dim <= 0:
            raise ConfigError(f"dim={dim} must be a positive integer")
        if not (math.isfinite(alpha0) and alpha0 > 0):
            raise ConfigError(f"alpha0={alpha0} must be a finite number > 0")
        self.dim, self.alpha0 = dim, float(alpha0)
        self.alpha = nn.Parameter(torch.empty(1))
        self.weight = nn.Parameter(torch.empty(dim)) if affine else None
        self.bias = nn.Parameter(torch.empty(dim)) if affine and bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.alpha0)
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.tanh(self.alpha.float() * x.float())  # (B, T, C)
        if self.weight is not None:
            y = y * self.weight.float()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, alpha0={self.alpha0}"


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar, "Transformers without Tears", IWSLT 2019).

    y = g * x / max(||x||_2, eps) over the last dim, with ONE learnable scalar g (``weight``, shape (1,))
    initialized to sqrt(C): every position comes out with L2 norm |g|, whatever its scale.
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        if dim <= 0:
            raise ConfigError(f"dim={dim} must be a positive integer")
        self.dim, self.eps = dim, float(eps)
        self.weight = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, math.sqrt(self.dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()  # (B, T, C)
        norm = torch.linalg.vector_norm(x32, dim=-1, keepdim=True).clamp_min(self.eps)  # (B, T, 1)
        return (x32 * (self.weight.float() / norm)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


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
        _check_choice("stats", stats, self.STATS)
        self.sync = bool(sync)
        for name, a in (("alpha_fwd", alpha_fwd), ("alpha_bwd", alpha_bwd)):
            if not 0.0 <= a <= 1.0:
                raise ConfigError(f"{name}={a} must be in [0, 1]")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ConfigError(f"warmup_steps={warmup_steps!r} must be an integer >= 0")
        if not isinstance(group_scaling, int) or group_scaling < 0 or (group_scaling and dim % group_scaling):
            raise ConfigError(f"group_scaling={group_scaling!r} must be 0 (off) or a divisor of dim={dim}")
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
            return self._affine32(x32 * _inv_scale(psi2, self.eps, self.eps_mode)).to(x.dtype)
        batch_psi2 = batch_mean(x32.pow(2), dims, self.sync)  # (T, C) or (C,); all processes if sync
        k = int(self.num_batches_tracked) if self.warmup_steps else 0  # no device sync when warmup is off
        if k < self.warmup_steps:  # PN-V: the batch's quadratic mean, exact gradient
            x_hat = x32 * _inv_scale(batch_psi2, self.eps, self.eps_mode)
            with torch.no_grad():  # cumulative average of the warmup batches
                psi2.copy_(batch_psi2.detach() if k == 0 else psi2 + (batch_psi2.detach() - psi2) / (k + 1))
        else:
            inv_psi = _inv_scale(psi2, self.eps, self.eps_mode)  # a new tensor: psi_{t-1}, before the update
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


class NoNorm(nn.Module):
    """Identity: the no-normalization baseline."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.dim = dim

    def reset_parameters(self) -> None:
        pass

    def forward(self, x: Tensor) -> Tensor:
        return x


NORMS: dict[str, type[nn.Module]] = {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "fused_rmsnorm": FusedRMSNorm,
    "batchnorm": BatchNorm,
    "none": NoNorm,
    "dyt": DyT,
    "powernorm": PowerNorm,
    "scalenorm": ScaleNorm,
}


def norm_options(name: str) -> list[str]:
    """The keyword options a norm accepts besides dim and eps."""
    params = inspect.signature(NORMS[name].__init__).parameters
    return [p for p in params if p not in ("self", "dim", "eps")]


def canonical_norm(name: Any) -> Any:
    """The norm whose weights and function ``name`` has: fused_rmsnorm is rmsnorm. Checkpoints move between
    them (resume checks), and tools that load a checkpoint (hub, export) build it as rmsnorm, which runs anywhere."""
    cls = NORMS.get(name) if isinstance(name, str) else None
    return getattr(cls, "same_as", None) or name


def canonical_norms(model: dict) -> dict:
    """A model config dict with every norm name canonical: norm, qk_norm and the per-layer overrides."""
    layers = [{**s, **({"norm": canonical_norm(s["norm"])} if "norm" in s else {})} for s in model.get("layers") or []]
    return {**model, "norm": canonical_norm(model.get("norm")), "qk_norm": canonical_norm(model.get("qk_norm")),
            "layers": layers or model.get("layers")}


def batch_statistics(name: str, options: dict) -> bool:
    """The norm ``name`` with these options normalizes each position by the current batch's statistics over
    the batch alone (BatchNorm, stats="position"): a batch of one gives it a variance of 0. (PowerNorm divides
    by running statistics in training too.)"""
    cls = NORMS.get(name)
    if cls is None or not getattr(cls, "normalizes_by_the_batch", False):
        return False
    default = inspect.signature(cls.__init__).parameters["stats"].default
    return options.get("stats", default) == "position"


def build_norm(name: str, dim: int, eps: float = 1e-5, **options) -> nn.Module:
    """Build the norm called ``name`` over the last dimension of size ``dim``."""
    if name not in NORMS:
        raise ConfigError(f"unknown norm {name!r}; valid names: {', '.join(sorted(NORMS))}")
    unknown = sorted(set(options) - set(norm_options(name)))
    if unknown:
        raise ConfigError(f"norm {name!r} does not take option(s) {unknown}; "
                         f"it takes: {', '.join(norm_options(name)) or 'none'}")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ConfigError(f"eps={eps} must be a finite number >= 0")
    return NORMS[name](dim, eps, **options)
