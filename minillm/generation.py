"""Generation: the KV cache one attention layer fills, and sampling a continuation from a model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minillm import _compat


class KVCache:
    """One layer's keys and values for generation: (B, Hkv, max_len, D) buffers, the first ``length`` filled."""

    def __init__(self, max_len: int):
        self.max_len, self.length = max_len, 0
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append k, v (B, Hkv, T, D) at positions length..length+T-1; return all of them (B, Hkv, length+T, D)."""
        if self.k is None:
            shape = (*k.shape[:2], self.max_len, k.shape[3])
            self.k, self.v = k.new_zeros(shape), v.new_zeros(shape)
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions, {end} asked")
        self.k[:, :, self.length:end], self.v[:, :, self.length:end] = k, v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


def sample_next(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    """Next token ids (B, 1) from fp32 logits (B, V): argmax when temperature <= 0, else top-k sampling."""
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, -1), 1, generator=generator)  # (B, 1)


@torch.no_grad()
def generate(model: nn.Module, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             generator: torch.Generator | None = None, use_cache: bool = True) -> Tensor:
    """Continue idx (B, T) by max_new_tokens sampled tokens (greedy when temperature <= 0), in eval mode.

    The context is the last max_seq_len tokens (a sliding window). use_cache: the context is run once
    and each new token attends to the cached keys/values; once the window slides every position moves, so
    the cache is rebuilt from the cropped context at each step. use_cache=False recomputes the context
    at every step (the reference; same tokens).
    """
    was_training, L = model.training, model.cfg.max_seq_len
    model.eval()  # batch-statistics norms use their running statistics
    # a compiled model would recompile for every cache length: run it eagerly
    stance = _compat.eager_stance()
    try:
        with stance:
            cache = None
            for _ in range(max_new_tokens):
                if not use_cache:
                    logits = model(idx[:, -L:])
                elif cache is None or cache[0].length == L:  # first step, or the window slides
                    cache = model.new_cache()
                    logits = model(idx[:, -L:], cache)
                else:
                    logits = model(idx[:, -1:], cache)  # (B, 1, V)
                nxt = sample_next(logits[:, -1, :].float(), temperature, top_k, generator)  # (B, 1)
                idx = torch.cat((idx, nxt), dim=1)
    finally:
        model.train(was_training)
    return idx
