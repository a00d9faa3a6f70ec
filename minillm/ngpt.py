"""nGPT, the normalized Transformer (Loshchilov, Hsieh, Sun & Ginsburg, "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere", ICLR 2025), as ``model.ngpt=true`` (preset ``experiment=ngpt``).

Every vector that lives in the model's C-dimensional space has unit L2 norm:

- the rows of the embedding and of the LM head, and every weight matrix along its C-sized axis (the input rows of
  wq, wk, wv, w1, w3; the output columns of wo, w2), renormalized after every optimizer step (``normalize_``);
- the hidden state: h <- unit(h + |alpha| * (unit(f(h)) - h)) after each sublayer f, with alpha a learned
  C-vector per sublayer (the eigen learning rates, ``NormalizedResidual``); no norm layers;
- queries and keys: s_qk * unit(q), s_qk * unit(k) per head after RoPE, softmax scale sqrt(D) instead of
  1 / sqrt(D); the SwiGLU's two inputs times s_u * sqrt(C), s_v * sqrt(C); the logits times s_z (per token).

Each learned scale is stored as ``Scaled``: s = weight * (init / stored_init), with weight initialized at
``stored_init`` (nGPT's trick to give a scale its own effective learning rate under one Adam lr).
The paper trains with no weight decay and no warmup: the preset sets both to 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def unit(x: Tensor, dim: int = -1) -> Tensor:
    """x / ||x||_2 along dim, in fp32, in x's dtype."""
    x32 = x.float()
    return (x32 / torch.linalg.vector_norm(x32, dim=dim, keepdim=True)).to(x.dtype)


class Scaled(nn.Module):
    """A learned scale of ``size`` entries: forward() = weight * (init / stored_init), weight starting at
    stored_init, so the scale starts at ``init``."""

    def __init__(self, size: int, init: float, stored_init: float):
        super().__init__()
        self.init, self.stored_init = float(init), float(stored_init)
        self.weight = nn.Parameter(torch.empty(size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, self.stored_init)

    def forward(self) -> Tensor:
        return self.weight * (self.init / self.stored_init)


class NormalizedResidual(nn.Module):
    """h <- unit(unit(h) + |alpha| * (unit(y) - unit(h))) for a sublayer's output y; alpha starts at 0.05 per
    feature, stored at 1 / sqrt(C) (nGPT's alpha_init and base scale)."""

    def __init__(self, dim: int, alpha_init: float = 0.05):
        super().__init__()
        self.alpha = Scaled(dim, alpha_init, 1 / math.sqrt(dim))

    def forward(self, h: Tensor, y: Tensor) -> Tensor:
        h = unit(h)
        return unit(h + self.alpha().abs().to(h.dtype) * (unit(y) - h))


def normalized_qk(q: Tensor, k: Tensor, s_qk: Tensor) -> tuple[Tensor, Tensor]:
    """s_qk * unit(q), s_qk * unit(k) over each head's D features, for q and k (B, T, H, D) and s_qk (H, D)."""
    s = s_qk.to(q.dtype)
    return s * unit(q), s * unit(k)


def normalize_(model: nn.Module) -> None:
    """Put every matrix of a model.ngpt Transformer back on the unit sphere along its C-sized axis (in place):
    tok_emb and lm_head rows, the inputs of wq, wk, wv, w1, w3, the outputs of wo, w2."""
    with torch.no_grad():
        matrices = [(model.tok_emb.weight, 1), (model.lm_head.weight, 1)]
        for block in model.layers:
            matrices += [(block.attn.wq.weight, 1), (block.attn.wk.weight, 1), (block.attn.wv.weight, 1),
                         (block.attn.wo.weight, 0), (block.ffn.w1.weight, 1), (block.ffn.w3.weight, 1),
                         (block.ffn.w2.weight, 0)]
        for weight, dim in matrices:
            weight.copy_(unit(weight, dim))
