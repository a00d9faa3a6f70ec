"""How a norm is computed (``model.norm_impl``), the same function and parameters whichever way:

    reference  the fp32 composite of the norm's formula (x.float(), mean, rsqrt, ...): the definition
    torch      torch's fused kernels where one computes the same thing (F.layer_norm; F.rms_norm, fused on CUDA)
    compiled   the reference, compiled once per norm function by torch.compile (Inductor fuses it; a CPU needs
               the C++ compiler)
    triton     minillm's fused Triton RMSNorm (minillm/kernels/rmsnorm.py; CUDA, or TRITON_INTERPRET=1)
    auto       the fastest of these that needs no compile at start, for the norm on the device (AUTO, from the
               norm-implementation benchmark in experiments/), among those the norm's options allow

A norm with options an implementation does not honour (eps outside the square root, per-position batch
statistics, ...) runs its reference instead: ``resolve`` says which ran, and summary.json records it per norm
(``norm_impl``). The parameters and state_dict are the module's, so checkpoints move between implementations.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

IMPLS = ("auto", "reference", "torch", "compiled", "triton")
# What auto runs, per device type and norm, in order of preference (the first the norm's options and the machine
# allow; a norm not listed runs its reference), fp32 and bf16 alike. The CPU row from the norm-implementation
# benchmark (experiments/, its results say the machine); CUDA's RMSNorm from the kernel benchmark on an H200
# (experiments/benchmarks/kernels/README.md#results: faster than F.rms_norm and the reference forward+backward at
# every judged shape, bf16), its LayerNorm torch's fused kernel (timed there against the RMSNorm kernels, not
# against a compiled LayerNorm).
# Compiled composites are left to be asked for (norm_impl=compiled, or model.compile=true, which fuses every norm
# with the rest of the model): they cost a compile at start and at every new shape. So on a CPU, where torch has
# a fused LayerNorm but no fused RMSNorm, RMSNorm runs its reference unless compiled.
AUTO: dict[str, dict[str, tuple[str, ...]]] = {
    "cpu": {"layernorm": ("torch",)},
    "cuda": {"layernorm": ("torch",), "rmsnorm": ("triton", "torch")},
}


# --- the reference composites, as pure functions (so one compiled graph serves every module) ---------------


def inv_scale(second_moment: Tensor, eps: float, eps_mode: str) -> Tensor:
    """1 / sqrt(m + eps) or 1 / (sqrt(m) + eps), from a fp32 variance or mean square."""
    if eps_mode == "inside":
        return torch.rsqrt(second_moment + eps)
    return 1.0 / (second_moment.sqrt() + eps)


def affine32(x_hat: Tensor, gain: Tensor | None, bias: Tensor | None) -> Tensor:
    """Gain and bias applied in fp32."""
    if gain is not None:
        x_hat = x_hat * gain.float()
    if bias is not None:
        x_hat = x_hat + bias.float()
    return x_hat


def layer_norm(x: Tensor, gain: Tensor | None, bias: Tensor | None, eps: float, eps_mode: str) -> Tensor:
    """(x - mean) / sqrt(var + eps) * gain + bias, biased variance, in fp32; the input's dtype out."""
    x32 = x.float()  # (B, T, C)
    xc = x32 - x32.mean(-1, keepdim=True)
    var = (xc * xc).mean(-1, keepdim=True)  # biased: / C, not / (C - 1)
    return affine32(xc * inv_scale(var, eps, eps_mode), gain, bias).to(x.dtype)


def rms_norm(x: Tensor, gain: Tensor | None, eps: float, eps_mode: str, cast: str) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * gain; cast "llama": normalized in fp32, cast to x's dtype, then the gain."""
    x32 = x.float()  # (B, T, C)
    x_hat = x32 * inv_scale(x32.pow(2).mean(-1, keepdim=True), eps, eps_mode)
    if gain is None:
        return x_hat.to(x.dtype)
    if cast == "llama":
        return x_hat.to(x.dtype) * gain.to(x.dtype)
    return (x_hat * gain.float()).to(x.dtype)


def dyt(x: Tensor, alpha: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """weight * tanh(alpha * x) + bias, in fp32."""
    return affine32(torch.tanh(alpha.float() * x.float()), weight, bias).to(x.dtype)


def derf(x: Tensor, alpha: Tensor, shift: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """weight * erf(alpha * x + shift) + bias, in fp32."""
    return affine32(torch.erf(alpha.float() * x.float() + shift.float()), weight, bias).to(x.dtype)


def scale_norm(x: Tensor, g: Tensor, eps: float) -> Tensor:
    """g * x / max(||x||_2, eps), in fp32."""
    x32 = x.float()  # (B, T, C)
    norm = torch.linalg.vector_norm(x32, dim=-1, keepdim=True).clamp_min(eps)  # (B, T, 1)
    return (x32 * (g.float() / norm)).to(x.dtype)


# --- torch's fused kernels ---------------------------------------------------------------------------------


def layer_norm_torch(x: Tensor, gain: Tensor | None, bias: Tensor | None, eps: float, eps_mode: str) -> Tensor:
    """F.layer_norm on the fp32 input (its kernel normalizes with eps inside the square root)."""
    w = gain.float() if gain is not None else None
    b = bias.float() if bias is not None else None
    return F.layer_norm(x.float(), (x.shape[-1],), w, b, eps).to(x.dtype)


def rms_norm_torch(x: Tensor, gain: Tensor | None, eps: float, eps_mode: str, cast: str) -> Tensor:
    """F.rms_norm on the fp32 input, the gain applied in the reference's order."""
    x_hat = F.rms_norm(x.float(), (x.shape[-1],), None, eps)
    if gain is None:
        return x_hat.to(x.dtype)
    if cast == "llama":
        return x_hat.to(x.dtype) * gain.to(x.dtype)
    return (x_hat * gain.float()).to(x.dtype)


_COMPILED: dict[Callable, Callable] = {}


def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by torch.compile, once per function: every module of a norm shares the graph. (A model
    compiled as a whole runs the composites instead: Implemented.run.)"""
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn)
    return _COMPILED[fn]


def resolve(asked: str, norm: str, device: torch.device, available: dict[str, Callable | None]) -> str:
    """The implementation that runs: ``asked``, or ``auto``'s first choice for the norm on the device that is
    available; the reference when the norm's options leave none (``available`` maps an impl to its function,
    None where the options or the machine rule it out)."""
    wanted = AUTO.get(device.type, {}).get(norm, ()) if asked == "auto" else (asked,)
    return next((impl for impl in wanted if available.get(impl) is not None), "reference")
