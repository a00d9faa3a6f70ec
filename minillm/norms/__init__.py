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
from typing import Any

from torch import nn

from minillm.errors import ConfigError, check_choice, check_number
from minillm.norms.base import EPS_MODES, NORMS, Implemented
from minillm.norms.batch import BatchNorm, PowerNorm  # importing the norms' modules registers them in NORMS
from minillm.norms.impl import IMPLS
from minillm.norms.token import Derf, DyT, FusedRMSNorm, LayerNorm, NoNorm, RMSNorm, ScaleNorm


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


def build_norm(name: str, dim: int, eps: float = 1e-5, impl: str = "reference", **options) -> nn.Module:
    """Build the norm called ``name`` over the last dimension of size ``dim``, computed by ``impl`` (IMPLS;
    a norm with one implementation, or options another cannot honour, runs its reference)."""
    check_choice("norm", name, sorted(NORMS))
    unknown = sorted(set(options) - set(norm_options(name)))
    if unknown:
        raise ConfigError(f"norm {name!r} does not take option(s) {unknown}; "
                         f"it takes: {', '.join(norm_options(name)) or 'none'}")
    check_number("eps", eps, low=0.0)
    check_choice("model.norm_impl", impl, IMPLS)
    module = NORMS[name](dim, eps, **options)
    if isinstance(module, Implemented):
        module.set_impl(impl)
    return module


def impls_used(model: nn.Module) -> dict[str, str]:
    """norm name -> the implementation(s) its modules ran (``reference`` for a norm with no other), for the
    norms that have run a forward: what summary.json records as ``norm_impl``."""
    names = {cls: name for name, cls in NORMS.items()}
    used: dict[str, set[str]] = {}
    for module in model.modules():
        name = names.get(type(module))
        if name is None:
            continue
        ran = module.impl_used if isinstance(module, Implemented) else "reference"
        if ran:
            used.setdefault(name, set()).update(ran.split(","))
    return {name: ",".join(sorted(impls)) for name, impls in sorted(used.items())}


__all__ = ["EPS_MODES", "IMPLS", "NORMS", "BatchNorm", "Derf", "DyT", "FusedRMSNorm", "LayerNorm", "NoNorm",
           "PowerNorm", "RMSNorm", "ScaleNorm", "batch_statistics", "build_norm", "canonical_norm", "canonical_norms",
           "impls_used", "norm_options"]
