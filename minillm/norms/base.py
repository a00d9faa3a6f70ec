"""What the norms share: the eps placement and the gain / bias handling of the affine norms."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from minillm.errors import check_choice, check_int

EPS_MODES = ("inside", "outside")


def _inv_scale(second_moment: Tensor, eps: float, eps_mode: str) -> Tensor:
    """1 / sqrt(m + eps) or 1 / (sqrt(m) + eps), from a fp32 variance or mean square."""
    if eps_mode == "inside":
        return torch.rsqrt(second_moment + eps)
    return 1.0 / (second_moment.sqrt() + eps)


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
        g = self.gain()
        if g is not None:
            x_hat = x_hat * g.float()
        if self.bias is not None:
            x_hat = x_hat + self.bias.float()
        return x_hat

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, eps_mode={self.eps_mode}, zero_centered={self.zero_centered}"
