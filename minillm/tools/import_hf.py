"""Import a Hugging Face causal LM folder into a minillm checkpoint: the inverse of minillm-export.

    minillm-import HF_FOLDER OUT.ckpt [--max-seq-len N] [--tokenizer tokenizer.json]
    python -m minillm.tools.import_hf hf-model/ imported.ckpt

The folder holds config.json and model.safetensors (or shards with model.safetensors.index.json), as
``save_pretrained`` writes them. Architectures that map onto minillm's Pre-LN RMSNorm decoder: ``llama``
(LlamaForCausalLM), ``mistral`` (its sliding window becomes the context, max_seq_len) and ``qwen2`` (biases on
q/k/v: qkv_bias). Anything minillm cannot express (RoPE scaling, other activations, biases elsewhere, a head_dim
other than hidden_size / heads, a per-head QK-norm of another kind) is refused in one line naming every field. The
checkpoint loads with ``minillm.tools.hub.load_checkpoint`` (and minillm-eval, minillm-sample, minillm-inspect,
minillm-lm-eval, minillm-export); its tokenizer is the folder's tokenizer.json, or none: the checkpoint then says so.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import tokenizers
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from minillm.errors import ArgumentParser
from minillm.model import ModelConfig, Transformer
from minillm.tools.export import LAYER_NAMES, LLAMA_NORM_OPTIONS
from minillm.tools.hub import DATAMODULE_KEY
from minillm.training.data import HFTokenizer
from minillm.version import provenance

ARCHITECTURES = ("llama", "mistral", "qwen2")
QKV_BIAS = {"attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj"}


def rope_theta(config: dict) -> float:
    params = config.get("rope_parameters") or {}
    return float(config.get("rope_theta") or params.get("rope_theta") or 10000.0)


def unmappable(config: dict) -> list[str]:
    """Each field of config.json minillm cannot express, with why."""
    out, kind = [], config.get("model_type")
    if kind not in ARCHITECTURES:
        return [f"model_type={kind!r} (minillm imports {', '.join(ARCHITECTURES)})"]
    if config.get("hidden_act", "silu") != "silu":
        out.append(f"hidden_act={config['hidden_act']!r} (minillm's SwiGLU uses silu)")
    for key in ("rope_scaling", "rope_parameters"):
        scaling = config.get(key) or {}
        if (scaling.get("rope_type") or scaling.get("type") or "default") != "default":
            out.append(f"{key}={scaling} (minillm's RoPE has no scaling)")
    if config.get("attention_bias") and kind != "qwen2":
        out.append("attention_bias=true (minillm's output projection has no bias)")
    if config.get("mlp_bias"):
        out.append("mlp_bias=true (minillm's SwiGLU has no biases)")
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim")
    if head_dim not in (None, hidden // heads if heads else None):
        out.append(f"head_dim={head_dim} (minillm's head dim is hidden_size / num_attention_heads = "
                   f"{hidden // heads})")
    return out


def model_config(config: dict, max_seq_len: int | None = None) -> ModelConfig:
    """The ModelConfig of a config.json that maps (see unmappable)."""
    context = int(config.get("max_position_embeddings") or 2048)
    window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
    if window:
        context = min(context, int(window))
    return ModelConfig(
        vocab_size=int(config["vocab_size"]), dim=int(config["hidden_size"]),
        n_layers=int(config["num_hidden_layers"]), n_heads=int(config["num_attention_heads"]),
        n_kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        max_seq_len=min(context, max_seq_len or context), norm="rmsnorm",
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        norm_options=dict(LLAMA_NORM_OPTIONS), placement="pre", qk_norm="none",
        ffn_hidden=int(config["intermediate_size"]), rope_theta=rope_theta(config),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        init_std=float(config.get("initializer_range", 0.02)), qkv_bias=config.get("model_type") == "qwen2")


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards its index names."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"{str(folder)!r} has no model.safetensors (nor model.safetensors.index.json); save the "
                         "model with save_pretrained(..., safe_serialization=True)")
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            weights.update(load_file(str(folder / name)))
        except (OSError, SafetensorError) as err:  # truncated, or not a safetensors file
            raise ValueError(f"{str(folder / name)!r} cannot be read ({' '.join(str(err).split())}); it is truncated "
                             "or not a safetensors file") from None
    return weights


def minillm_state_dict(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face names -> minillm names (export.LAYER_NAMES inverted), fp32; every weight used, none missing."""
    names = {"model.embed_tokens.weight": "tok_emb.weight", "model.norm.weight": "norm.weight"}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    for i in range(cfg.n_layers):
        names |= {f"model.layers.{i}.{theirs}.weight": f"layers.{i}.{ours}.weight"
                  for ours, theirs in LAYER_NAMES.items()}
        if cfg.qkv_bias:
            names |= {f"model.layers.{i}.{theirs}.bias": f"layers.{i}.{ours}.bias" for ours, theirs in QKV_BIAS.items()}
    ignored = {k for k in weights if k.endswith("rotary_emb.inv_freq")}
    if cfg.tie_embeddings and "lm_head.weight" in weights:
        if not torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"]):
            raise ValueError("tie_word_embeddings=true but lm_head.weight differs from model.embed_tokens.weight")
        ignored.add("lm_head.weight")
    missing, unknown = sorted(set(names) - set(weights)), sorted(set(weights) - set(names) - ignored)
    if missing or unknown:
        raise ValueError(f"the weights do not fit config.json: missing {missing[:4]}, not mapped {unknown[:4]}")
    state = {ours: weights[theirs].float().contiguous() for theirs, ours in names.items()}
    if cfg.tie_embeddings:  # one tensor under both names, as Transformer's state_dict has it
        state["lm_head.weight"] = state["tok_emb.weight"]
    return state


def import_hf(folder: str | os.PathLike, out: str | os.PathLike, max_seq_len: int | None = None,
              tokenizer: str | os.PathLike | None = None) -> Path:
    """Write a minillm checkpoint of a Hugging Face folder; ValueError (one line) for what does not map."""
    folder = Path(folder)
    if not folder.exists():
        raise ValueError(f"{str(folder)!r} does not exist; allowed: a Hugging Face model folder (config.json, "
                         "model.safetensors)")
    if not (folder / "config.json").is_file():
        raise ValueError(f"{str(folder)!r} is not a Hugging Face model folder (no config.json)")
    try:
        config = json.loads((folder / "config.json").read_text())
    except ValueError as err:
        raise ValueError(f"{str(folder / 'config.json')!r} is not JSON ({err})") from None
    problems = unmappable(config)
    if problems:
        raise ValueError(f"cannot import {str(folder)!r} ({config.get('architectures') or config.get('model_type')}): "
                         f"{', '.join(problems)}")
    cfg = model_config(config, max_seq_len)
    model = Transformer(cfg)
    model.load_state_dict(minillm_state_dict(cfg, read_weights(folder)))  # strict: every parameter, right shapes
    tok_file = Path(tokenizer) if tokenizer else folder / "tokenizer.json"
    tok_state = None
    if tok_file.is_file():
        tok = HFTokenizer(tokenizers.Tokenizer.from_file(str(tok_file)), "hf", folder.name)
        if tok.vocab_size > cfg.vocab_size:
            raise ValueError(f"the tokenizer {str(tok_file)!r} has {tok.vocab_size} tokens, the model "
                             f"{cfg.vocab_size}")
        tok_state = tok.state_dict()
    elif tokenizer:
        raise ValueError(f"--tokenizer {str(tokenizer)!r} does not exist")
    checkpoint: dict[str, Any] = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "hyper_parameters": {"model": cfg.to_dict()}, "global_step": 0, "epoch": 0,
        DATAMODULE_KEY: {"tokenizer": tok_state},
        "minillm": {"imported_from": str(folder.resolve()), "architecture": config.get("model_type"), **provenance()},
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, out)
    return out


def main(argv: list[str] | None = None) -> int:
    """Console script minillm-import; one line on stderr and exit code 2 for a folder that does not map."""
    parser = ArgumentParser(prog="minillm-import", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a Hugging Face model folder (config.json, model.safetensors)")
    parser.add_argument("out", help="the minillm checkpoint to write (.ckpt)")
    parser.add_argument("--max-seq-len", type=int, default=None, help="the context to keep (default: the model's)")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer.json (default: the folder's, if any)")
    args = parser.parse_args(argv)
    try:
        out = import_hf(args.folder, args.out, args.max_seq_len, args.tokenizer)
    except (ValueError, OSError, KeyError, RuntimeError) as err:
        line = " ".join(str(err).split()) if not isinstance(err, KeyError) else f"config.json has no {err}"
        print(f"{parser.prog}: error: {line[:600]}", file=sys.stderr)
        return 2
    has_tokenizer = torch.load(out, weights_only=True, mmap=True)[DATAMODULE_KEY]["tokenizer"] is not None
    print(f"imported {args.folder} -> {out}" + ("" if has_tokenizer else " (no tokenizer: the folder has none)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
