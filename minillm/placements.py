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

A ``Placement`` declares, besides that rule: whether it has a second norm per sublayer (``out_norm``), whether its
block ends normalized (``ends_normed``: the model then adds no final norm), whether its input norm is the one
LayerNorm Scaling scales (``scales_input``), its residual multiplier (``alpha``), the init scheme ``init=auto``
picks for it, and whether the fused add + RMSNorm kernel can serve it (``fused_add``). Adding a placement is one
``register(Placement(...))`` here, a row in docs/norms_and_placements.md, and (for a preset) a config.

``mix`` (Mix-LN: Post-LN in the first layers, Pre-LN after) and ``model.layers`` are per-layer schedules of these
placements (ModelConfig.layer_specs), not placements of a layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

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
                   "Gemma 2", out_norm=True, scales_input=True))
register(Placement("branch", lambda x, f, norm, out, s, a: x + norm(f(x)), "OLMo 2 (Team OLMo 2024)"))
register(Placement("deepnorm", lambda x, f, norm, out, s, a: norm(a * x + f(x)), "Wang et al. 2022 (DeepNet)",
                   ends_normed=True, alpha=lambda cfg: (2 * cfg.n_layers) ** 0.25, init="deepnet"))


def get(name: str) -> Placement:
    """The placement of that name; ValueError listing the names otherwise."""
    try:
        return PLACEMENTS[name]
    except KeyError:
        raise ValueError(f"placement {name!r} is invalid; allowed: {', '.join(PLACEMENTS)}") from None
