"""Export a minillm checkpoint to a Hugging Face folder.

    python -m minillm.tools.export CKPT OUT_DIR               # LlamaForCausalLM: config.json, model.safetensors
    python -m minillm.tools.export CKPT OUT_DIR --hub-mixin   # any norm/placement, minillm's own format (MinillmHub)

Both write the tokenizer as a Hugging Face fast tokenizer (tokenizer.json, tokenizer_config.json) whose ids are
minillm's, and a README.md model card. Only Pre-LN RMSNorm models without QK-norm are Llama models; for the
others the Llama export stops with one line naming every field Llama cannot express (exit code 2).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tokenizers
from safetensors.torch import save_file
from tokenizers import decoders, models, pre_tokenizers
from torch import Tensor

from minillm import mup
from minillm.errors import ArgumentParser
from minillm.model import ModelConfig, Transformer
from minillm.norms import canonical_norm
from minillm.tools.hub import MinillmHub, load_checkpoint
from minillm.training.data import ByteTokenizer, CharTokenizer, HFTokenizer

LLAMA_NORM_OPTIONS = {"cast": "llama", "eps_mode": "inside", "zero_centered": False, "affine": True}
WHY = {"cast": "Llama casts to the input dtype before the gain", "eps_mode": "Llama adds eps inside the sqrt",
       "zero_centered": "Llama stores the gain itself", "affine": "Llama has a learnable gain"}
# the ModelConfig fields whose every value but the default (final_norm: also true) Llama lacks, and why
NOT_LLAMA = {"v_norm": "Llama has no value norm", "attn_scale": "Llama's attention scale is 1/sqrt(head_dim)",
             "embed_scale": "Llama does not scale its embeddings", "embed_norm": "Llama has no embedding norm",
             "final_norm": "Llama has a final norm", "branch_scale": "Llama has no residual-branch gains",
             "layer_output_scale": "Llama has no per-layer output scalars",
             "ngpt": "nGPT's normalized layers and scales are not Llama's"}
# minillm parameter (in layers.<i>.) -> Hugging Face Llama parameter (in model.layers.<i>.)
LAYER_NAMES = {"attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
               "attn.wo": "self_attn.o_proj", "ffn.w1": "mlp.gate_proj", "ffn.w3": "mlp.up_proj",
               "ffn.w2": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


# --- what Llama can express -----------------------------------------------------------------------------


def llama_incompatibilities(model: dict) -> list[str]:
    """Each ModelConfig field (of a ModelConfig dict) whose value LlamaForCausalLM cannot express, with why."""
    cfg = {**ModelConfig().to_dict(), **model}
    out = []
    if canonical_norm(cfg["norm"]) != "rmsnorm":
        out.append(f"norm={cfg['norm']} (Llama uses RMSNorm)")
    for field in ("norm_options", "attn_norm_options"):
        options = cfg[field] or {}
        for key, want in LLAMA_NORM_OPTIONS.items():
            if options.get(key, want) != want:
                out.append(f"{field}.{key}={options[key]} ({WHY[key]})")
    if cfg["placement"] != "pre":
        out.append(f"placement={cfg['placement']} (Llama is Pre-LN)")
    odd = [i for i, s in enumerate(cfg["layers"] or [])
           if s.get("placement", cfg["placement"]) != "pre" or canonical_norm(s.get("norm", cfg["norm"])) != "rmsnorm"]
    if odd:
        out.append(f"layers={[cfg['layers'][i] for i in odd]} at {odd} (Llama's layers are all Pre-LN RMSNorm)")
    if cfg["qk_norm"] != "none":
        out.append(f"qk_norm={cfg['qk_norm']} (Llama has no QK-norm)")
    if cfg.get("layernorm_scaling"):
        out.append("layernorm_scaling=True (Llama does not scale its norms by depth)")
    if cfg.get("qkv_bias"):
        out.append("qkv_bias=True (Llama's attention_bias would also put a bias on o_proj)")
    for key in ("attn_logit_softcap", "final_logit_softcap"):
        if cfg.get(key) is not None:
            out.append(f"{key}={cfg[key]} (Llama has no logit soft-cap)")
    defaults = ModelConfig().to_dict()
    for key, why in NOT_LLAMA.items():
        if cfg.get(key, defaults[key]) not in (defaults[key], *([True] if key == "final_norm" else [])):
            out.append(f"{key}={cfg[key]} ({why})")
    return out


def llama_config(cfg: ModelConfig) -> dict[str, Any]:
    """config.json of the equivalent LlamaForCausalLM (no special tokens: minillm has none)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "initializer_range": cfg.init_std, "torch_dtype": "float32",
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "use_cache": True,
    }


def llama_state_dict(model: Transformer) -> dict[str, Tensor]:
    """minillm weights under LlamaForCausalLM names, fp32. RoPE needs no permutation of wq/wk: both rotate
    the pairs (x[i], x[i + D/2]) (minillm's apply_rope, HF's rotate_half). A muP model's readout multiplier and
    attention scale are folded into the head and the query projections."""
    sd, n = model.state_dict(), model.cfg.n_layers
    names = {"tok_emb.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    if not model.cfg.tie_embeddings:  # tied: HF ties lm_head to embed_tokens itself
        names["lm_head.weight"] = "lm_head.weight"
    names |= {f"layers.{i}.{ours}.weight": f"model.layers.{i}.{theirs}.weight"
              for i in range(n) for ours, theirs in LAYER_NAMES.items()}
    left = set(sd) - set(names) - ({"lm_head.weight"} if model.cfg.tie_embeddings else set())
    if left:
        raise ValueError(f"no Llama name for minillm weights {sorted(left)}")
    out = {theirs: sd[ours].detach().float().cpu().contiguous() for ours, theirs in names.items()}
    if model.cfg.parametrization == "mup":  # muP's multipliers folded into the weights they follow (exact)
        out["lm_head.weight"] *= mup.readout_mult(model.cfg)  # head(h * r) = (head * r)(h)
        for i in range(n):  # q.k * s = (q * s * sqrt(d)).k / sqrt(d): RoPE is linear, Llama has no QK-norm
            out[f"model.layers.{i}.self_attn.q_proj.weight"] *= mup.attention_scale(model.cfg) * model.cfg.head_dim**0.5
    return out


# --- tokenizer ------------------------------------------------------------------------------------------


def byte_alphabet() -> list[str]:
    """The printable character standing for each byte 0..255 in byte-level tokenizers (GPT-2's ByteLevel):
    printable Latin-1 bytes stand for themselves, the others are mapped in order to chr(256), chr(257), ..."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def _char_tokenizer(tok: CharTokenizer) -> tokenizers.Tokenizer:
    """Token i = character i of minillm's vocabulary: a BPE without merges splits text into characters.
    A character outside the vocabulary is dropped (minillm raises instead)."""
    out = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(tok.chars)}, merges=[]))
    out.decoder = decoders.Fuse()  # concatenate, no spaces between tokens
    return out


def _byte_tokenizer(tok: ByteTokenizer) -> tokenizers.Tokenizer:
    """Token b = byte b of the UTF-8 text: ByteLevel maps each byte to its alphabet character, one token each."""
    out = tokenizers.Tokenizer(models.BPE(vocab={c: b for b, c in enumerate(byte_alphabet())}, merges=[]))
    out.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    out.decoder = decoders.ByteLevel()  # invalid UTF-8 decodes to U+FFFD, as minillm's errors="replace"
    return out


def _hf_tokenizer(tok: HFTokenizer) -> tokenizers.Tokenizer:
    """A BPE trained by minillm, a tokenizer.json or a Hub tokenizer: already a ``tokenizers.Tokenizer`` (a copy)."""
    return tokenizers.Tokenizer.from_str(tok.state_dict()["json"])


TOKENIZER_EXPORTS: dict[str, Callable[[Any], tokenizers.Tokenizer]] = {"char": _char_tokenizer,
                                                                       "byte": _byte_tokenizer,
                                                                       "bpe": _hf_tokenizer, "hf": _hf_tokenizer}


def hf_tokenizer(tok: Any) -> tokenizers.Tokenizer:
    """minillm tokenizer -> a ``tokenizers.Tokenizer`` with the same ids, by ``tok.kind``; a tokenizer that
    already is a ``tokenizers.Tokenizer`` (a tokenizer.json, e.g. a BPE) passes through unchanged."""
    if isinstance(tok, tokenizers.Tokenizer):
        return tok
    kind = getattr(tok, "kind", None)
    if kind not in TOKENIZER_EXPORTS:
        raise ValueError(f"cannot export tokenizer kind={kind!r}; exportable: {', '.join(TOKENIZER_EXPORTS)} "
                         "or a tokenizers.Tokenizer")
    return TOKENIZER_EXPORTS[kind](tok)


def save_tokenizer(tok: Any, out_dir: Path, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json, loadable with transformers.AutoTokenizer (no special tokens added to
    text; a BPE's end-of-document token is named as eos_token)."""
    hf = hf_tokenizer(tok)
    hf.save(str(out_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_eos_token": False}
    eos_id = getattr(tok, "eos_id", None)
    if eos_id is not None:
        config["eos_token"] = hf.id_to_token(eos_id)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


TOKENIZER_NAMES = {"char": "char-level", "byte": "byte-level", "bpe": "byte-level BPE trained on the corpus",
                   "hf": "a Hugging Face tokenizer"}


# --- export ---------------------------------------------------------------------------------------------


def model_card(meta: dict, model: Transformer, tok: Any, fmt: str) -> str:
    """README.md: what the model is, how it was trained, how to load it."""
    m, steps = {**ModelConfig().to_dict(), **meta["model"]}, meta.get("global_step")
    load = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "model = AutoModelForCausalLM.from_pretrained(path)\ntokenizer = AutoTokenizer.from_pretrained(path)"
            if fmt == "llama" else "from minillm.tools.hub import MinillmHub\nmodel = MinillmHub.from_pretrained(path)")
    lines = [
        "---", f"library_name: {'transformers' if fmt == 'llama' else 'minillm'}",
        "tags: [minillm" + (", llama" if fmt == "llama" else "") + "]", "---", "",
        "# minillm model", "",
        "A small LLaMA-style decoder trained with minillm (a framework that compares normalization choices), "
        f"exported {'as LlamaForCausalLM' if fmt == 'llama' else 'in minillm format (minillm.tools.hub.MinillmHub)'}.",
        "",
        f"- parameters: {model.num_params():,}; dim {m['dim']}, {m['n_layers']} layers, {m['n_heads']} heads "
        f"({m['n_kv_heads'] or m['n_heads']} key/value heads), SwiGLU hidden {model.cfg.ffn_hidden}, "
        f"context {m['max_seq_len']} tokens, RoPE theta {m['rope_theta']}, tied embeddings {m['tie_embeddings']}",
        f"- normalization: norm={m['norm']} (eps {m['norm_eps']}, options {m['norm_options'] or {}}), "
        f"placement={m['placement']}, qk_norm={m['qk_norm']}" + (f", per-layer {m['layers']}" if m["layers"] else ""),
        f"- training: {steps if steps is not None else 'unknown'} optimizer steps, from `{Path(meta['path']).name}`",
        (f"- tokenizer: {TOKENIZER_NAMES.get(getattr(tok, 'kind', None), 'tokenizers')}, vocabulary "
         f"{m['vocab_size']}, " + ("documents end with the eos token; " if getattr(tok, "eos_id", None) is not None
                                   else "no special tokens; ") + "ids are minillm's" if tok is not None else
         f"- tokenizer: none (imported without one); vocabulary {m['vocab_size']}"),
        "", "```python", f"path = {'.'!r}  # this folder", load, "```", "",
        f"minillm generates with a sliding window of the last {m['max_seq_len']} tokens; other runtimes may "
        "instead continue the positions beyond the trained context.", "",
    ]
    return "\n".join(lines)


def export_llama(ckpt: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a LlamaForCausalLM folder from a minillm checkpoint; ValueError if Llama cannot express it. A
    checkpoint imported without a tokenizer exports without one."""
    model, tok, meta = load_checkpoint(ckpt, require_tokenizer=False)
    problems = llama_incompatibilities(meta["model"])
    if problems:
        raise ValueError(f"cannot export to LlamaForCausalLM: {', '.join(problems)}; use --hub-mixin to save "
                         "it in minillm's own format")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(llama_config(model.cfg), indent=2) + "\n")
    save_file(llama_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    if tok is not None:
        save_tokenizer(tok, out, model.cfg.max_seq_len)
    (out / "README.md").write_text(model_card(meta, model, tok, "llama"))
    return out


def export_hub_mixin(ckpt: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a MinillmHub folder (config.json = ModelConfig, model.safetensors) plus tokenizer and card."""
    model, tok, meta = load_checkpoint(ckpt, require_tokenizer=False)
    hub = MinillmHub(model.cfg)
    hub.load_state_dict(model.state_dict())
    out = Path(out_dir)
    hub.save_pretrained(out)
    if tok is not None:
        save_tokenizer(tok, out, model.cfg.max_seq_len)
    (out / "README.md").write_text(model_card(meta, model, tok, "hub-mixin"))
    return out


def main(argv: list[str] | None = None) -> int:
    """Console script minillm-export; exit code 2 with one line on stderr for a bad checkpoint or model."""
    parser = ArgumentParser(prog="minillm-export", description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", help="Lightning checkpoint written by minillm (.ckpt)")
    parser.add_argument("out_dir", help="folder to write (created if missing)")
    parser.add_argument("--hub-mixin", action="store_true",
                        help="save in minillm's own format (any norm/placement) instead of LlamaForCausalLM")
    args = parser.parse_args(argv)
    try:
        out = (export_hub_mixin if args.hub_mixin else export_llama)(args.ckpt, args.out_dir)
    except (ValueError, OSError) as err:  # CheckpointError is a ValueError
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
