"""The implementations the kernel benchmark times: each provider maps (weight, eps) to a function of x (the norm)
or of (x, residual) (the add + norm, returning (y, h)). Liger-Kernel's where it imports and runs."""

from __future__ import annotations

import os

from experiments.common.failure import failure


def error_line(e: Exception) -> str:
    """The one-line error of a failed cell."""
    return failure(e)["error"]



def composite(x, w, eps: float):
    """Eager RMSNorm as most codebases write it: fp32 upcast, normalize, cast, multiply (LLaMA's order)."""
    import torch

    x32 = x.float()  # (M, N)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def make_providers(use_compile: bool, only=None) -> dict:
    import torch
    import torch.nn.functional as F

    from minillm.kernels.rmsnorm import fused_rms_norm

    providers = {
        "fused": lambda w, eps: lambda x: fused_rms_norm(x, w, eps, cast="llama"),
        "eager": lambda w, eps: lambda x: composite(x, w, eps),
        "F.rms_norm": lambda w, eps: lambda x: F.rms_norm(x, (x.shape[-1],), w, eps),
        # not RMSNorm: LayerNorm (gain, no bias) by torch's fused kernel, for "is RMSNorm faster?" with named kernels
        "F.layer_norm": lambda w, eps: lambda x: F.layer_norm(x, (x.shape[-1],), w, None, eps),
    }
    if use_compile:
        compiled = torch.compile(composite, dynamic=False)
        providers["torch.compile"] = lambda w, eps: lambda x: compiled(x, w, eps)
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm

        def liger(w, eps):
            try:
                mod = LigerRMSNorm(w.shape[0], eps=eps, casting_mode="llama")
            except TypeError:  # older releases have no casting_mode argument
                mod = LigerRMSNorm(w.shape[0], eps=eps)
            mod.weight = w  # share the benchmark's bf16 parameter
            return mod

        providers["liger"] = liger
        if os.environ.get("TRITON_INTERPRET") == "1" and (why := interpreter_refuses(liger)):
            import triton

            print(f"liger-kernel does not run under Triton {triton.__version__}'s interpreter ({why}); skipping that "
                  "baseline in this dry run (on a GPU it runs compiled)")
            del providers["liger"]
    except Exception as e:  # not installed, or broken on this machine
        print(f"liger-kernel not importable ({error_line(e)}); skipping that baseline")
    return {k: v for k, v in providers.items() if not only or k in only}


def make_add_providers(use_compile: bool, only=None) -> dict:
    """Add + norm providers: f(x, residual) -> (y, h), h = x + residual, y = RMSNorm(h)."""
    import torch

    from minillm.kernels.add_rmsnorm import fused_add_rms_norm
    from minillm.kernels.rmsnorm import fused_rms_norm

    def then(norm):  # the add as a torch op, then the norm
        return lambda w, eps: lambda x, r: (norm(h := x + r, w, eps), h)

    providers = {
        "fused_add": lambda w, eps: lambda x, r: fused_add_rms_norm(x, r, w, eps, cast="llama"),
        "add+fused": then(lambda h, w, eps: fused_rms_norm(h, w, eps, cast="llama")),
        "add+eager": then(composite),
    }
    if use_compile:
        compiled = torch.compile(lambda x, r, w, eps: (composite(h := x + r, w, eps), h), dynamic=False)
        providers["torch.compile"] = lambda w, eps: lambda x, r: compiled(x, r, w, eps)
    try:
        from liger_kernel.transformers.fused_add_rms_norm import LigerFusedAddRMSNorm

        def liger(w, eps):  # out of place: the in-place variant writes its gradients over the upstream ones
            mod = LigerFusedAddRMSNorm(w.shape[0], eps=eps, casting_mode="llama", in_place=False)
            mod.weight = w
            return mod

        providers["liger_fused_add"] = liger
        if os.environ.get("TRITON_INTERPRET") == "1" and (why := interpreter_refuses(liger, add=True)):
            print(f"liger-kernel's fused add does not run under the interpreter ({why}); skipping that baseline")
            del providers["liger_fused_add"]
    except Exception as e:  # not installed, too old for a fused add, or broken on this machine
        print(f"liger-kernel's LigerFusedAddRMSNorm not importable ({error_line(e)}); skipping that baseline")
    return {k: v for k, v in providers.items() if not only or k in only}


def interpreter_refuses(make, add: bool = False) -> str | None:
    """The error of a provider's forward and backward on a tiny CPU input, or None when it runs."""
    import torch

    w = torch.nn.Parameter(torch.ones(8))
    x = torch.randn(2, 8, requires_grad=True)
    try:
        out = make(w, 1e-6)(*([x, torch.randn(2, 8)] if add else [x]))
        sum(o.sum() for o in (out if add else [out])).backward()
    except Exception as e:
        return error_line(e)
    return None


def liger_status() -> str:
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        return version("liger-kernel")
    except Exception as e:
        return f"absent ({type(e).__name__})"
