"""Token store: documents -> tokenizer -> flat token files read through np.memmap, prepared once and shared.

A store is a folder ``<cache_dir>/<source>-<tokenizer>-<key>/``:

    train.bin, val.bin   the ids of each split back to back (little-endian uint8 / uint16 / uint32, meta "dtype")
    tokenizer.json       the Hugging Face tokenizer (bpe, tokenizer.json, hf:), for use outside minillm
    meta.json            written last, so its presence marks a complete store: sizes, dtype, the tokenizer's
                         state_dict, what the corpus was (file sizes and mtimes, or hub name and revision), and
                         a checksum of each token file

A store is checked when it is opened: the token files must have the sizes meta.json gives, and, for stores of
up to VERIFY_BYTES (a few hundred milliseconds of hashing), the checksums it records. Bytes changed in place in
a larger store are caught when a batch holds an id outside the vocabulary (TextDataModule). Each failure is one
DataError naming the folder to delete.

The key hashes the corpus *metadata* (`corpus.fingerprint`), the tokenizer and the split settings, so a hit
opens two memory maps without reading any text. A miss builds the store in a temp folder next to it and renames
it into place; a lock file makes other processes (DDP ranks, simultaneous runs) wait for it instead of preparing
too, and the rename keeps a crash or a lock-less file system from leaving a half-written store.

Each split is one stream: the tokens of its documents with the tokenizer's separator (a blank line for char and
byte, the end-of-document token for bpe) between documents. Without a validation split of its own, the last
``val_fraction`` of the stream validates (contiguous, like nanoGPT). ``max_tokens`` caps the tokens of both
splits together, val taking ``val_fraction`` of them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc
from filelock import FileLock, Timeout

from minillm.errors import SPACE_ERRORS, DataError, disk_oserror
from minillm.training.data.corpus import CorpusSpec, Documents, fingerprint, load_documents
from minillm.training.data.token_files import (
    ROWS_PER_BATCH,
    auto_num_proc,
    char_vocab,
    split_tail,
    texts_of,
    write_split,
)
from minillm.training.data.tokenizer import (
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    Tokenizer,
    load_tokenizer,
    token_dtype,
    tokenizer_from_state,
    train_bpe,
)

log = logging.getLogger(__name__)

CACHE_VERSION = 3  # bump when the store layout or tokenization changes
VERIFY_BYTES = 256 << 20  # stores up to this size are checksummed at every open


@dataclass(frozen=True)
class StoreSpec:
    """Everything that decides a store's contents (num_proc only decides how fast it is built)."""

    corpus: CorpusSpec = field(default_factory=CorpusSpec)
    tokenizer: str = "char"
    vocab_size: int = 4096  # bpe only
    val_fraction: float = 0.1
    max_tokens: int | None = None
    bpe_train_bytes: int | None = None  # bpe only: train on at most this many bytes of the train split
    num_proc: int | None = None

    @property
    def tag(self) -> str:
        """The tokenizer in the folder name: char, byte, bpe4096, json (a file), hf-<name>."""
        if self.tokenizer == "bpe":
            return f"bpe{self.vocab_size}"
        if self.tokenizer.startswith("hf:"):
            return "hf-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", self.tokenizer[3:])
        return self.tokenizer if self.tokenizer in ("char", "byte") else "json"

    def key(self) -> str:
        """sha256 of the corpus fingerprint, the tokenizer and the split settings (reads no text)."""
        tok: Any = self.tokenizer
        if self.tokenizer == "bpe":
            tok = [tok, self.vocab_size, self.bpe_train_bytes]
        elif self.tokenizer.endswith(".json"):
            st = Path(self.tokenizer).expanduser().stat()
            tok = [str(Path(self.tokenizer).expanduser().resolve()), st.st_size, st.st_mtime_ns]
        payload = {"version": CACHE_VERSION, "corpus": fingerprint(self.corpus), "tokenizer": tok,
                   "val_fraction": self.val_fraction, "max_tokens": self.max_tokens}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass
class TokenStore:
    path: Path
    tokenizer: Tokenizer
    train: np.ndarray  # (N_train,) np.memmap
    val: np.ndarray  # (N_val,)
    meta: dict[str, Any]
    hit: bool  # found complete (prepared earlier, or by another process while this one waited)


def store_path(spec: StoreSpec, cache_dir: str | os.PathLike) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.corpus.name)
    return Path(cache_dir).expanduser() / f"{name}-{spec.tag}-{spec.key()[:16]}"


def is_complete(path: Path) -> bool:
    return (path / "meta.json").is_file()


def _memmap(path: Path, dtype: np.dtype, n: int) -> np.ndarray:
    size = path.stat().st_size
    if size != n * dtype.itemsize:
        raise ValueError(f"{path.name} holds {size} bytes, meta.json says {n} {dtype} tokens")
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)


def checksum(path: Path) -> str:
    """blake2b of a file, read in 16 MiB pieces."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while piece := f.read(16 << 20):
            digest.update(piece)
    return digest.hexdigest()


def _verify(path: Path, meta: dict[str, Any]) -> None:
    """The token files' checksums are those meta.json recorded (small stores; older stores record none)."""
    sums = meta.get("checksums") or {}
    files = [path / name for name in sums]
    if sum(f.stat().st_size for f in files) > VERIFY_BYTES:
        return
    for f in files:
        if checksum(f) != sums[f.name]:
            raise ValueError(f"{f.name} was changed after the store was written (its checksum differs from "
                             "meta.json's)")


def open_store(path: Path, hit: bool = True) -> TokenStore:
    """Open a complete store: read meta.json, map the token files (no copy), check them (see above)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        dtype = np.dtype(meta["dtype"])
        train, val = (_memmap(path / f"{s}.bin", dtype, int(meta[f"n_{s}"])) for s in ("train", "val"))
        _verify(path, meta)
        tokenizer = tokenizer_from_state(meta["tokenizer"])
    except Exception as err:  # truncated token files, edited JSON, a half-deleted folder
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        raise DataError(f"token cache {str(path)!r} is unreadable ({reason}); delete that folder and run again "
                        "(it is rebuilt from the corpus)") from err
    return TokenStore(path, tokenizer, train, val, meta, hit)


def check_writable(cache_dir: Path) -> None:
    """The cache folder exists (or can be made) and takes new files; else one DataError naming data.cache_dir."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        probe = cache_dir / f".write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        reason = "it is a file" if cache_dir.exists() and not cache_dir.is_dir() else os.strerror(err.errno or 0)
        raise DataError(f"data.cache_dir={str(cache_dir)!r} cannot hold token stores ({reason}); set data.cache_dir "
                        "(or MINILLM_CACHE) to a writable folder") from None


def prepare_store(spec: StoreSpec, cache_dir: str | os.PathLike) -> TokenStore:
    """Open the store of `spec`, building it first if it does not exist; concurrent callers wait for one build."""
    path = store_path(spec, cache_dir)
    if is_complete(path):
        return open_store(path)
    check_writable(path.parent)
    lock = FileLock(str(path.parent / f".{path.name}.lock"))  # flock: the OS releases it if this process dies
    try:
        lock.acquire(timeout=1)
    except Timeout:
        log.info("data: another process is preparing %s; waiting for it", path)
        lock.acquire()
    try:
        if is_complete(path):
            return open_store(path)
        build_store(spec, path)
    finally:
        Path(lock.lock_file).unlink(missing_ok=True)  # later callers find the store complete and never lock
        lock.release()
    return open_store(path, hit=False)


# --- building -----------------------------------------------------------------------------------------------


def build_store(spec: StoreSpec, path: Path) -> None:
    """Tokenize the corpus into a temp folder beside `path`, then rename it to `path` (atomic)."""
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    work = tmp / "work"  # Arrow files of `datasets` (text of local files, tokenized batches): deleted at the end
    start = time.time()
    try:
        work.mkdir(parents=True)
        docs = load_documents(spec.corpus, work, spec.num_proc)
        procs = spec.num_proc or auto_num_proc(docs.train, threaded=spec.tokenizer not in ("char", "byte"))
        tok, separate = make_tokenizer(spec, docs, work, procs)
        dtype = token_dtype(tok.vocab_size)
        total = spec.max_tokens
        val_budget = max(1, int(total * spec.val_fraction)) if total and docs.val is not None else None
        write = functools.partial(write_split, tok=tok, separate=separate, pieces=docs.pieces, work=work, procs=procs)
        n = write(docs.train, file=tmp / "train.bin", budget=total and total - (val_budget or 0))
        if n == 0:
            raise DataError(f"data.source={spec.corpus.source!r} gave an empty corpus")
        if docs.val is not None:
            n_train, n_val = n, write(docs.val, file=tmp / "val.bin", budget=val_budget)
        else:
            n_train, n_val = split_tail(tmp / "train.bin", tmp / "val.bin", n, spec.val_fraction, dtype)
        meta = {"version": CACHE_VERSION, "key": spec.key(), "dtype": dtype.name, "n_train": n_train,
                "n_val": n_val, "val": "split" if docs.val is not None else f"last {spec.val_fraction} of the stream",
                "tokenizer": tok.state_dict(), "corpus": fingerprint(spec.corpus),
                "settings": {k: v for k, v in asdict(spec).items() if k not in ("corpus", "num_proc")},
                "num_proc": procs, "seconds": round(time.time() - start, 3),
                "checksums": {f: checksum(tmp / f) for f in ("train.bin", "val.bin")}}
        del docs
        shutil.rmtree(work)
        if isinstance(tok, HFTokenizer):
            tok.hf.save(str(tmp / "tokenizer.json"))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))  # written last: marks the store complete
        try:
            os.replace(tmp, path)  # atomic; fails if another writer already put a store there
        except OSError:
            if not is_complete(path):  # not a build's (those rename a complete folder): edited by hand
                raise DataError(f"token cache {str(path)!r} is incomplete (no meta.json); delete that folder and "
                                "run again (it is rebuilt from the corpus)") from None
    except Exception as err:
        full = disk_oserror(err, SPACE_ERRORS)
        if full is None:
            raise
        raise DataError(f"data.cache_dir={str(path.parent)!r} cannot hold the token store {path.name} "
                        f"({os.strerror(full.errno)}); free space there, or set data.cache_dir (or MINILLM_CACHE) to a "
                        "folder with room") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bpe_texts(spec: StoreSpec, docs: Documents) -> Iterator[str]:
    """The train texts for the BPE, one at a time (tokenizers' trainer buffers 256 of the items it is given, so
    an item is one document or piece, not a batch of them): at most bpe_train_bytes, and, when val is the tail of
    the stream, the first (1 - val_fraction) of its bytes, and of max_tokens (a byte-level token covers a byte or
    more, so those bytes end inside the train tokens); the row that crosses the limit gives its first bytes."""
    limit = float(spec.bpe_train_bytes or math.inf)
    if docs.val is None and spec.max_tokens:
        limit = min(limit, (1.0 - spec.val_fraction) * spec.max_tokens)
    if docs.val is None and isinstance(docs.train, datasets.Dataset):
        lengths = (pc.sum(pc.binary_length(t.column("text"))).as_py() or 0
                   for t in docs.train.with_format("arrow").iter(batch_size=10_000))
        limit = min(limit, (1.0 - spec.val_fraction) * sum(lengths))
    seen = 0
    for table in docs.train.with_format("arrow").iter(batch_size=ROWS_PER_BATCH[docs.pieces]):
        sizes = np.asarray(pc.binary_length(table.column("text")).fill_null(0), dtype=np.int64)
        keep = int(np.searchsorted(seen + np.cumsum(sizes), limit, side="right"))
        texts = texts_of(table.slice(0, keep), docs.pieces)[0]
        if keep < table.num_rows:
            rest = int(limit - seen - sizes[:keep].sum())
            texts.append((table.column("text")[keep].as_py() or "").encode()[:rest].decode(errors="ignore"))
        yield from texts
        seen += int(sizes.sum())
        if keep < table.num_rows:
            return


def make_tokenizer(spec: StoreSpec, docs: Documents, work: Path, procs: int) -> tuple[Tokenizer, bool]:
    """The tokenizer, and whether documents need separators (not for char data of one document per split,
    whose vocabulary then may lack the separator's character)."""
    if spec.tokenizer == "char":
        chars, separate = char_vocab(docs, work, procs)
        if not chars:
            raise DataError(f"data.source={spec.corpus.source!r} gave an empty corpus")
        if len(chars) < 2:
            raise DataError(f"the corpus has a vocabulary of {len(chars)} symbol ({chars!r}): there is nothing to "
                            "predict; use a corpus with at least two distinct characters")
        return CharTokenizer(chars), separate
    if spec.tokenizer == "byte":
        return ByteTokenizer(), True
    if spec.tokenizer == "bpe":
        return train_bpe(bpe_texts(spec, docs), spec.vocab_size), True
    return load_tokenizer(spec.tokenizer), True
