"""A LLaMA-style decoder: RoPE, grouped-query causal attention (SDPA), SwiGLU, no biases in linears (but the
query, key and value projections with qkv_bias, as Qwen2 has).

The norm (``ModelConfig.norm``) and where it sits (``ModelConfig.placement``) are chosen by name.
Plain PyTorch: ``Transformer(ModelConfig(vocab_size=65))`` works in a notebook.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from minillm import mup
from minillm.errors import ConfigError
from minillm.generation import KVCache, generate
from minillm.layers import Attention, FeedForward, apply_rope, at_positions, rope_tables, soft_cap
from minillm.model_config import BLOCK_PLACEMENTS, INITS, PLACEMENTS, ModelConfig, make_norm
from minillm.ngpt import NormalizedResidual, Scaled, normalize_
from minillm.placements import PLACEMENTS as LAYER_PLACEMENTS
from minillm.placements import ResidualGain
from minillm.placements import get as get_placement

__all__ = ["BLOCK_PLACEMENTS", "INITS", "PLACEMENTS", "Attention", "Block", "FeedForward", "ModelConfig", "Transformer",
           "apply_rope", "at_positions", "make_norm", "rope_tables", "soft_cap"]


class Block(nn.Module):
    """One decoder layer: for each sublayer f (attention, then feed-forward), its placement's rule combines the
    residual stream, f and the norms (minillm.placements: pre x + f(norm(x)), post norm(x + f(x)), peri, branch,
    deepnorm, double). With cfg.layernorm_scaling, the input norm of a placement that has one (pre, peri, double) is
    multiplied by 1 / sqrt(index + 1). With cfg.branch_scale, a learnable gain (``attn_gain``, ``ffn_gain``)
    multiplies what each branch ends in (the placement's ``branch_end``); with cfg.layer_output_scale, a learnable
    scalar (``out_scale``, init 1) the block's output. A pre block with norm=fused_rmsnorm and no branch gains adds
    the attention output and normalizes the sum for the feed-forward in one kernel.
    """

    def __init__(self, cfg: ModelConfig, placement: str, norm: str, index: int = 0):
        super().__init__()
        try:
            self.kind = get_placement(placement)
        except ValueError as err:
            raise ConfigError(f"block {err}") from None
        self.placement = placement
        # LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in LLMs"): the input norm's output of layer
        # l = index + 1 times 1/sqrt(l), so deep Pre-LN layers add less to the residual stream at init
        scaled = cfg.layernorm_scaling and self.kind.scales_input
        self.norm_scale = 1.0 / math.sqrt(index + 1) if scaled else 1.0
        self.alpha = self.kind.residual_scale(cfg)
        self.attn = Attention(cfg)
        self.ffn = FeedForward(cfg.dim, cfg.ffn_hidden, cfg.ngpt)
        # nGPT: h <- unit(h + |alpha| (unit(f(h)) - h)) after each sublayer, no norms (minillm.ngpt)
        self.attn_step, self.ffn_step = (NormalizedResidual(cfg.dim) if cfg.ngpt else None for _ in range(2))
        ffn_norm = make_norm(cfg, norm)  # first: an error in norm_options names that field, not attn_norm_options
        self.attn_norm, self.ffn_norm = make_norm(cfg, norm, attn=True), ffn_norm  # registered in this order
        self.attn_out_norm = make_norm(cfg, norm) if self.kind.out_norm else None
        self.ffn_out_norm = make_norm(cfg, norm) if self.kind.out_norm else None
        gains = cfg.branch_scale != "none"
        self.attn_gain, self.ffn_gain = (ResidualGain(cfg.branch_scale, cfg.dim, cfg.branch_scale_init, cfg.n_layers)
                                         if gains else None for _ in range(2))
        self.out_scale = nn.Parameter(torch.ones(1)) if cfg.layer_output_scale else None
        self.fused_add = self.kind.fused_add and hasattr(ffn_norm, "add_forward") and not gains

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None = None) -> Tensor:
        x = self.sublayers(x, cos, sin, cache)
        return x if self.out_scale is None else x * self.out_scale.to(x.dtype)

    def sublayers(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None = None) -> Tensor:
        if self.attn_step is not None:  # nGPT
            x = self.attn_step(x, self.attn(x, cos, sin, cache=cache))
            return self.ffn_step(x, self.ffn(x))
        if self.fused_add:  # y = ffn_norm(x + attention output), and that sum, from one kernel
            y, x = self.ffn_norm.add_forward(self.attn(self.attn_norm(x) * self.norm_scale, cos, sin, cache=cache), x)
            return x + self.ffn(y * self.norm_scale)
        start = cache.length if cache is not None else 0  # absolute position of x[:, 0]
        sublayers = ((lambda h: self.attn(h, cos, sin, cache=cache), self.attn_norm, self.attn_out_norm,
                      self.attn_gain), (self.ffn, self.ffn_norm, self.ffn_out_norm, self.ffn_gain))
        for f, norm, out_norm, gain in sublayers:
            norm, out_norm = at_positions(norm, start), at_positions(out_norm, start)
            if gain is not None:  # the gain multiplies what the branch ends in
                end = self.kind.branch_end
                f, norm, out_norm = (gain.wrap(f) if end == "f" else f, gain.wrap(norm) if end == "norm" else norm,
                                     gain.wrap(out_norm) if end == "out" else out_norm)
            x = self.kind.rule(x, f, norm, out_norm, self.norm_scale, self.alpha)
        return x


class Transformer(nn.Module):
    """Token embedding (times ``emb_scale`` with model.embed_scale, then ``emb_norm`` with model.embed_norm), blocks,
    final norm (model.final_norm; by default when the last block does not end in one), LM head (its logits
    soft-capped with ``final_logit_softcap``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.emb_scale = nn.Parameter(torch.empty(1)) if cfg.embed_scale else None
        self.emb_norm = make_norm(cfg, cfg.norm) if cfg.embed_norm else nn.Identity()
        self.layers = nn.ModuleList(Block(cfg, p, n, i) for i, (p, n) in enumerate(cfg.layer_specs()))
        last_placement, last_norm = cfg.layer_specs()[-1]
        final = cfg.final_norm if cfg.final_norm is not None else not LAYER_PLACEMENTS[last_placement].ends_normed
        self.norm = make_norm(cfg, last_norm) if final and not cfg.ngpt else nn.Identity()
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.logit_scale = Scaled(cfg.vocab_size, 1.0, cfg.dim**-0.5) if cfg.ngpt else None  # nGPT's s_z
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """All initialization lives here; ``cfg.init`` names the scheme (``auto``: each layer's placement's scheme,
        minillm.placements: deepnet for DeepNorm layers, gpt2 for the others, minillm's default):

        - gpt2 (GPT-2, nanoGPT): embeddings and linears N(0, init_std); the residual output projections
          (attn.wo, ffn.w2) N(0, init_std / sqrt(2 * n_layers)), or N(0, init_std) with depth_scaled_init=False
        - xavier (the original Transformer, the setting of Xiong et al. 2020): linears Xavier-normal
          (variance 2 / (fan_in + fan_out)), embeddings N(0, 1) (unit-scale inputs, as the paper's sqrt(d)
          scaling of N(0, 1/d) embeddings gives)
        - small (SmallInit of Nguyen & Salazar 2019, as GPT-NeoX implements it): embeddings and linears
          N(0, sqrt(2 / (5 * dim)))
        - deepnet (Wang et al. 2022): block linears Xavier-normal, with gain beta = (8L)^(-1/4) for wv, wo, w1,
          w2, w3 and gain 1 for wq, wk; embeddings and the head as gpt2
        - norms: their own reset_parameters() (gain 1 or 0 when zero-centered, bias 0, running stats reset)
        - parametrization=mup: then the hidden matrices scaled by width (minillm.mup, docs/mup.md)
        - scalars: emb_scale sqrt(dim) (DyT's LLM recipe), residual branch gains their ResidualGain init, each
          layer's out_scale 1
        - ngpt: every matrix N(0, 1 / sqrt(dim)), then on the unit sphere (minillm.ngpt.normalize_), the scales at
          their Scaled init
        """
        cfg = self.cfg
        for module in self.modules():  # first N(0, init_std) everywhere, in module order (the gpt2 draws)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=cfg.init_std)
                if getattr(module, "bias", None) is not None:  # qkv_bias
                    nn.init.zeros_(module.bias)
            elif module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        if self.emb_scale is not None:
            self.emb_scale.fill_(math.sqrt(cfg.dim))
        for block in self.layers:
            if block.out_scale is not None:
                block.out_scale.fill_(1.0)
        if cfg.init in ("xavier", "small"):
            self._reinit(self.tok_emb, cfg.init)
            if not cfg.tie_embeddings:
                self._reinit(self.lm_head, cfg.init)
        if cfg.ngpt:
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, mean=0.0, std=cfg.dim**-0.5)
            self.renormalize_()
            return
        beta = (8 * cfg.n_layers) ** -0.25
        depth_std = cfg.init_std / math.sqrt(2 * cfg.n_layers) if cfg.depth_scaled_init else cfg.init_std
        for block in self.layers:
            scheme = cfg.init if cfg.init != "auto" else block.kind.init
            if scheme == "gpt2":
                for w in (block.attn.wo, block.ffn.w2):
                    nn.init.normal_(w.weight, mean=0.0, std=depth_std)
            elif scheme == "deepnet":
                for w in (block.attn.wq, block.attn.wk):
                    nn.init.xavier_normal_(w.weight, gain=1.0)
                for w in (block.attn.wv, block.attn.wo, block.ffn.w1, block.ffn.w2, block.ffn.w3):
                    nn.init.xavier_normal_(w.weight, gain=beta)
            else:
                for w in block.modules():
                    if isinstance(w, nn.Linear):
                        self._reinit(w, scheme)
        mup.scale_init(self)  # muP: the hidden matrices' std / sqrt(dim / mup_base_width)

    def head_weight(self) -> Tensor:
        """The LM head's (V, C) weight as the logits see it: times nGPT's per-token scale s_z with model.ngpt."""
        w = self.lm_head.weight
        return w if self.logit_scale is None else w * self.logit_scale()[:, None].to(w.dtype)

    def renormalize_(self) -> None:
        """After an optimizer step: nGPT's matrices back on the unit sphere (minillm.ngpt.normalize_); else nothing."""
        if self.cfg.ngpt:
            normalize_(self)

    def _reinit(self, module: nn.Module, scheme: str) -> None:
        """One weight matrix (Linear or Embedding) of the xavier or small scheme (see init_weights)."""
        if scheme == "small":
            nn.init.normal_(module.weight, mean=0.0, std=math.sqrt(2 / (5 * self.cfg.dim)))
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=1.0)
        else:
            nn.init.xavier_normal_(module.weight, gain=1.0)

    def hidden(self, idx: Tensor, cache: list[KVCache] | None = None) -> Tensor:
        """Token ids (B, T) -> the last hidden states (B, T, C), after the final norm: what the LM head reads (a
        loss that never makes the whole batch's logits starts here: minillm.training.loss)."""
        B, T = idx.shape
        start = cache[0].length if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {start + T} exceeds model.max_seq_len={self.cfg.max_seq_len}")
        if cache is not None and self.training:
            raise RuntimeError("a KV-cached forward is for generation: call model.eval() first")
        x = self.tok_emb(idx)  # (B, T, C)
        if self.emb_scale is not None:
            x = x * self.emb_scale.to(x.dtype)
        x = at_positions(self.emb_norm, start)(x)
        cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]  # (T, D/2)
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, cache=cache[i] if cache is not None else None)
        x = at_positions(self.norm, start)(x)
        return x if self.cfg.parametrization == "standard" else x * mup.readout_mult(self.cfg)  # muP: 1 / m

    def forward(self, idx: Tensor, cache: list[KVCache] | None = None) -> Tensor:
        """Token ids (B, T) -> logits (B, T, vocab_size); with a cache (eval mode), idx continues its positions."""
        logits = self.lm_head(self.hidden(idx, cache))  # (B, T, V)
        if self.logit_scale is not None:
            logits = logits * self.logit_scale().to(logits.dtype)
        cap = self.cfg.final_logit_softcap
        return logits if cap is None else soft_cap(logits, cap)

    def new_cache(self) -> list[KVCache]:
        """An empty KV cache, one KVCache per layer."""
        return [KVCache(self.cfg.max_seq_len) for _ in self.layers]

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.tok_emb.weight.numel() if non_embedding and not self.cfg.tie_embeddings else n

    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, use_cache: bool = True) -> Tensor:
        """Continue idx (B, T) by max_new_tokens sampled tokens (minillm.generation.generate)."""
        return generate(self, idx, max_new_tokens, temperature, top_k, generator, use_cache)
