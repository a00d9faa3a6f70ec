"""minillm-inspect (minillm/tools/inspection.py): the stability probes on held-out text for any checkpoint, written as a
depth profile (JSON, PNG, W&B tables); on a minillm checkpoint and on a tiny random Llama imported from a local
folder."""

from __future__ import annotations

import json
import math

import pytest
from helpers import read_wandb_run, write_corpus
from processes import cli, ok
from test_export import SEQ, fit_checkpoint

from minillm.tools.export import save_tokenizer
from minillm.tools.inspection import main as inspect_main
from minillm.training.data import ByteTokenizer

CORPUS_CHARS = 6_000


def check_profile(out, n_layers: int, n_sites: int) -> dict:
    profile = json.loads((out / "depth_profile.json").read_text())
    assert [r["layer"] for r in profile["layers"]] == list(range(n_layers)) and len(profile["norm_sites"]) == n_sites
    for row in profile["layers"]:
        assert row["resid_max"] >= row["resid_rms"] > 0 and row["outlier_ratio"] == pytest.approx(
            row["resid_max"] / row["resid_rms"]) and math.isfinite(row["attn_logit_max"])
    for row in profile["norm_sites"]:
        assert row["in_max"] >= row["in_rms"] > 0 and row["outlier_ratio"] >= 1 and "gain_mean" in row
    assert (out / "depth_profile.png").stat().st_size > 10_000
    return profile


def test_inspect_writes_the_depth_profile_of_a_checkpoint(corpus, tmp_path, shared_cache):
    ckpt = fit_checkpoint(tmp_path / "post.ckpt", corpus, "char", norm="layernorm", placement="peri")
    out = ok(cli(["-m", "minillm.tools.inspection", ckpt, "--text", str(corpus), "--out", str(tmp_path / "profile"),
                  "--windows", "6"], tmp_path, shared_cache))
    assert "wrote " in out and "largest residual RMS" in out
    profile = check_profile(tmp_path / "profile", 2, 2 * 4 + 1)  # peri: two norms in and two out per layer, final
    assert profile["windows"] == 6 and profile["model"]["placement"] == "peri"
    (run,) = (tmp_path / "profile" / "wandb").glob("offline-run-*")
    logged = {key.split("/_type")[0].split("/path")[0] for row in read_wandb_run(run)["history"] for key in row}
    assert {"depth/layers", "depth/norm_sites"} <= {"/".join(k.split("/")[:2]) for k in logged}


def test_inspect_an_imported_llama(tmp_path, capsys):
    """A tiny random LlamaForCausalLM with a byte tokenizer, saved locally, imported, inspected."""
    transformers = pytest.importorskip("transformers")
    from minillm.tools.import_hf import main as import_main

    config = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    save_tokenizer(ByteTokenizer(), tmp_path / "llama", SEQ)
    assert import_main([str(tmp_path / "llama"), str(tmp_path / "llama.ckpt")]) == 0
    text = write_corpus(tmp_path / "held_out.txt", n_chars=4000, seed=3)
    assert inspect_main([str(tmp_path / "llama.ckpt"), "--text", str(text), "--no-wandb"]) == 0
    check_profile(tmp_path / "llama.ckpt.inspect", 3, 2 * 3 + 1)
    assert not (tmp_path / "llama.ckpt.inspect" / "wandb").exists()
    capsys.readouterr()
    assert inspect_main([str(tmp_path / "llama.ckpt"), "--text", str(tmp_path / "none.txt")]) == 2
    assert capsys.readouterr().err == (f"minillm-inspect: error: --text '{tmp_path / 'none.txt'}' does not exist; "
                                       "allowed: a UTF-8 text file\n")
    assert inspect_main([str(tmp_path / "llama.ckpt"), "--text", str(tmp_path / "llama")]) == 2  # a folder
    assert capsys.readouterr().err == (f"minillm-inspect: error: --text '{tmp_path / 'llama'}' is a folder, not a "
                                       "file; allowed: a UTF-8 text file\n")
