"""Fused residual add + RMSNorm: ``y, h = fused_add_rms_norm(x, residual, w, eps)`` computes

    h = x + residual        (in their promoted dtype, rounded once from fp32 as torch's add rounds fp16/bf16/fp32)
    y = rmsnorm(h) * w      (minillm.kernels.rmsnorm's function of h: same eps, offset and cast)

in one kernel, and the backward of both in one pass. A Pre-LN block adds its attention output to the residual
stream and normalizes the sum for its feed-forward sublayer: as two ops that reads and writes the (M, N) rows
five times (the add reads two and writes one, the norm reads one and writes one) in two launches; fused, four
in one. The backward takes dy and dh (the gradient reaching h along the residual stream) together and returns
dx = dresidual = dh + the norm's dx, so the two gradients are summed in fp32 in the kernel that computes the
norm's, not by a third op.

Same kernels as the plain fused RMSNorm (their RESIDUAL variants), registered as ``minillm::add_rms_norm_fwd``
/ ``minillm::add_rms_norm_bwd`` with autograd for torch.compile, and called through a plain
``torch.autograd.Function`` outside it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minillm.kernels import rmsnorm as K


def reference_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float = 0.0,
                           cast: str = "fp32") -> tuple[Tensor, Tensor]:
    """(rmsnorm(x + residual), x + residual) as two PyTorch ops: what the kernel is tested against."""
    h = x + residual
    return K.reference_rms_norm(h, weight, eps, offset, cast), h


def _fwd(x, residual, weight, eps, offset, cast, launch) -> tuple[Tensor, Tensor, Tensor]:
    y, rstd, h = K._fwd(x, weight, eps, offset, cast, launch, residual=residual)
    return y, h, rstd


def _bwd(dy, dh, h, weight, rstd, offset, cast, launch) -> tuple[Tensor, Tensor]:
    """(gradient of h in total, dweight)."""
    return K._bwd(dy, h, weight, rstd, offset, cast, launch, dh=dh)


def _grads(bwd, dy: Tensor | None, dh: Tensor | None, h: Tensor, weight: Tensor, rstd: Tensor, offset: float,
           cast: str, dtypes: tuple) -> tuple:
    """(dx, dresidual, dweight) from the upstream gradients (None for an output that got none): the gradient of h,
    the norm's plus dh in one pass, is that of x and of residual, each in its own dtype (as the add's backward
    gives). With y unused it is dh alone, and the gain gets none."""
    if dy is None:
        d_h, dw = dh, None
    else:
        d_h, dw = bwd(dy, dh, h, weight, rstd, offset, cast)
    if d_h is None:
        return None, None, dw
    return d_h.to(dtypes[0]), d_h.to(dtypes[1]), dw


# ----------------------------------------------------------------------------------------------------------
# custom ops (what torch.compile sees) and the eager autograd.Function


def _add_rms_norm_fwd(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float,
                      cast: str) -> tuple[Tensor, Tensor, Tensor]:
    return _fwd(x, residual, weight, eps, offset, cast, K._op_launch)


def _add_rms_norm_bwd(dy: Tensor, dh: Tensor | None, h: Tensor, weight: Tensor, rstd: Tensor, offset: float,
                      cast: str) -> tuple[Tensor, Tensor]:
    return _bwd(dy, dh, h, weight, rstd, offset, cast, K._op_launch)


def _setup_context(ctx, inputs, output) -> None:
    x, residual, weight, _eps, offset, cast = inputs
    _y, h, rstd = output
    ctx.save_for_backward(h, weight, rstd)
    ctx.offset, ctx.cast, ctx.dtypes = offset, cast, (x.dtype, residual.dtype)
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros to read


def _backward(ctx, dy: Tensor | None, dh: Tensor | None, _drstd: Tensor | None):
    h, weight, rstd = ctx.saved_tensors
    return *_grads(torch.ops.minillm.add_rms_norm_bwd, dy, dh, h, weight, rstd, ctx.offset, ctx.cast,
                   ctx.dtypes), None, None, None


def _fake_fwd(x, residual, weight, eps, offset, cast):
    y, rstd = K._fwd_outputs(x, torch.promote_types(x.dtype, residual.dtype))
    return y, torch.empty_like(y), rstd


def _fake_bwd(dy, dh, h, weight, rstd, offset, cast):
    return torch.empty_like(h, memory_format=torch.contiguous_format), torch.empty_like(weight)


def _register_ops() -> None:
    """minillm::add_rms_norm_fwd / add_rms_norm_bwd, as minillm.kernels.rmsnorm registers its own: triton_ops on
    a GPU, opaque custom_ops with fake implementations under the interpreter."""
    if K._interpreting():
        fwd = torch.library.custom_op("minillm::add_rms_norm_fwd", _add_rms_norm_fwd, mutates_args=())
        bwd = torch.library.custom_op("minillm::add_rms_norm_bwd", _add_rms_norm_bwd, mutates_args=())
        fwd.register_fake(_fake_fwd)
        bwd.register_fake(_fake_bwd)
    else:
        fwd = torch.library.triton_op("minillm::add_rms_norm_fwd", _add_rms_norm_fwd, mutates_args=())
        torch.library.triton_op("minillm::add_rms_norm_bwd", _add_rms_norm_bwd, mutates_args=())
    fwd.register_autograd(_backward, setup_context=_setup_context)


if K.HAS_TRITON:
    _register_ops()


class _FusedAddRMSNormFunction(torch.autograd.Function):
    """Eager path: the kernels called directly."""

    @staticmethod
    def forward(ctx, x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float, cast: str):
        y, h, rstd = _fwd(x, residual, weight, eps, offset, cast, K._direct)
        ctx.save_for_backward(h, weight, rstd)
        ctx.offset, ctx.cast, ctx.dtypes = offset, cast, (x.dtype, residual.dtype)
        ctx.set_materialize_grads(False)
        return y, h

    @staticmethod
    def backward(ctx, dy: Tensor | None, dh: Tensor | None):
        h, weight, rstd = ctx.saved_tensors
        bwd = lambda *a: _bwd(*a, K._direct)  # noqa: E731
        return *_grads(bwd, dy, dh, h, weight, rstd, ctx.offset, ctx.cast, ctx.dtypes), None, None, None


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float = 0.0,
                       cast: str = "fp32") -> tuple[Tensor, Tensor]:
    """(y, h): h = x + residual and y = RMSNorm of h with gain weight (N,) + offset, by one Triton kernel;
    autograd gives dx, dresidual and dW. x and residual: one shape (no broadcasting), any float dtypes."""
    K.check_args(x, weight, cast, "fused_add_rms_norm")
    if torch.float64 in (x.dtype, residual.dtype):
        raise ValueError("fused_add_rms_norm adds in fp32, so a float64 sum would lose precision: use x + residual "
                         "and fused_rms_norm (or the reference) for float64")
    if residual.shape != x.shape:
        raise ValueError(f"residual of shape {tuple(residual.shape)} does not match x {tuple(x.shape)} "
                         "(no broadcasting)")
    if not residual.is_floating_point() or residual.device != x.device:
        raise ValueError(f"residual must be a floating-point tensor on {x.device}, got {residual.dtype} on "
                         f"{residual.device}")
    eps, offset = float(eps), float(offset)
    if not K._eager_ok(x, residual, weight):
        return torch.ops.minillm.add_rms_norm_fwd(x, residual, weight.contiguous(), eps, offset, cast)[:2]
    if torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad or weight.requires_grad):
        return _FusedAddRMSNormFunction.apply(x, residual, weight, eps, offset, cast)
    y, h, _ = _fwd(x, residual, weight, eps, offset, cast, K._direct)
    return y, h
