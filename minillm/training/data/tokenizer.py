"""Tokenizers: char and byte (numpy, as before), and any Hugging Face `tokenizers.Tokenizer`: a byte-level BPE trained
on the corpus (`bpe`), a tokenizer.json file, or a Hub tokenizer (`hf:<name>`).

Every tokenizer has the same small interface: ``encode(text)`` -> int64 ids, ``decode(ids)``, ``vocab_size``,
``encode_documents(texts, ends)`` (the flat ids of a batch of documents, the separator after each one),
``token_bytes`` (UTF-8 bytes of each token, for bits per byte), ``state_dict()`` / ``tokenizer_from_state``.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
import torch
from tokenizers import decoders, models, pre_tokenizers, trainers

from minillm.errors import ConfigError

BUILT_IN = ("char", "byte", "bpe")
TOKENIZER_HELP = "char, byte, bpe, a path to a tokenizer.json, or hf:<hub name>"
DOC_SEPARATOR = "\n\n"  # char/byte: documents are joined with a blank line
EOS = "<|endoftext|>"  # bpe: the end-of-document token (id 0)
# special tokens that end a document in common tokenizer.json files (GPT-2, LLaMA, Mistral, ...)
EOS_NAMES = (EOS, "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # SentencePiece byte fallback

ENCODE_CHARS = 1 << 16  # characters of text a tokenizer.json encodes at once (HFTokenizer.encode_documents)


def _as_numpy(ids: Any) -> np.ndarray:
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    return np.asarray(ids, dtype=np.int64).reshape(-1)


def code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")  # (len(text),)


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype that holds every id."""
    return np.dtype(np.uint8 if vocab_size <= 1 << 8 else np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class _TextTokenizer:
    """char and byte: a batch of documents is joined with blank lines and encoded at once (numpy, fast)."""

    kind = ""
    bits_per_char_factor = 1.0 / math.log(2)  # bits/char (char) or bits/byte (byte) = nats/token * factor

    def encode(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def encode_documents(self, texts: Sequence[str], ends: Sequence[bool], separate: bool = True) -> np.ndarray:
        """(n,) ids of the texts back to back, with a blank line after each text whose `end` is true (if separate)."""
        sep = DOC_SEPARATOR if separate else ""
        return self.encode("".join(t + sep if e else t for t, e in zip(texts, ends, strict=True)))

    @property
    def separator(self) -> np.ndarray:
        return self.encode(DOC_SEPARATOR)


class CharTokenizer(_TextTokenizer):
    """One token per Unicode character; vocab = sorted set of the corpus characters (deterministic)."""

    kind = "char"
    unit = "char"  # what bits_per_char_factor converts to: 1 token = 1 char

    def __init__(self, chars: str | Sequence[str]) -> None:
        chars = sorted(set(chars))
        if not chars or any(len(c) != 1 for c in chars):
            raise ValueError("CharTokenizer needs a non-empty set of single characters")
        self.chars = "".join(chars)
        self._codes = np.array([ord(c) for c in chars], dtype=np.uint32)  # sorted code points
        self._table = np.array(chars)

    @classmethod
    def from_text(cls, text: str, chunk: int = 1 << 24) -> CharTokenizer:
        codes = [np.unique(code_points(text[i : i + chunk])) for i in range(0, len(text), chunk)]
        return cls("".join(map(chr, np.unique(np.concatenate(codes)).tolist())))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    @property
    def token_bytes(self) -> np.ndarray:
        return np.array([len(c.encode("utf-8")) for c in self.chars], dtype=np.int64)

    def encode(self, text: str) -> np.ndarray:
        """(len(text),) int64 ids; characters outside the vocabulary raise ValueError."""
        codes = code_points(text)
        ids = np.searchsorted(self._codes, codes)
        bad = (ids >= len(self._codes)) | (self._codes[np.minimum(ids, len(self._codes) - 1)] != codes)
        if bad.any():
            unknown = sorted({chr(c) for c in codes[bad][:1000].tolist()})
            raise ValueError(f"characters not in the tokenizer vocabulary: {unknown!r}")
        return ids.astype(np.int64)

    def decode(self, ids: Any) -> str:
        return "".join(self._table[_as_numpy(ids)].tolist())

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "chars": self.chars}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CharTokenizer:
        return cls(state["chars"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


class ByteTokenizer(_TextTokenizer):
    """One token per UTF-8 byte (vocab 256); any text works. Losses convert to bits per *byte*."""

    kind = "byte"
    unit = "byte"  # bits_per_char_factor gives bits per byte here (1 token = 1 byte)
    vocab_size = 256

    @property
    def token_bytes(self) -> np.ndarray:
        return np.ones(256, dtype=np.int64)

    def encode(self, text: str) -> np.ndarray:
        """(len(text.encode()),) int64 ids."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Any) -> str:
        ids = _as_numpy(ids)
        if ids.size and (ids.min() < 0 or ids.max() > 255):
            raise ValueError(f"byte ids must be in [0, 255], got [{ids.min()}, {ids.max()}]")
        return ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ByteTokenizer:
        return cls()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer``: kind "bpe" (trained by minillm) or "hf" (a tokenizer.json or a Hub
    tokenizer, named by ``name``). Ids are the tokenizer's own; no special tokens are added to text, and special
    tokens written in a document are encoded as plain text. Documents end with the EOS token when the tokenizer
    has one (``eos_id``), else with a blank line."""

    unit = "token"

    def __init__(self, tok: tokenizers.Tokenizer, kind: str = "hf", name: str | None = None) -> None:
        self.hf, self.kind, self.name = tok, kind, name
        self._json = tok.to_str()
        self._data = tokenizers.Tokenizer.from_str(self._json)  # the copy that encodes corpus text
        self._data.encode_special_tokens = True
        special = {i: t.content for i, t in tok.get_added_tokens_decoder().items() if t.special}
        self.eos_id = next((i for name in EOS_NAMES for i, c in special.items() if c == name), None)
        self._special = set(special)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def separator(self) -> np.ndarray:
        return np.array([self.eos_id], dtype=np.int64) if self.eos_id is not None else self.encode(DOC_SEPARATOR)

    @property
    def token_bytes(self) -> np.ndarray:
        """(V,) UTF-8 bytes each token stands for; special tokens 0. Exact for byte-level tokenizers (each
        character of a token is one byte); SentencePiece tokens (▁ for a space, <0xNN>) are counted from their
        text, exact except around normalization. A tokenizer whose pre-tokenizer drops the spaces between words
        (WordPiece, Whitespace) counts none for them, so its val/bpb comes out too high by their share."""
        byte_level = '"ByteLevel"' in json.dumps(json.loads(self._json).get("decoder"))
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            t = self.hf.id_to_token(i)
            if t is None or i in self._special:
                continue
            if byte_level and set(t) <= alphabet:
                out[i] = len(t)
            elif _BYTE_TOKEN.fullmatch(t):
                out[i] = 1
            else:
                out[i] = len(t.replace("▁", " ").removeprefix("##").encode("utf-8"))
        return out

    def encode(self, text: str) -> np.ndarray:
        return np.array(self._data.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_documents(self, texts: Sequence[str], ends: Sequence[bool], separate: bool = True) -> np.ndarray:
        """(n,) ids of the texts back to back, the separator after each ended one. Encoded by ``encode_batch_fast``
        (Rust threads) in groups of about ENCODE_CHARS characters, each group's ids kept as a uint32 array at
        once: an Encoding holds every token's string and masks besides its id (~100 bytes a token), so a whole
        batch of text pieces encoded at once held several times the text in memory."""
        sep = self.separator.astype(np.uint32) if separate else np.zeros(0, np.uint32)
        out: list[np.ndarray] = []
        group: list[str] = []
        size = 0
        for i, text in enumerate(texts):
            group.append(text)
            size += len(text)
            if size >= ENCODE_CHARS or i == len(texts) - 1:
                for enc, end in zip(self._data.encode_batch_fast(group, add_special_tokens=False),
                                    ends[i + 1 - len(group): i + 1], strict=True):
                    out.append(np.asarray(enc.ids, dtype=np.uint32))
                    if end:
                        out.append(sep)
                group, size = [], 0
        return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)

    def decode(self, ids: Any) -> str:
        return self.hf.decode(_as_numpy(ids).tolist(), skip_special_tokens=False)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "json": self._json}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> HFTokenizer:
        return cls(tokenizers.Tokenizer.from_str(state["json"]), state["kind"], state.get("name"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HFTokenizer) and other._json == self._json

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers, datasets' map processes
        return self.state_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(tokenizers.Tokenizer.from_str(state["json"]), state["kind"], state.get("name"))

    def __repr__(self) -> str:
        return f"HFTokenizer(kind={self.kind!r}, name={self.name!r}, vocab_size={self.vocab_size})"


Tokenizer = CharTokenizer | ByteTokenizer | HFTokenizer


def train_bpe(texts: Iterable[str | list[str]], vocab_size: int) -> HFTokenizer:
    """A byte-level BPE (GPT-2's pre-tokenizer and byte alphabet) with `vocab_size` tokens at most, EOS = id 0.
    Deterministic: the same texts give the same merges."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return HFTokenizer(tok, "bpe", f"bpe{vocab_size}")


def check_tokenizer_spec(spec: Any) -> None:
    """data.tokenizer: char | byte | bpe | hf:<name> | a path to an existing tokenizer.json."""
    if spec in BUILT_IN or (isinstance(spec, str) and spec.startswith("hf:") and len(spec) > 3):
        return
    if isinstance(spec, str) and spec.endswith(".json"):
        if not Path(spec).expanduser().is_file():
            raise ConfigError(f"data.tokenizer: {spec!r} does not exist")
        return
    raise ConfigError(f"data.tokenizer={spec!r} is unknown; allowed: {TOKENIZER_HELP}")


def load_tokenizer(spec: str) -> HFTokenizer:
    """The tokenizer of `hf:<name>` (its tokenizer.json from the Hub, through huggingface_hub's cache) or of a
    tokenizer.json path."""
    if spec.startswith("hf:"):
        import huggingface_hub

        try:
            path = huggingface_hub.hf_hub_download(spec[3:], "tokenizer.json")
        except Exception as err:  # offline, unknown repo, no tokenizer.json: one line
            reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
            raise ConfigError(f"data.tokenizer={spec!r}: cannot get its tokenizer.json ({reason})") from None
    else:
        path = os.path.expanduser(spec)
    try:
        return HFTokenizer(tokenizers.Tokenizer.from_file(str(path)), "hf", spec)
    except Exception as err:
        raise ConfigError(f"data.tokenizer: {str(path)!r} is not a tokenizers tokenizer.json ({err})") from None


def tokenizer_from_state(state: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from `state_dict()` (e.g. from a checkpoint's datamodule state)."""
    kinds = {"char": CharTokenizer, "byte": ByteTokenizer, "bpe": HFTokenizer, "hf": HFTokenizer}
    if state.get("kind") not in kinds:
        raise ValueError(f"tokenizer state kind={state.get('kind')!r} is unknown; allowed: {list(kinds)}")
    return kinds[state["kind"]].from_state(state)
