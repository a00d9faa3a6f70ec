"""The norms that normalize each token by itself: LayerNorm, RMSNorm (and its fused kernel), DyT, ScaleNorm, and
no norm."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from minillm.errors import ConfigError, check_choice, check_int, check_number
from minillm.norms import impl
from minillm.norms.base import Implemented, _AffineNorm, observed, register


@register("layernorm")
class LayerNorm(Implemented, _AffineNorm):
    """y = (x - mean) / sqrt(var + eps) * w + b over the last dim, with the biased variance (divide by C).
    Implementations: reference, compiled, torch (F.layer_norm; eps inside the square root only)."""

    def __init__(self, dim: int, eps: float = 1e-5, eps_mode: str = "inside", affine: bool = True,
                 bias: bool = True, zero_centered: bool = False):
        super().__init__(dim, eps, eps_mode, affine, bias, zero_centered)

    def implementations(self) -> dict[str, Callable[[Tensor], Tensor] | None]:
        def with_args(fn: Callable) -> Callable[[Tensor], Tensor]:
            return lambda x: fn(x, self.gain(), self.bias, self.eps, self.eps_mode)

        return {"reference": self.reference, "compiled": with_args(impl.compiled(impl.layer_norm)),
                "torch": with_args(impl.layer_norm_torch) if self.eps_mode == "inside" else None}

    def reference(self, x: Tensor) -> Tensor:
        return impl.layer_norm(x, self.gain(), self.bias, self.eps, self.eps_mode)

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x)


@register("rmsnorm")
class RMSNorm(Implemented, _AffineNorm):
    """LLaMA's RMSNorm: y = x / sqrt(mean(x^2) + eps) * w. No centering, no bias, C parameters.

    cast="llama": normalize in fp32, cast to the input dtype, then multiply by the gain (LLaMA's order);
    cast="fp32": multiply by the gain in fp32 and cast once at the end.
    Implementations: reference, compiled, torch (F.rms_norm), triton (the fused kernel, CUDA or the Triton
    interpreter); torch and triton need eps inside the square root, triton a gain.
    """

    CASTS = ("llama", "fp32")

    def __init__(self, dim: int, eps: float = 1e-5, eps_mode: str = "inside", affine: bool = True,
                 zero_centered: bool = False, cast: str = "llama"):
        check_choice("cast", cast, self.CASTS)
        self.cast = cast
        super().__init__(dim, eps, eps_mode, affine, False, zero_centered)

    def implementations(self) -> dict[str, Callable[[Tensor], Tensor] | None]:
        def with_args(fn: Callable) -> Callable[[Tensor], Tensor]:
            return lambda x: fn(x, self.gain(), self.eps, self.eps_mode, self.cast)

        return {"reference": self.reference, "compiled": with_args(impl.compiled(impl.rms_norm)),
                "torch": with_args(impl.rms_norm_torch) if self.eps_mode == "inside" else None,
                "triton": self._triton() if self.eps_mode == "inside" and self.weight is not None else None}

    def reference(self, x: Tensor) -> Tensor:
        return impl.rms_norm(x, self.gain(), self.eps, self.eps_mode, self.cast)

    def _triton(self) -> Callable[[Tensor], Tensor] | None:
        """The fused kernel, where it can run (else None: auto and an explicit triton take another)."""
        from minillm.kernels import rmsnorm as kernel

        try:
            kernel.require_fused()
        except RuntimeError:
            return None
        return lambda x: kernel.fused_rms_norm(x, *self._kernel_args())

    def _kernel_args(self) -> tuple:
        """(weight, eps, offset, cast) of the fused kernels."""
        return self.weight, self.eps, 1.0 if self.zero_centered else 0.0, self.cast

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", cast={self.cast}"


@register("fused_rmsnorm")
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
        super().__init__(dim, eps, eps_mode, affine, zero_centered, cast)
        self.impl = "triton"

    def set_impl(self, impl: str) -> None:
        super().set_impl("triton")  # this norm is the kernel, whatever model.norm_impl says

    @property
    def impl_used(self) -> str:
        return "triton"

    def traced(self, x: Tensor) -> Tensor:
        """The kernel in a compiled model too (its custom op traces without a graph break): what was asked for."""
        from minillm.kernels import rmsnorm as kernel

        return kernel.fused_rms_norm(x, *self._kernel_args())

    def add_forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(self(x + residual), x + residual) by one kernel (minillm/kernels/add_rmsnorm.py). A norm that hooks
        observe (probes, histograms), and float64 (the kernel adds in fp32), get the add and the norm's own call
        instead, so each hook sees the norm's input."""
        if observed(self) or torch.float64 in (x.dtype, residual.dtype):
            h = x + residual
            return self(h), h
        from minillm.kernels.add_rmsnorm import fused_add_rms_norm

        return fused_add_rms_norm(x, residual, *self._kernel_args())


@register("dyt")
class DyT(Implemented, nn.Module):
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
        check_int("dim", dim, low=1)
        check_number("alpha0", alpha0, low=0.0, low_open=True)
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

    def implementations(self) -> dict[str, Callable[[Tensor], Tensor] | None]:
        def with_args(fn: Callable) -> Callable[[Tensor], Tensor]:
            return lambda x: fn(x, self.alpha, self.weight, self.bias)

        return {"reference": self.reference, "compiled": with_args(impl.compiled(impl.dyt))}

    def reference(self, x: Tensor) -> Tensor:
        return impl.dyt(x, self.alpha, self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x)

    def pre_activation(self, x: Tensor) -> Tensor:
        """alpha * x in fp32: what tanh squashes."""
        return x.float() * self.alpha.float()

    @torch.no_grad()
    def saturated(self, x: Tensor) -> Tensor:
        """Which elements of x sit in the squashing function's bend or beyond: |pre_activation| >= 1 (tanh(1) =
        0.76, erf(1) = 0.84), a bool tensor of x's shape. None of them while the norm is a linear map of its input;
        all of them where it acts as a sign function (the probe's norm/<site>/saturation is their fraction)."""
        return self.pre_activation(x.detach()).abs() >= 1.0

    def extra_repr(self) -> str:
        return f"{self.dim}, alpha0={self.alpha0}"


@register("derf")
class Derf(DyT):
    """Dynamic erf (Chen, Lu, Zhu, Sun, Liu, "Stronger Normalization-Free Transformers", 2025).

    y = weight * erf(alpha * x + shift) + bias, elementwise: DyT with erf for tanh and a learnable shift.
    ``alpha`` (init ``alpha0``) and ``shift`` (init 0) are learnable scalars, ``weight`` (1) and ``bias`` (0)
    C-vectors; |y| <= |weight| + |bias|. Per-site alpha0 as DyT's (model.attn_norm_options). ``eps`` is unused.
    """

    def __init__(self, dim: int, eps: float = 1e-5, alpha0: float = 0.5, affine: bool = True,
                 bias: bool = True):
        super().__init__(dim, eps, alpha0, affine, bias)
        self.shift = nn.Parameter(torch.zeros(1))

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "shift"):  # DyT's __init__ resets before the shift exists
            nn.init.zeros_(self.shift)

    def implementations(self) -> dict[str, Callable[[Tensor], Tensor] | None]:
        compiled = impl.compiled(impl.derf)
        return {"reference": self.reference,
                "compiled": lambda x: compiled(x, self.alpha, self.shift, self.weight, self.bias)}

    def reference(self, x: Tensor) -> Tensor:
        return impl.derf(x, self.alpha, self.shift, self.weight, self.bias)

    def pre_activation(self, x: Tensor) -> Tensor:
        """alpha * x + shift in fp32: what erf squashes."""
        return x.float() * self.alpha.float() + self.shift.float()


@register("scalenorm")
class ScaleNorm(Implemented, nn.Module):
    """ScaleNorm (Nguyen & Salazar, "Transformers without Tears", IWSLT 2019).

    y = g * x / max(||x||_2, eps) over the last dim, with ONE learnable scalar g (``weight``, shape (1,))
    initialized to sqrt(C): every position comes out with L2 norm |g|, whatever its scale.
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        check_int("dim", dim, low=1)
        self.dim, self.eps = dim, float(eps)
        self.weight = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, math.sqrt(self.dim))

    def implementations(self) -> dict[str, Callable[[Tensor], Tensor] | None]:
        def with_args(fn: Callable) -> Callable[[Tensor], Tensor]:
            return lambda x: fn(x, self.weight, self.eps)

        return {"reference": self.reference, "compiled": with_args(impl.compiled(impl.scale_norm))}

    def reference(self, x: Tensor) -> Tensor:
        return impl.scale_norm(x, self.weight, self.eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


@register("none")
class NoNorm(nn.Module):
    """Identity: the no-normalization baseline."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.dim = dim

    def reset_parameters(self) -> None:
        pass

    def forward(self, x: Tensor) -> Tensor:
        return x
