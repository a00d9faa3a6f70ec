"""Normalization layers, chosen by name through one registry.

Every norm takes and returns ``(B, T, C)`` in the input's dtype, reduces in fp32 whatever the input
dtype (an fp16 ``x**2`` overflows once |x| > ~256), names its parameters ``weight`` / ``bias`` and has
``reset_parameters()``. ``build_norm(name, dim, eps, **options)`` is the only way the model makes one.

Options shared where they make sense:
    eps_mode   "inside": (x - mu) / sqrt(var + eps)  (default, as torch and the papers)
               "outside": (x - mu) / (std + eps)     (as seeds/002 writes it)
    affine     learnable gain (and bias where the norm has one)
    bias       learnable shift (LayerNorm, BatchNorm)
    zero_centered  store the gain as w - 1 (init 0), so weight decay pulls the gain towards 1
"""

from __future__ import annotations

import inspect
import math
import warnings

import torch
from torch import Tensor, nn

EPS_MODES = ("inside", "outside")


def _inv_scale(second_moment: Tensor, eps: float, eps_mode: str) -> Tensor:
    """1 / sqrt(m + eps) or 1 / (sqrt(m) + eps), from a fp32 variance or mean square."""
    if eps_mode == "inside":
        return torch.rsqrt(second_moment + eps)
    return 1.0 / (second_moment.sqrt() + eps)


def _check_choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not valid; allowed: {', '.join(allowed)}")


class _AffineNorm(nn.Module):
    """Shared parameter handling: gain ``weight`` (optionally stored as w - 1) and optional ``bias``."""

    def __init__(self, dim: int, eps: float, eps_mode: str, affine: bool, bias: bool, zero_centered: bool):
        super().__init__()
        _check_choice("eps_mode", eps_mode, EPS_MODES)
        if dim <= 0:
            raise ValueError(f"dim={dim} must be a positive integer")
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

    def __init__(self, dim: int, eps: float = 1e-5, eps_mode: str = "inside", affine: bool = True,
                 zero_centered: bool = False, cast: str = "llama"):
        from minillm.kernels import rmsnorm as kernel

        if eps_mode != "inside" or not affine:
            raise ValueError("fused_rmsnorm supports eps_mode='inside' with affine=True only; "
                             "use norm=rmsnorm for other options")
        kernel.require_fused()
        self._fused = kernel.fused_rms_norm
        super().__init__(dim, eps, eps_mode, affine, zero_centered, cast)

    def forward(self, x: Tensor) -> Tensor:
        return self._fused(x, self.weight, self.eps, offset=1.0 if self.zero_centered else 0.0, cast=self.cast)


class BatchNorm(_AffineNorm):
    """BatchNorm for (B, T, C) with running statistics (seeds/001) used in eval mode.

    stats="position" (default, seeds/002): mean and variance over the batch for each (position, feature),
        so position t only ever sees position t of other sequences: a causal LM stays causal. Running
        statistics are kept per position, buffers of shape (max_seq_len, C); a step of length T updates
        rows 0..T-1 and eval at position t uses row t.
    stats="pooled": statistics over (batch, time) per feature, as nn.BatchNorm1d; running statistics of
        shape (C,). In training mode position t then depends on later tokens (a leak); it warns when built.

    Running update, as seeds/001: r <- (1 - momentum) * r + momentum * batch_stat, with the *biased*
    batch variance (nn.BatchNorm1d stores the unbiased one; the normalization itself is identical).
    """

    STATS = ("position", "pooled")
    uses_positions = True  # the model passes max_seq_len

    def __init__(self, dim: int, eps: float = 1e-5, eps_mode: str = "inside", affine: bool = True,
                 bias: bool = True, zero_centered: bool = False, momentum: float = 0.1,
                 stats: str = "position", max_seq_len: int | None = None):
        _check_choice("stats", stats, self.STATS)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum={momentum} must be in [0, 1]")
        if stats == "position" and (max_seq_len is None or max_seq_len <= 0):
            raise ValueError("batchnorm with stats='position' needs max_seq_len (a positive int)")
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
        return super().extra_repr() + f", momentum={self.momentum}, stats={self.stats}"


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
}


def norm_options(name: str) -> list[str]:
    """The keyword options a norm accepts besides dim and eps."""
    params = inspect.signature(NORMS[name].__init__).parameters
    return [p for p in params if p not in ("self", "dim", "eps")]


def build_norm(name: str, dim: int, eps: float = 1e-5, **options) -> nn.Module:
    """Build the norm called ``name`` over the last dimension of size ``dim``."""
    if name not in NORMS:
        raise ValueError(f"unknown norm {name!r}; valid names: {', '.join(sorted(NORMS))}")
    unknown = sorted(set(options) - set(norm_options(name)))
    if unknown:
        raise ValueError(f"norm {name!r} does not take option(s) {unknown}; "
                         f"it takes: {', '.join(norm_options(name)) or 'none'}")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps={eps} must be a finite number >= 0")
    return NORMS[name](dim, eps, **options)
