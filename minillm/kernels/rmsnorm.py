"""Fused RMSNorm in Triton (forward, dx, dW) and the pure-PyTorch reference it is tested against.

    y = x * rstd * (w + offset),   rstd = 1 / sqrt(mean(x^2) + eps)   over the last dim, reduced in fp32.

cast="fp32":  the product is taken in fp32 and cast to x's dtype once at the end.
cast="llama": x_hat = x * rstd is cast to x's dtype, then multiplied by (w + offset) cast to x's dtype
              (LLaMA's order; minillm.norms.RMSNorm does the same).
offset=1.0 serves the zero-centered gain, where the stored weight is w - 1.

Kernel layout (docs/kernels.md has the reasoning and the traps):
  forward   one row per program, BLOCK = next pow2 >= hidden (masked), fp32 sum of squares, rstd saved
            (fp32, one per row). Rows wider than MAX_FUSED_HIDDEN loop over LOOP_BLOCK chunks in two passes.
  backward  one pass: a persistent grid of P programs (bwd_config: programs per SM x SMs), each walking blocks
            of ROWS rows; x and dy are read once per row, x_hat is recomputed from the saved rstd, dx is
            written to a new tensor (never over dy) and dW += dy * x_hat accumulates in one [BLOCK] row of fp32
            registers (each block of rows summed into it). Each program writes its row of a (P, hidden) fp32
            buffer (every row written, zeros when it had no rows); one fp32 sum(0), then a cast to the weight
            dtype. The fused residual add's variant has its own tunables (ADD_BWD_CONFIGS). Bytes: read x, dy
            (2*M*N*es), write dx (M*N*es).
  wide rows above MAX_ONEPASS_HIDDEN (16384: the dW accumulator spills there already, yet one pass measured
            faster): a dx kernel (one row per program, looped over LOOP_BLOCK chunks when wider than
            MAX_FUSED_HIDDEN) and a dW kernel on a grid of (row groups x column tiles); they read x and dy twice
            (5*M*N*es bytes instead of 3).
Rows use 64-bit offsets, eps and offset are cast to fp32 inside the kernels, only block sizes and the cast
mode are constexpr. The kernels are registered as ``minillm::rms_norm_fwd`` / ``minillm::rms_norm_bwd``
(``torch.library.triton_op`` on a GPU, an opaque ``custom_op`` under the interpreter), with autograd, so
torch.compile traces them without a graph break. Outside torch.compile, ``fused_rms_norm`` calls the same
kernels through a plain ``torch.autograd.Function`` (no custom-op dispatch on every eager call).

This is the only module of minillm that imports triton; without triton it still imports, and
``require_fused()`` says what is missing.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
from torch import Tensor

from minillm.errors import check_choice
from minillm.kernels.rmsnorm_triton import HAS_TRITON, tl, triton

if HAS_TRITON:
    from minillm.kernels.rmsnorm_triton import (
        _bwd_dw_kernel,
        _bwd_dx_kernel,
        _bwd_dx_loop_kernel,
        _bwd_kernel,
        _fwd_kernel,
        _fwd_loop_kernel,
    )

CASTS = ("fp32", "llama")
MAX_FUSED_HIDDEN = 16384  # widest row the forward holds in registers as one block; wider rows loop
MAX_ONEPASS_HIDDEN = 16384  # widest row of the one-pass backward (its dW accumulator lives in registers;
#                             at 16K it spills, yet is faster than the two-kernel path: BWD_CONFIGS)
LOOP_BLOCK = 4096  # chunk width of the looped kernels
DW_BLOCK_ROWS = 32  # wide-row dW tile: rows per step
DW_BLOCK_COLS = 128  # wide-row dW tile: columns per program
DW_PROGRAMS_PER_SM = 4  # wide-row dW grid per SM: 72 registers x 128 threads would allow 7 (sm_90 compile)
INTERPRETER_SMS = 4  # stand-in SM count under TRITON_INTERPRET=1

# One-pass backward tunables by row block (BLOCK = next pow2 >= hidden, up to MAX_ONEPASS_HIDDEN):
# (largest BLOCK, ROWS per iteration, num_warps, programs per SM, STAGES), one table per variant: BWD_CONFIGS for
# the plain backward, ADD_BWD_CONFIGS for the fused residual add's (it also reads dh, so what hides its memory
# latency differs; configs tuned on the plain kernel alone made it 8-12% slower at 4096 and 8192 on an H200).
# Each thread holds ROWS * BLOCK / (32 * num_warps) elements of x and of dy; the fp32 dW partial is one [BLOCK] row
# per program whatever ROWS is. Programs per SM: what one SM's 64K registers hold, from the register count of an
# offline sm_90 compile of the kernel as it is launched (bf16, 16-byte aligned pointers and strides), capped at 4;
# tests/test_kernels.py::test_kernels_compile_for_sm90 prints them and fails on a spill (but the one at 16384,
# below) or on programs per SM that do not fit. STAGES > 1 prefetches the next rows into shared memory (cp.async)
# while the current row is reduced. The tables hold what the H200 tune (bench.py --mode tune, M 32K, bf16,
# Triton 3.6) measured fastest, or within 1% of it: for the plain kernel STAGES 1 everywhere; for the fused add
# the configs it ran fastest with, STAGES 2 at 4096 and 8192 (experiments/benchmarks/kernels/README.md#results).
# The tune times both variants of every candidate in one run and marks each variant's best. Set
# MAX_ONEPASS_HIDDEN = 8192 to give hidden 16384 the two-kernel path again on a GPU where the spilling one-pass
# kernel is slower.
BWD_CONFIGS = (
    (256, 8, 4, 4, 1),
    (512, 4, 4, 4, 1),
    (1024, 2, 4, 4, 1),
    (2048, 1, 8, 4, 1),
    (4096, 1, 8, 2, 1),
    (8192, 1, 16, 1, 1),
    (16384, 1, 32, 1, 1),  # spills 212 bytes per thread (sm_90), yet on an H200 faster than the two-kernel path
)
ADD_BWD_CONFIGS = (
    (256, 8, 4, 4, 1),
    (512, 4, 4, 4, 1),
    (1024, 2, 4, 4, 1),
    (2048, 1, 8, 4, 1),
    (4096, 1, 8, 2, 2),
    (8192, 1, 16, 1, 2),
    (16384, 1, 32, 1, 1),  # spills 220 bytes per thread (sm_90), yet on an H200 faster than the two-kernel path
)


# ----------------------------------------------------------------------------------------------------------
# reference


def _check_cast(cast: str) -> None:
    check_choice("cast", cast, CASTS)


def reference_rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0,
                       cast: str = "fp32") -> Tensor:
    """Pure-PyTorch RMSNorm with the kernel's semantics; math in fp32 (fp64 when x is fp64)."""
    _check_cast(cast)
    acc = torch.promote_types(x.dtype, torch.float32)
    xa = x.to(acc)  # (..., N)
    x_hat = xa * torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)  # (..., N)
    gain = weight.to(acc) + offset  # (N,)
    if cast == "llama":
        return x_hat.to(x.dtype) * gain.to(x.dtype)
    return (x_hat * gain).to(x.dtype)


# ----------------------------------------------------------------------------------------------------------
# launch helpers: `launch` is _direct (eager: call the kernel) or _traced (the custom ops: wrap_triton)


def _built_for_interpreter() -> tuple[bool, bool]:
    """(our kernels were built for the interpreter, so were Triton's own jit helpers such as tl.sum's)."""
    if not HAS_TRITON:
        return False, False
    from triton.runtime.interpreter import InterpretedFunction

    helper = getattr(getattr(tl, "standard", None), "_sum_combine", None)
    ours = isinstance(_fwd_kernel, InterpretedFunction)
    return ours, ours if helper is None else isinstance(helper, InterpretedFunction)


_INTERPRETED, _TRITON_INTERPRETED = _built_for_interpreter()


def _interpreting() -> bool:
    """True when the kernels were built for the CPU interpreter (TRITON_INTERPRET=1 at import time)."""
    return _INTERPRETED


def _direct(kernel):
    return kernel


def _traced(kernel):
    from torch.library import wrap_triton

    return wrap_triton(kernel)


def _wraps_interpreted_kernels() -> bool:
    """Whether this torch's wrap_triton takes a kernel built for the interpreter (torch 2.11 refuses one:
    "wrap_triton only works on functions annotated with triton.jit or triton.autotune")."""
    try:
        _traced(_fwd_kernel)
        return True
    except RuntimeError:
        return False


# the launch inside the custom ops: wrap_triton (what a triton_op needs on the GPU, rehearsed under the interpreter
# where this torch allows it), else a direct call, which the opaque custom_op of the interpreter allows
_OP_LAUNCH_TRACED = HAS_TRITON and (not _INTERPRETED or _wraps_interpreted_kernels())
_op_launch = _traced if _OP_LAUNCH_TRACED else _direct


def _on_device_of(t: Tensor):
    """Triton launches on the current CUDA device: make it t's for the launch when it is not."""
    if t.is_cuda and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SMS


def _num_warps(block: int) -> int:
    """Forward: ~4 warps below 2K elements, 8 from 2K, 16 from 8K, 32 from 32K."""
    return 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4


def _row_block(n: int) -> tuple[int, bool]:
    """(BLOCK, looped) for rows of n elements."""
    if n <= MAX_FUSED_HIDDEN:
        return triton.next_power_of_2(n), False
    return LOOP_BLOCK, True


def bwd_config(n: int, residual: bool = False) -> tuple[int, int, int, int]:
    """(ROWS per iteration, num_warps, programs per SM, STAGES) of the one-pass backward for rows of n elements, of
    the fused residual add's variant with ``residual``."""
    block = triton.next_power_of_2(n)
    for max_block, *config in ADD_BWD_CONFIGS if residual else BWD_CONFIGS:
        if block <= max_block:
            return tuple(config)
    raise ValueError(f"no one-pass backward config for hidden {n} (> {BWD_CONFIGS[-1][0]})")


def _rows(t: Tensor, n: int) -> Tensor:
    """(..., n) -> (M, n) with unit column stride: a view when strides allow, else a contiguous copy."""
    t2 = t.reshape(-1, n)  # (M, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _launch_bwd(dy2d: Tensor, x2d: Tensor, weight: Tensor, rstd: Tensor, dx2d: Tensor, partial: Tensor,
                offset: float, llama: bool, config: tuple[int, int, int, int], launch=_direct,
                dh2d: Tensor | None = None):
    """One-pass backward on a grid of partial.shape[0] programs: dx2d (+ dh2d), and each program's row of
    partial."""
    m, n = x2d.shape
    rows, warps, _per_sm, stages = config
    dh = dy2d if dh2d is None else dh2d  # never read without a residual
    return launch(_bwd_kernel)[(partial.shape[0],)](
        dy2d, dh, x2d, weight, rstd, dx2d, partial, dy2d.stride(0), dh.stride(0), x2d.stride(0), dx2d.stride(0),
        m, n, offset, LLAMA=llama, RESIDUAL=dh2d is not None, BLOCK=triton.next_power_of_2(n), ROWS=rows,
        STAGES=stages, num_warps=warps)


def _dw_grid(m: int, n: int, sms: int) -> tuple[int, int]:
    """Wide rows: (groups, rows_per_program) of the dW grid (groups x column tiles, ~DW_PROGRAMS_PER_SM per SM)."""
    tiles = triton.cdiv(n, DW_BLOCK_COLS)
    target = max(1, DW_PROGRAMS_PER_SM * sms // tiles)
    groups = max(1, min(target, triton.cdiv(m, DW_BLOCK_ROWS)))
    rows_per_program = triton.cdiv(triton.cdiv(m, groups), DW_BLOCK_ROWS) * DW_BLOCK_ROWS
    return triton.cdiv(m, rows_per_program), rows_per_program


def _launch_dw(dy2d: Tensor, x2d: Tensor, rstd: Tensor, partial: Tensor, rows_per_program: int,
               llama: bool, launch=_direct) -> None:
    """Wide rows: fill partial (groups, N) fp32 with per-group sums of dy * x_hat (every element written)."""
    m, n = x2d.shape
    grid = (partial.shape[0], triton.cdiv(n, DW_BLOCK_COLS))
    launch(_bwd_dw_kernel)[grid](dy2d, x2d, rstd, partial, dy2d.stride(0), x2d.stride(0), m, n,
                                 rows_per_program, LLAMA=llama, BLOCK_ROWS=DW_BLOCK_ROWS,
                                 BLOCK_COLS=DW_BLOCK_COLS, num_warps=4)


def _fwd_outputs(x: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """Empty (y, rstd): y (..., N) contiguous in dtype (x's by default), rstd (...,) fp32."""
    y = torch.empty(x.shape, dtype=dtype or x.dtype, device=x.device)  # (..., N)
    return y, torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)  # (...,)


def _fwd(x: Tensor, weight: Tensor, eps: float, offset: float, cast: str, launch,
         residual: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(y, rstd, h) by the forward kernel; x (..., N) with any strides, weight (N,) contiguous. With a residual
    (x's shape), h = x + residual in their promoted dtype is what is normalized (h None without one)."""
    n = x.shape[-1]
    x2d, weight = _rows(x, n), weight.contiguous()  # (M, N), (N,)
    r2d = x2d if residual is None else _rows(residual, n)  # never read without a residual
    dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    y, rstd = _fwd_outputs(x, dtype)
    h = None if residual is None else torch.empty_like(y)  # (..., N), y's layout
    m = x2d.shape[0]
    if m > 0:
        block, looped = _row_block(n)
        args = (x2d, r2d, weight, y, y if h is None else h, rstd, x2d.stride(0), r2d.stride(0), n, n, eps, offset)
        meta = dict(LLAMA=cast == "llama", RESIDUAL=h is not None, BLOCK=block, num_warps=_num_warps(block))
        with _on_device_of(x):
            launch(_fwd_loop_kernel if looped else _fwd_kernel)[(m,)](*args, **meta)
    return y, rstd, h


def _bwd(dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float, cast: str,
         launch, dh: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(dx, dweight): dx like x (contiguous, never aliasing dy), dweight like weight. With dh (x's shape), the
    gradient reaching x from elsewhere, dx is the sum of the norm's and dh."""
    n = x.shape[-1]
    x2d, dy2d = _rows(x, n), _rows(dy, n)  # (M, N)
    dh2d = None if dh is None else _rows(dh, n)
    weight, rstd = weight.contiguous(), rstd.contiguous()  # (N,), (...,)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # (..., N)
    m = x2d.shape[0]
    if m == 0:
        return dx, torch.zeros_like(weight)
    llama = cast == "llama"
    with _on_device_of(x):
        if n <= MAX_ONEPASS_HIDDEN:
            config = bwd_config(n, dh2d is not None)
            programs = min(config[2] * _num_sms(x.device), triton.cdiv(m, config[0]))
            partial = torch.empty((programs, n), dtype=torch.float32, device=x.device)  # (P, N)
            _launch_bwd(dy2d, x2d, weight, rstd, dx.view(-1, n), partial, offset, llama, config, launch, dh2d)
        else:
            block, looped = _row_block(n)
            dh_arg = dy2d if dh2d is None else dh2d  # never read without a residual
            args = (dy2d, dh_arg, x2d, weight, rstd, dx, dy2d.stride(0), dh_arg.stride(0), x2d.stride(0), n, n,
                    offset)
            meta = dict(LLAMA=llama, RESIDUAL=dh2d is not None, BLOCK=block, num_warps=_num_warps(block))
            launch(_bwd_dx_loop_kernel if looped else _bwd_dx_kernel)[(m,)](*args, **meta)
            groups, rows_per_program = _dw_grid(m, n, _num_sms(x.device))
            partial = torch.empty((groups, n), dtype=torch.float32, device=x.device)  # (groups, N)
            _launch_dw(dy2d, x2d, rstd, partial, rows_per_program, llama, launch)
    return dx, partial.sum(0).to(weight.dtype)  # (N,)


# ----------------------------------------------------------------------------------------------------------
# custom ops (what torch.compile sees) and the eager autograd.Function


def _rms_norm_fwd(x: Tensor, weight: Tensor, eps: float, offset: float, cast: str) -> tuple[Tensor, Tensor]:
    return _fwd(x, weight, eps, offset, cast, _op_launch)[:2]


def _rms_norm_bwd(dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float,
                  cast: str) -> tuple[Tensor, Tensor]:
    return _bwd(dy, x, weight, rstd, offset, cast, _op_launch)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, _eps, offset, cast = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.offset, ctx.cast = offset, cast


def _backward(ctx, dy: Tensor, _drstd: Tensor | None):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = torch.ops.minillm.rms_norm_bwd(dy, x, weight, rstd, ctx.offset, ctx.cast)
    return dx, dw, None, None, None


def _register_ops() -> None:
    """Register minillm::rms_norm_fwd / rms_norm_bwd (with autograd) for torch.compile and opcheck.

    On the GPU they are ``triton_op``s, so Inductor sees the kernels. The interpreter's kernels cannot be
    traced with fake tensors, so under TRITON_INTERPRET=1 they are opaque ``custom_op``s with explicit fake
    implementations: same schema, same Python body, no graph break either way.
    """
    if _interpreting():
        fwd = torch.library.custom_op("minillm::rms_norm_fwd", _rms_norm_fwd, mutates_args=())
        bwd = torch.library.custom_op("minillm::rms_norm_bwd", _rms_norm_bwd, mutates_args=())
        fwd.register_fake(lambda x, weight, eps, offset, cast: _fwd_outputs(x))
        bwd.register_fake(lambda dy, x, weight, rstd, offset, cast: (
            torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)))
    else:
        fwd = torch.library.triton_op("minillm::rms_norm_fwd", _rms_norm_fwd, mutates_args=())
        torch.library.triton_op("minillm::rms_norm_bwd", _rms_norm_bwd, mutates_args=())
    fwd.register_autograd(_backward, setup_context=_setup_context)


if HAS_TRITON:
    _register_ops()


class _FusedRMSNormFunction(torch.autograd.Function):
    """Eager path: the kernels of the custom ops, called directly (no dispatcher, no wrap_triton)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float, offset: float, cast: str) -> Tensor:
        y, rstd, _ = _fwd(x, weight, eps, offset, cast, _direct)
        ctx.save_for_backward(x, weight, rstd)
        ctx.offset, ctx.cast = offset, cast
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = _bwd(dy, x, weight, rstd, ctx.offset, ctx.cast, _direct)
        return dx, dw, None, None, None


def _eager_ok(*tensors: Tensor) -> bool:
    """The direct path: not inside torch.compile, and plain tensors with data (fake, functional or other
    subclasses, as tracers and transforms hand over, and meta tensors, as FLOP counters use, go through the
    registered ops, whose fake implementations give the shapes)."""
    return not torch.compiler.is_compiling() and all(type(t) in (Tensor, torch.nn.Parameter) and not t.is_meta
                                                     for t in tensors)


# ----------------------------------------------------------------------------------------------------------
# public API


def require_fused(what: str = "fused_rmsnorm", instead: str = "norm=rmsnorm") -> None:
    """Raise RuntimeError saying what to do when the fused kernels cannot run here (no silent fallback); ``what``
    names the setting that asked for them, ``instead`` the one that runs anywhere."""
    if not HAS_TRITON:
        raise RuntimeError(f"{what} needs Triton, which is not installed: pip install triton (or use {instead})")
    if torch.cuda.is_available() and not _interpreting():
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{what} needs a CUDA GPU and none is visible: run on a CUDA GPU, or set "
                           "TRITON_INTERPRET=1 for the slow CPU interpreter (tests only), "
                           f"or use {instead}")
    if not _interpreting():
        raise RuntimeError("TRITON_INTERPRET=1 was set after minillm.kernels.rmsnorm was imported, so its "
                           "kernels were built for the GPU: set it before the first import")
    if not _TRITON_INTERPRETED:
        raise RuntimeError("TRITON_INTERPRET=1 was set after triton itself was imported (tl.sum and the other "
                           "jit helpers of Triton were built for the GPU): set it before anything imports triton")


def check_args(x: Tensor, weight: Tensor, cast: str, what: str = "fused_rms_norm") -> None:
    """ValueError (RuntimeError without triton) for arguments the kernels cannot take."""
    _check_cast(cast)
    if not HAS_TRITON:
        require_fused()
    if weight.ndim != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight of shape {tuple(weight.shape)} does not match the last dim of x "
                         f"{tuple(x.shape)}")
    if not (x.is_floating_point() and weight.is_floating_point()):
        raise ValueError(f"{what} needs floating-point x and weight, got {x.dtype}, {weight.dtype}")
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device} but weight is on {weight.device}")
    if x.device.type not in ("cuda", "meta") and not _INTERPRETED:  # meta: shapes only, through the fake impls
        raise ValueError(f"{what} runs on CUDA tensors (x is on {x.device}): move the model to a "
                         "CUDA GPU, or set TRITON_INTERPRET=1 before import for the CPU interpreter "
                         "(tests only)")


def fused_rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0, cast: str = "fp32") -> Tensor:
    """RMSNorm of x (..., N) with gain weight (N,) + offset, by the Triton kernels; autograd gives dx, dW."""
    check_args(x, weight, cast)
    eps, offset = float(eps), float(offset)
    if not _eager_ok(x, weight):
        return torch.ops.minillm.rms_norm_fwd(x, weight.contiguous(), eps, offset, cast)[0]
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _FusedRMSNormFunction.apply(x, weight, eps, offset, cast)
    return _fwd(x, weight, eps, offset, cast, _direct)[0]
