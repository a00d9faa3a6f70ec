"""Where the norm sits in a decoder layer: one declaration per placement, as norms have their registry.

For each sublayer f of a block (attention, then feed-forward), a placement says how the residual stream x, the
sublayer and its norms combine:

    pre:  x ─┬─ norm ─ f ─(+)─>        post:  x ─┬─ f ─(+)─ norm ─>
             └─────────────┘                     └──────┘

    pre       x + f(norm(x))                    GPT-2, LLaMA
    post      norm(x + f(x))                    the original Transformer
    peri      x + norm_out(f(norm(x)))          Peri-LN / Gemma 2's "sandwich"
    branch    x + norm(f(x))                    OLMo 2 (a norm on the branch output only)
    deepnorm  norm(alpha * x + f(x))            DeepNet, alpha = (2L)^(1/4)
    double    norm_out(x + f(norm(x)))          pre + post: a norm on the branch input and on the sum

A ``Placement`` declares, besides that rule: whether it has a second norm per sublayer (``out_norm``), whether its
block ends normalized (``ends_normed``: the model then adds no final norm), whether its input norm is the one
LayerNorm Scaling scales (``scales_input``), its residual multiplier (``alpha``), the init scheme ``init=auto``
picks for it, whether the fused add + RMSNorm kernel can serve it (``fused_add``), and which function ends the
branch (``branch_end``: what a residual-branch scalar multiplies, ``ResidualGain``). Adding a placement is one
``register(Placement(...))`` here, a row in docs/norms_and_placements.md, and (for a preset) a config.

``mix`` (Mix-LN: Post-LN in the first layers, Pre-LN after) and ``model.layers`` are per-layer schedules of these
placements (ModelConfig.layer_specs), not placements of a layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from minillm.errors import check_choice

if TYPE_CHECKING:
    from minillm.model import ModelConfig

Norm = Callable[[Tensor], Tensor]
# (x, f, norm, out_norm, scale, alpha) -> the residual stream after the sublayer; scale is LayerNorm Scaling's
# factor of the input norm (1 without it), alpha the placement's residual multiplier
Rule = Callable[[Tensor, Callable[[Tensor], Tensor], Norm, "Norm | None", float, float], Tensor]


@dataclass(frozen=True)
class Placement:
    name: str
    rule: Rule
    source: str  # where it comes from (docs/norms_and_placements.md cites it in full)
    out_norm: bool = False  # a second norm per sublayer (norm_out), built like the first
    ends_normed: bool = False  # the block's output is a norm's output: no final norm before the head
    scales_input: bool = False  # its first norm normalizes the sublayer's input: the one LayerNorm Scaling scales
    alpha: Callable[[ModelConfig], float] | None = None  # the residual multiplier; None: 1
    init: str = "gpt2"  # the scheme model.init=auto takes for its layers (Transformer.init_weights)
    fused_add: bool = False  # the feed-forward's input norm may add the attention output in the same kernel
    branch_end: str = "f"  # what the branch ends in (a residual scalar multiplies it): f, norm or out (norm_out)

    def residual_scale(self, cfg: ModelConfig) -> float:
        return self.alpha(cfg) if self.alpha is not None else 1.0


PLACEMENTS: dict[str, Placement] = {}


def register(placement: Placement) -> Placement:
    if placement.name in PLACEMENTS:
        raise ValueError(f"placement {placement.name!r} is registered twice")
    PLACEMENTS[placement.name] = placement
    return placement


register(Placement("pre", lambda x, f, norm, out, s, a: x + f(norm(x) * s), "Xiong et al. 2020; GPT-2, LLaMA",
                   scales_input=True, fused_add=True))
register(Placement("post", lambda x, f, norm, out, s, a: norm(x + f(x)), "Vaswani et al. 2017",
                   ends_normed=True))
register(Placement("peri", lambda x, f, norm, out, s, a: x + out(f(norm(x) * s)), "Kim et al. 2025 (Peri-LN); "
                   "Gemma 2", out_norm=True, scales_input=True, branch_end="out"))
register(Placement("branch", lambda x, f, norm, out, s, a: x + norm(f(x)), "OLMo 2 (Team OLMo 2024)",
                   branch_end="norm"))
register(Placement("deepnorm", lambda x, f, norm, out, s, a: norm(a * x + f(x)), "Wang et al. 2022 (DeepNet)",
                   ends_normed=True, alpha=lambda cfg: (2 * cfg.n_layers) ** 0.25, init="deepnet"))
register(Placement("double", lambda x, f, norm, out, s, a: out(x + f(norm(x) * s)), "Pre-LN's input norm and "
                   "Post-LN's norm of the sum (x-transformers' pre + post norm; Keel, 2026)", out_norm=True,
                   ends_normed=True, scales_input=True))


def get(name: str) -> Placement:
    """The placement of that name; ValueError listing the names otherwise."""
    try:
        return PLACEMENTS[name]
    except KeyError:
        raise ValueError(f"placement {name!r} is invalid; allowed: {', '.join(PLACEMENTS)}") from None


# --- residual-branch scalars ------------------------------------------------------------------------------------

BRANCH_SCALES = ("none", "rezero", "layerscale")


def layerscale_init(n_layers: int) -> float:
    """CaiT's LayerScale init by depth (Touvron et al. 2021): 0.1 up to 18 layers, 1e-5 up to 24, 1e-6 deeper."""
    return 0.1 if n_layers <= 18 else 1e-5 if n_layers <= 24 else 1e-6


class ResidualGain(nn.Module):
    """A learnable multiplier of one residual branch's output (what its placement's ``branch_end`` returns):
    ``rezero`` one scalar, init 0 (ReZero, Bachlechner et al. 2020; SkipInit, De & Smith 2020); ``layerscale``
    a C-vector, init small (LayerScale, Touvron et al. 2021, CaiT). ``init`` None: each one's default."""

    def __init__(self, kind: str, dim: int, init: float | None, n_layers: int):
        super().__init__()
        check_choice("model.branch_scale", kind, BRANCH_SCALES[1:])
        default = 0.0 if kind == "rezero" else layerscale_init(n_layers)
        self.init = default if init is None else float(init)
        self.weight = nn.Parameter(torch.empty(1 if kind == "rezero" else dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, self.init)

    def wrap(self, fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        """fn followed by this gain (in fn's output dtype)."""
        def scaled(h: Tensor) -> Tensor:
            y = fn(h)
            return y * self.weight.to(y.dtype)
        return scaled
