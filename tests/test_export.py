"""Interop: checkpoint loading, export to Hugging Face Llama (parity with transformers), the Hub mixin, sampling."""

import functools
import json
import re
import subprocess
import sys

import lightning as L
import pytest
import torch

from minillm.model import ModelConfig
from minillm.tools.export import byte_alphabet, hf_tokenizer, llama_incompatibilities
from minillm.tools.export import main as export_main
from minillm.tools.hub import MinillmHub, load_checkpoint
from minillm.tools.sample import main as sample_main
from minillm.training.data import ByteTokenizer, CharTokenizer, HFTokenizer, TextDataModule
from minillm.training.lit_module import LitLM

CORPUS_CHARS = 6_000
SEQ = 32  # max_seq_len of the exported models
LOGIT_ATOL = 1e-4  # minillm vs transformers, fp32 (measured ~5e-7: RoPE angles in fp64 vs HF's fp32)
TEXT = "The king and queen of love.\nThou art  what is this my lord"  # only characters of the corpus

MODELS = {  # name: (tokenizer, model config overrides)
    "char": ("char", dict(n_kv_heads=2)),  # GQA, untied head
    "byte": ("byte", dict(n_kv_heads=1, tie_embeddings=True)),
    "mup": ("char", dict(parametrization="mup", mup_base_width=16)),  # its multipliers folded into the weights
    "other": ("char", dict(norm="batchnorm", norm_options={"eps_mode": "outside"}, placement="post",
                           qk_norm="rmsnorm")),  # no Llama can express it
    "zoo": ("char", dict(norm="derf", placement="double", qk_norm="l2", v_norm=True, embed_scale=True, embed_norm=True,
                         final_norm=True, branch_scale="layerscale", layer_output_scale=True)),
    "ngpt": ("char", dict(norm="none", ngpt=True)),
}


def fit_checkpoint(path, corpus, tokenizer: str, **model) -> str:
    """Train a tiny model 4 steps with Lightning and save the checkpoint as train.py would (with the datamodule)."""
    L.seed_everything(0)
    dm = TextDataModule(source="files", files=[str(corpus)], tokenizer=tokenizer, seq_len=16, batch_size=8,
                        cache_dir=str(path.parent / "cache"))
    dm.prepare_data()
    dm.setup("fit")
    cfg = ModelConfig(vocab_size=dm.vocab_size, dim=32, n_layers=2, n_heads=4, max_seq_len=SEQ, **model)
    module = LitLM(cfg, optimizer=functools.partial(torch.optim.AdamW, lr=1e-2))
    trainer = L.Trainer(accelerator="cpu", max_steps=4, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=path.parent)
    trainer.fit(module, datamodule=dm)
    trainer.save_checkpoint(path)
    return str(path)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, corpus) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ckpts")
    return {name: fit_checkpoint(root / f"{name}.ckpt", corpus, tok, **kw) for name, (tok, kw) in MODELS.items()}


# --- loading --------------------------------------------------------------------------------------------


def test_load_checkpoint_gives_the_trained_model_and_tokenizer(ckpts):
    model, tok, meta = load_checkpoint(ckpts["char"])
    ckpt = torch.load(ckpts["char"], weights_only=True)
    assert not model.training and isinstance(tok, CharTokenizer) and meta["global_step"] == 4
    assert tok.state_dict() == ckpt["TextDataModule"]["tokenizer"]
    assert all(torch.equal(v, ckpt["state_dict"][f"model.{k}"]) for k, v in model.state_dict().items())
    assert model.cfg.to_dict() == ckpt["hyper_parameters"]["model"]


def test_a_fused_rmsnorm_checkpoint_loads_as_rmsnorm(ckpts, tmp_path):
    ckpt = torch.load(ckpts["char"], weights_only=True)
    ckpt["hyper_parameters"]["model"]["norm"] = "fused_rmsnorm"
    torch.save(ckpt, tmp_path / "fused.ckpt")
    model, _, meta = load_checkpoint(tmp_path / "fused.ckpt")  # no Triton needed
    assert model.cfg.norm == "rmsnorm" and meta["model"]["norm"] == "fused_rmsnorm"
    assert llama_incompatibilities(meta["model"]) == []


# --- Hugging Face Llama -----------------------------------------------------------------------------------


def test_minillm_rmsnorm_is_bit_identical_to_llama_rmsnorm():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from minillm.norms import RMSNorm

    torch.manual_seed(0)
    ours, theirs = RMSNorm(64, eps=1e-5), LlamaRMSNorm(64, eps=1e-5)
    gain = torch.rand(64) + 0.5
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        ours.weight.data, theirs.weight.data = gain.to(dtype), gain.to(dtype)
        x = (3 * torch.randn(2, 7, 64)).to(dtype)
        assert torch.equal(ours(x), theirs(x)), dtype


@pytest.mark.parametrize("name", ["char", "byte", "mup"])
def test_llama_export_matches_minillm_in_transformers(name, ckpts, tmp_path):
    """Same logits (fp32 rounding), same greedy tokens, same tokenizer ids and text, in transformers."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert export_main([ckpts[name], str(tmp_path / "hf")]) == 0
    assert {p.name for p in (tmp_path / "hf").iterdir()} == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"}
    model, tok, _ = load_checkpoint(ckpts[name])
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    c, cfg = hf.config, model.cfg
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.dtype == torch.float32
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.max_position_embeddings, c.rms_norm_eps, c.tie_word_embeddings) == (
        cfg.vocab_size, cfg.dim, cfg.ffn_hidden, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, SEQ, cfg.norm_eps,
        cfg.tie_embeddings)
    assert model.layers[0].attn_norm.weight.sub(1).abs().max() > 1e-3  # trained: gains are not all 1

    x = torch.randint(0, cfg.vocab_size, (4, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (model(x) - hf(x).logits).abs().max().item()
    assert diff < LOGIT_ATOL, diff

    text = TEXT if name != "byte" else TEXT + ", caf\u00e9 \u65e5\u672c?"
    ids = [int(i) for i in tok.encode(text)]
    assert hf_tok(text)["input_ids"] == ids and hf_tok.decode(ids) == text == tok.decode(ids)
    prompt = torch.tensor([ids[:8]])
    ours = model.generate(prompt, SEQ - 8, temperature=0)  # cached, within the context (HF does not slide)
    theirs = hf.generate(prompt, max_new_tokens=SEQ - 8, do_sample=False)
    assert torch.equal(ours, theirs)

    cos, sin = hf.model.rotary_emb(x.float(), torch.arange(SEQ)[None])  # HF's RoPE tables (fp32 angles), (1, T, D)
    model.rope_cos.copy_(cos[0, :, : cfg.head_dim // 2])
    model.rope_sin.copy_(sin[0, :, : cfg.head_dim // 2])
    with torch.no_grad():  # the rest of the difference was RoPE's rounding (measured: bit-identical logits)
        assert (model(x) - hf(x).logits).abs().max().item() < 1e-6


def test_a_bpe_checkpoint_exports_a_tokenizer_that_encodes_like_minillm(corpus, tmp_path):
    """data.tokenizer=bpe: the checkpoint rebuilds the trained BPE, and the export's AutoTokenizer gives its ids."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = fit_checkpoint(tmp_path / "bpe.ckpt", corpus, "bpe")
    model, tok, _ = load_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=True)["TextDataModule"]["tokenizer"]
    assert isinstance(tok, HFTokenizer) and tok.kind == "bpe" and tok.state_dict() == saved
    assert 257 < tok.vocab_size == model.cfg.vocab_size
    assert export_main([ckpt, str(tmp_path / "hf")]) == 0
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = TEXT + ", caf\u00e9 \u65e5\u672c \U0001f600"  # unseen characters: byte tokens
    ids = tok.encode(text).tolist()
    assert hf_tok(text)["input_ids"] == ids and hf_tok.decode(ids) == text == tok.decode(ids)
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.eos_token_id == tok.eos_id == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = torch.tensor([ids[:SEQ]])
    with torch.no_grad():
        assert (model(x) - hf(x).logits).abs().max().item() < LOGIT_ATOL


def test_exported_tokenizers_have_minillm_ids_for_every_token():
    pytest.importorskip("transformers")
    from transformers import PreTrainedTokenizerFast

    def fast(tok):
        return PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer(tok), clean_up_tokenization_spaces=False)

    char = CharTokenizer(TEXT + "\t\u00e9\u65e5")
    hf_char = fast(char)
    for i, ch in enumerate(char.chars):  # token i is character i
        assert hf_char(ch)["input_ids"] == [i] and hf_char.decode([i]) == ch
    text = "".join(reversed(char.chars)) * 2
    assert hf_char(text)["input_ids"] == char.encode(text).tolist()

    byte = ByteTokenizer()
    hf_byte = fast(byte)
    text = "".join(map(chr, range(256))) + " caf\u00e9 \u65e5\u672c \U0001f600"  # 1- to 4-byte characters
    assert hf_byte(text)["input_ids"] == byte.encode(text).tolist()
    assert all(hf_byte.decode([b]) == byte.decode([b]) for b in range(256))  # lone bytes >= 0x80: U+FFFD
    junk = torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    assert hf_byte.decode(junk) == byte.decode(junk)  # invalid UTF-8 decodes the same way
    assert [ord(c) for c in byte_alphabet()[:3]] == [256, 257, 258] and byte_alphabet()[65] == "A"


def test_hf_tokenizer_passes_a_tokenizers_tokenizer_through_and_names_what_it_cannot_export():
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    assert hf_tokenizer(bpe) is bpe
    with pytest.raises(ValueError, match="cannot export tokenizer kind='sentencepiece'; exportable: char, byte"):
        hf_tokenizer(type("T", (), {"kind": "sentencepiece"})())


def test_a_model_llama_cannot_express_is_refused_with_every_reason(ckpts, tmp_path, capsys):
    assert export_main([ckpts["other"], str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("minillm-export: error: cannot export to LlamaForCausalLM: norm=batchnorm (Llama uses RMSNorm), "
                   "norm_options.eps_mode=outside (Llama adds eps inside the sqrt), placement=post (Llama is "
                   "Pre-LN), qk_norm=rmsnorm (Llama has no QK-norm); use --hub-mixin to save it in minillm's own "
                   "format")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("model, reasons", [
    (dict(norm="rmsnorm"), []),
    (dict(norm="rmsnorm", norm_options={"cast": "fp32", "zero_centered": True, "affine": False}),
     ["norm_options.cast=fp32", "norm_options.zero_centered=True", "norm_options.affine=False"]),
    (dict(norm="layernorm", placement="mix"), ["norm=layernorm", "placement=mix"]),
    (dict(layers=[{}, {"placement": "peri"}], n_layers=2), ["layers=[{'placement': 'peri'}] at [1]"]),
    (dict(layers=[{"norm": "fused_rmsnorm"}, {"placement": "pre"}], n_layers=2), []),
    (dict(norm="dyt", qk_norm="layernorm"), ["norm=dyt", "qk_norm=layernorm"]),
    (dict(layernorm_scaling=True), ["layernorm_scaling=True"]),
    (dict(qkv_bias=True), ["qkv_bias=True"]),
    (dict(attn_norm_options={"eps_mode": "outside"}), ["attn_norm_options.eps_mode=outside"]),
    (dict(norm="derf", qk_norm="l2", qk_norm_axis="head"), ["norm=derf", "qk_norm=l2"]),
    (dict(v_norm=True, attn_scale=0.1, embed_scale=True, embed_norm=True), ["v_norm=True", "attn_scale=0.1",
                                                                           "embed_scale=True", "embed_norm=True"]),
    (dict(final_norm=True), []),  # Pre-LN has one
    (dict(final_norm=False, branch_scale="rezero", layer_output_scale=True),
     ["final_norm=False", "branch_scale=rezero", "layer_output_scale=True"]),
    (dict(norm="none", ngpt=True), ["norm=none", "ngpt=True"]),
])
def test_llama_incompatibilities_name_each_field(model, reasons):
    found = llama_incompatibilities(model)
    assert [r.split(" (")[0] for r in found] == reasons


# --- Hub mixin ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["zoo", "ngpt"])
def test_the_newer_choices_are_refused_by_llama_and_round_trip_through_the_hub_mixin(name, ckpts, tmp_path, capsys):
    assert export_main([ckpts[name], str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("minillm-export: error: cannot export to LlamaForCausalLM: ") and "\n" not in err
    assert not (tmp_path / "hf").exists()
    assert export_main([ckpts[name], str(tmp_path / "hub"), "--hub-mixin"]) == 0
    model, _, _ = load_checkpoint(ckpts[name])
    loaded = MinillmHub.from_pretrained(tmp_path / "hub").eval()
    x = torch.randint(0, model.cfg.vocab_size, (3, SEQ), generator=torch.Generator().manual_seed(1))
    assert loaded.cfg == model.cfg and torch.equal(loaded(x), model(x))


def test_hub_mixin_round_trip_of_any_model(ckpts, tmp_path):
    out = tmp_path / "hub"
    assert export_main([ckpts["other"], str(out), "--hub-mixin"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["norm"], config["placement"], config["qk_norm"]) == ("batchnorm", "post", "rmsnorm")
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert "placement=post" in (out / "README.md").read_text()
    model, _, _ = load_checkpoint(ckpts["other"])
    loaded = MinillmHub.from_pretrained(out).eval()
    x = torch.randint(0, model.cfg.vocab_size, (3, SEQ), generator=torch.Generator().manual_seed(1))
    assert loaded.cfg == model.cfg and torch.equal(loaded(x), model(x))  # running statistics came along
    assert torch.equal(loaded.layers[1].ffn_norm.running_var, model.layers[1].ffn_norm.running_var)


# --- sampling -------------------------------------------------------------------------------------------


def test_sample_prints_the_seeded_continuation(ckpts, capsys):
    args = [ckpts["char"], "--prompt", "The king", "--max-new-tokens", "40", "--temperature", "0.9", "--top-k", "8"]
    assert sample_main([*args, "--seed", "3"]) == 0
    out = capsys.readouterr().out
    model, tok, _ = load_checkpoint(ckpts["char"])  # the reference: uncached, same generator
    ref = model.generate(torch.as_tensor(tok.encode("The king"))[None], 40, 0.9, 8, torch.Generator().manual_seed(3),
                         use_cache=False)
    assert out == tok.decode(ref[0]) + "\n" and out.startswith("The king") and len(out) == 8 + 40 + 1
    assert sample_main([*args, "--seed", "3"]) == 0 and capsys.readouterr().out == out
    assert sample_main([*args, "--seed", "4"]) == 0 and capsys.readouterr().out != out


def test_sample_and_export_errors_are_one_line_and_exit_2(ckpts, tmp_path, capsys):
    ckpt = torch.load(ckpts["char"], weights_only=True)
    del ckpt["TextDataModule"]
    torch.save(ckpt, tmp_path / "no_tokenizer.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "foreign.ckpt")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    cases = [
        ([str(tmp_path / "missing.ckpt")], "checkpoint '.*missing.ckpt' does not exist"),
        ([str(tmp_path / "notes.txt")], r"checkpoint '.*notes.txt' is a text file, not a checkpoint$"),
        ([str(tmp_path / "foreign.ckpt")], r"'.*foreign.ckpt' is not a minillm checkpoint"),
        ([str(tmp_path / "no_tokenizer.ckpt")], "checkpoint '.*' has no tokenizer: saved without its datamodule"),
        ([ckpts["char"], "--prompt", "Zebra\u00e9"], r"prompt 'Zebra\u00e9': characters not in the tokenizer "
                                                      r"vocabulary: \['Z', '\u00e9'\]"),
    ]
    for args, message in cases:
        assert sample_main(args) == 2, args
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1
        assert re.match(f"minillm-sample: error: {message}", err), err
    for args, _ in cases[:4]:
        assert export_main([args[0], str(tmp_path / "out")]) == 2
        assert "minillm-export: error: " in capsys.readouterr().err


@pytest.mark.slow
def test_the_commands_as_a_user_runs_them(ckpts, tmp_path):
    """python -m minillm.tools.export / minillm.tools.sample in subprocesses (slow: each imports lightning)."""
    run = lambda *args: subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True)  # noqa: E731
    done = run("minillm.tools.export", ckpts["char"], str(tmp_path / "hf"))
    assert done.returncode == 0 and (tmp_path / "hf" / "model.safetensors").is_file(), done.stderr
    done = run("minillm.tools.sample", ckpts["char"], "--prompt", "The", "--max-new-tokens", "5", "--temperature", "0")
    assert done.returncode == 0 and done.stdout.startswith("The") and len(done.stdout) == 3 + 5 + 1
    done = run("minillm.tools.export", ckpts["other"], str(tmp_path / "x"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "placement=post" in done.stderr
