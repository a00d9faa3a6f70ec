"""Tokenizers (minillm/training/data/tokenizer.py): char, byte, the trained BPE, tokenizer.json and hf: tokenizers."""

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import tokenizers
import torch
from helpers import make_dm, mixed_text

from minillm.errors import ConfigError
from minillm.training import data as D
from minillm.training.data import ByteTokenizer, CharTokenizer, HFTokenizer

datasets.disable_progress_bars()
TEXT = "Héllo, wörld! ✓ — 😀 naïve\nline two\ttab"
BPE_TEXTS = [mixed_text(3000, seed) + " ✓ 😀 日本語 " * 20 for seed in range(4)]


@pytest.fixture(scope="module")
def bpe() -> HFTokenizer:
    return D.train_bpe(BPE_TEXTS, vocab_size=400)


def test_char_tokenizer_round_trip_and_vocab():
    tok = CharTokenizer.from_text(TEXT)
    assert tok.vocab_size == len(set(TEXT))
    assert list(tok.chars) == sorted(set(TEXT))
    assert CharTokenizer.from_text("".join(reversed(TEXT))) == tok  # vocab does not depend on order
    ids = tok.encode(TEXT)
    assert ids.dtype == np.int64 and ids.shape == (len(TEXT),)
    assert tok.decode(ids) == TEXT
    assert tok.decode(torch.from_numpy(ids)) == TEXT
    assert tok.decode(ids.tolist()) == TEXT
    assert tok.encode("").shape == (0,) and tok.decode([]) == ""
    with pytest.raises(ValueError, match="not in the tokenizer vocabulary.*'Z'"):
        tok.encode("Zebra")


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    assert tok.vocab_size == 256 and ids.dtype == np.int64
    assert len(ids) == len(TEXT.encode("utf-8")) and ids.max() < 256
    assert tok.decode(ids) == TEXT
    assert tok.decode([0xC3]) == "\ufffd"  # a cut multi-byte character decodes with errors="replace"
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        tok.decode([256])


@pytest.mark.parametrize("tok", [CharTokenizer.from_text(TEXT), ByteTokenizer()], ids=["char", "byte"])
def test_tokenizer_state_round_trip(tok):
    state = tok.state_dict()
    again = D.tokenizer_from_state(state)
    assert type(again) is type(tok) and again == tok
    assert again.decode(tok.encode(TEXT)) == TEXT
    assert tok.bits_per_char_factor == pytest.approx(1 / np.log(2))
    assert tok.unit == tok.kind


def test_tokenizer_from_unknown_state():
    with pytest.raises(ValueError, match=r"kind='sentencepiece' is unknown; allowed: \['char', 'byte', 'bpe', 'hf'\]"):
        D.tokenizer_from_state({"kind": "sentencepiece"})


def test_documents_are_separated_by_a_blank_line_or_the_eos_token(bpe):
    char = CharTokenizer.from_text("ab\n")
    assert char.decode(char.encode_documents(["ab", "b", "a"], [True, False, True])) == "ab\n\nba\n\n"
    assert bpe.eos_id == 0 and bpe.hf.id_to_token(0) == D.EOS
    ids = bpe.encode_documents(["the king", "the queen"], [True, True])
    assert ids.tolist() == [*bpe.encode("the king"), 0, *bpe.encode("the queen"), 0]
    # the EOS token's text inside a document is text, not the special token
    assert 0 not in bpe.encode_documents([f"a {D.EOS} b"], [False]).tolist()
    assert bpe.decode(bpe.encode(f"a {D.EOS} b")) == f"a {D.EOS} b"


def test_bpe_round_trip_state_and_determinism(bpe):
    assert 300 < bpe.vocab_size <= 400 and bpe.kind == "bpe"
    for text in [*BPE_TEXTS[:1], TEXT, "unseen: Ωμέγα ∑ 🦀", ""]:
        ids = bpe.encode(text)
        assert ids.dtype == np.int64 and bpe.decode(ids) == text  # byte-level: any text round-trips
    assert len(bpe.encode(BPE_TEXTS[0])) < 0.6 * len(BPE_TEXTS[0].encode())  # it merged something
    again = D.train_bpe(BPE_TEXTS, vocab_size=400)  # same corpus: same vocabulary and merges
    assert again == bpe and again.state_dict()["json"] == bpe.state_dict()["json"]
    assert D.train_bpe(BPE_TEXTS[:2], vocab_size=400) != bpe  # another corpus, another tokenizer
    restored = D.tokenizer_from_state(bpe.state_dict())
    assert isinstance(restored, HFTokenizer) and restored == bpe and restored.eos_id == 0
    assert restored.encode(TEXT).tolist() == bpe.encode(TEXT).tolist()


@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
def test_token_bytes_sum_to_the_utf8_bytes_of_the_text(kind, bpe):
    text = BPE_TEXTS[1] + TEXT
    tok = {"char": CharTokenizer.from_text(text), "byte": ByteTokenizer(), "bpe": bpe}[kind]
    table = tok.token_bytes
    assert table.shape == (tok.vocab_size,)
    assert table[tok.encode(text)].sum() == len(text.encode("utf-8"))
    assert table[tok.encode_documents([text, text], [True, True])].sum() == 2 * len(text.encode()) + (
        4 if kind != "bpe" else 0)  # "\n\n" twice; the EOS token is 0 bytes


def test_a_tokenizer_json_by_path_and_by_hf_name(bpe, tmp_path: Path, monkeypatch):
    """A tokenizer.json file, and hf:<name> through the same loader (huggingface_hub's download is faked: no
    network); a tokenizer without a known EOS token separates documents with a blank line."""
    bpe.hf.save(str(tmp_path / "tokenizer.json"))
    by_path = D.load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert by_path.kind == "hf" and by_path.encode(TEXT).tolist() == bpe.encode(TEXT).tolist()
    assert by_path.eos_id == 0 and by_path.token_bytes.tolist() == bpe.token_bytes.tolist()

    import huggingface_hub

    asked = []
    plain = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1, "\n": 2, "[UNK]": 3}, "[UNK]"))
    plain.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    plain.save(str(tmp_path / "plain.json"))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda repo, filename: asked.append((repo, filename)) or str(tmp_path / "plain.json"))
    hub = D.load_tokenizer("hf:someone/plain")
    assert asked == [("someone/plain", "tokenizer.json")] and hub.name == "hf:someone/plain"
    assert hub.eos_id is None and hub.separator.tolist() == [2, 2]
    assert hub.encode_documents(["ab", "ba"], [True, True]).tolist() == [0, 1, 2, 2, 1, 0, 2, 2]
    assert D.tokenizer_from_state(hub.state_dict()) == hub

    def offline(repo, filename):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(ConfigError, match=r"^data.tokenizer='hf:gpt2': cannot get its tokenizer.json \(OSError: We"):
        D.load_tokenizer("hf:gpt2")
    (tmp_path / "bad.json").write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(ConfigError, match="data.tokenizer: '.*bad.json' is not a tokenizers tokenizer.json"):
        D.load_tokenizer(str(tmp_path / "bad.json"))


def test_datamodule_with_a_tokenizer_json(bpe, tmp_path: Path):
    path = tmp_path / "tok.json"
    bpe.hf.save(str(path))
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in BPE_TEXTS))
    dm = make_dm(corpus, tmp_path, tokenizer=str(path))
    assert dm.tokenizer.kind == "hf" and dm.vocab_size == bpe.vocab_size
    assert dm.cache_path.name.startswith("files-json-") and dm.train_tokens.dtype == np.uint16
    stream = np.concatenate([dm.train_tokens, dm.val_tokens]).astype(np.int64)
    expected = bpe.encode_documents([t.strip() for t in BPE_TEXTS], [True] * 4)[:-1]  # the last EOS separates nothing
    assert stream.tolist() == expected.tolist()
