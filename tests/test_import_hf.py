"""minillm-import (minillm/tools/import_hf.py): Hugging Face Llama, Mistral and Qwen2 folders into minillm checkpoints,
the
inverse of minillm-export, with tiny random models saved locally (no hub)."""

from __future__ import annotations

import json

import pytest
import torch
from processes import cli, ok
from test_export import LOGIT_ATOL, SEQ, fit_checkpoint

from minillm.errors import CheckpointError
from minillm.tools.export import LLAMA_NORM_OPTIONS
from minillm.tools.export import main as export_main
from minillm.tools.hub import load_checkpoint
from minillm.tools.import_hf import main as import_main

CORPUS_CHARS = 6_000
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=SEQ, rms_norm_eps=1e-6, rope_theta=500.0)


def hf_model(kind: str, **kw):
    """A tiny random model of the architecture, its gains and biases random too (so the mapping of each shows)."""
    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    torch.manual_seed(0)
    model = model_class(config_class(**{**SMALL, **kw})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight", ".bias")):
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
    return model


@pytest.mark.parametrize("kind, extra", [("llama", {}), ("mistral", {"sliding_window": SEQ}),
                                         ("qwen2", {"tie_word_embeddings": True})])
def test_a_hugging_face_folder_imports_with_the_logits_of_transformers(kind, extra, tmp_path, shared_cache):
    """As a user runs it, on a folder without a tokenizer: the checkpoint says it has none, and loads."""
    model = hf_model(kind, **extra)
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    out = ok(cli(["-m", "minillm.tools.import_hf", str(tmp_path / "hf"), str(tmp_path / "m.ckpt")], tmp_path,
                 shared_cache))
    assert "(no tokenizer: the folder has none)" in out
    with pytest.raises(CheckpointError, match="has no tokenizer: it was imported from a folder without tokenizer"):
        load_checkpoint(tmp_path / "m.ckpt")
    ours, tok, meta = load_checkpoint(tmp_path / "m.ckpt", require_tokenizer=False)
    assert tok is None and meta["minillm"]["architecture"] == kind and ours.cfg.qkv_bias == (kind == "qwen2")
    x = torch.randint(0, SMALL["vocab_size"], (3, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (ours(x) - model(x).logits).abs().max().item()
    assert diff < LOGIT_ATOL, diff


def test_export_then_import_is_exact_both_ways(corpus, tmp_path):
    """minillm checkpoint -> Llama folder -> minillm checkpoint: the same weights, model and tokenizer; exporting the
    import again writes the same files."""
    ckpt = fit_checkpoint(tmp_path / "char.ckpt", corpus, "char", n_kv_heads=2)
    assert export_main([ckpt, str(tmp_path / "hf")]) == 0
    assert import_main([str(tmp_path / "hf"), str(tmp_path / "back.ckpt")]) == 0
    (a, tok_a, _), (b, tok_b, _) = load_checkpoint(ckpt), load_checkpoint(tmp_path / "back.ckpt")
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert b.cfg.to_dict() == {**a.cfg.to_dict(), "norm_options": LLAMA_NORM_OPTIONS}  # the defaults, written out
    assert tok_b.decode(tok_b.encode("The king")) == "The king"
    assert tok_b.encode("my lord").tolist() == tok_a.encode("my lord").tolist()
    assert export_main([str(tmp_path / "back.ckpt"), str(tmp_path / "again")]) == 0
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes(), name


def test_what_minillm_cannot_express_is_refused_in_one_line(tmp_path, capsys):
    model = hf_model("llama", rope_scaling={"rope_type": "linear", "factor": 2.0}, mlp_bias=True)
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    capsys.readouterr()  # transformers' progress bar
    assert import_main([str(tmp_path / "hf"), str(tmp_path / "m.ckpt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"minillm-import: error: cannot import {str(tmp_path / 'hf')!r} "
                                                    "(['LlamaForCausalLM']): ")
    assert "(minillm's RoPE has no scaling)" in err and "mlp_bias=true" in err and not (tmp_path / "m.ckpt").exists()
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    assert import_main([str(tmp_path / "gpt2"), str(tmp_path / "m.ckpt")]) == 2
    assert "model_type='gpt2' (minillm imports llama, mistral, qwen2)" in capsys.readouterr().err
    assert import_main([str(tmp_path / "none"), str(tmp_path / "m.ckpt")]) == 2
    assert "does not exist; allowed: a Hugging Face model folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert import_main([str(tmp_path / "empty"), str(tmp_path / "m.ckpt")]) == 2
    assert "is not a Hugging Face model folder (no config.json)" in capsys.readouterr().err
