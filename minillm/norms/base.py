"""What the norms share: the eps placement and the gain / bias handling of the affine norms."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from minillm.errors import check_choice, check_int
from minillm.norms.impl import IMPLS, affine32, resolve

EPS_MODES = ("inside", "outside")
NORMS: dict[str, type[nn.Module]] = {}  # name -> class: the one registry, filled by @register where each norm is


def register(name: str) -> Callable[[type], type]:
    """Class decorator: the norm is built by ``build_norm(name, ...)`` and chosen by ``norm=name``."""
    def add(cls: type) -> type:
        NORMS[name] = cls
        return cls

    return add


def observed(module: nn.Module) -> bool:
    """Whether hooks watch the module's calls: its own forward or backward hooks, or the global module hooks."""
    from torch.nn.modules import module as nn_module

    hooks = [getattr(module, name) for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                                   "_backward_pre_hooks")]
    hooks += [getattr(nn_module, f"_global_{kind}_hooks", None) for kind in ("forward", "forward_pre", "backward",
                                                                              "backward_pre")]
    return any(hooks)


class Implemented:
    """A norm with several implementations of one function (minillm/norms/impl.py): ``impl`` is the one asked
    (build_norm sets it from model.norm_impl), resolved at the first forward on each device type; ``impl_used``
    says which ran. Subclasses give ``implementations()``: impl -> function of x (None where the module's
    options rule that implementation out)."""

    impl = "reference"

    def set_impl(self, impl: str) -> None:
        check_choice("model.norm_impl", impl, IMPLS)
        self.impl, self._chosen = impl, {}

    def implementations(self) -> dict[str, Callable[[Tensor], Tensor] | None]:
        raise NotImplementedError

    def reference(self, x: Tensor) -> Tensor:
        """The composite of the norm's formula (the definition every other implementation matches)."""
        raise NotImplementedError

    @property
    def impl_used(self) -> str | None:
        chosen = getattr(self, "_chosen", None) or {}
        return ",".join(sorted({name for name, _ in chosen.values()})) or None

    def traced(self, x: Tensor) -> Tensor:
        """What a compiled model traces: the composite, which the compiler fuses with its neighbours."""
        return self.reference(x)

    def run(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            return self.traced(x)
        chosen = self.__dict__.setdefault("_chosen", {})
        found = chosen.get(x.device.type)
        if found is None:
            available = self.implementations()
            name = resolve(self.impl, type(self).__name__.lower(), x.device, available)
            found = chosen[x.device.type] = (name, available[name])
        return found[1](x)


class _AffineNorm(nn.Module):
    """Shared parameter handling: gain ``weight`` (optionally stored as w - 1) and optional ``bias``."""

    def __init__(self, dim: int, eps: float, eps_mode: str, affine: bool, bias: bool, zero_centered: bool):
        super().__init__()
        check_choice("eps_mode", eps_mode, EPS_MODES)
        check_int("dim", dim, low=1)
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
        return affine32(x_hat, self.gain(), self.bias)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, eps_mode={self.eps_mode}, zero_centered={self.zero_centered}"
