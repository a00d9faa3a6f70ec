"""Writing token files: a corpus's `datasets` rows -> the ids of one split back to back in a flat file, in
``num_proc`` processes, with the char vocabulary found in the same way (minillm.training.data.store decides what to
write and where)."""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from minillm import _compat
from minillm.training.data.corpus import Documents
from minillm.training.data.tokenizer import DOC_SEPARATOR, Tokenizer, code_points, token_dtype

ROWS_PER_BATCH = {False: 1000, True: 64}  # tokenization batch: documents, or ~64 KB pieces of plain-text files
SMALL_CORPUS = 32 << 20  # bytes of Arrow text below which tokenizing in one process is faster than forking
FORK_FROM_CORES = 4  # fewer cores: one process (forked workers were no faster on 2 and cost ~100-250 MB each)
COPY = 1 << 24  # tokens per chunk when moving the held-out tail


def auto_num_proc(ds: datasets.Dataset | datasets.IterableDataset, threaded: bool) -> int:
    """Tokenizing processes when data.num_proc is not set: 1 for a stream, a small corpus, a Hugging Face
    tokenizer (``threaded``: its encode_batch already runs on every core, and forked workers, one thread each,
    were slower: 0.66M vs 0.48-0.56M tokens/s on 2 cores, experiments/benchmarks/data), or a machine of fewer
    than FORK_FROM_CORES cores (char and byte on 2 cores, 150 MB: 12.1 s vs 12.9 s and 1.9 s vs 3.3 s for one
    process vs two, each forked worker holding its own copy of the parent's touched heap); else the cores, up to 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if threaded or not isinstance(ds, datasets.Dataset) or ds.data.nbytes < SMALL_CORPUS or cores < FORK_FROM_CORES:
        return 1
    return min(8, cores)


def texts_of(table: pa.Table, pieces: bool) -> tuple[list[str], list[bool]]:
    """The texts of a batch of rows and whether each ends a document: documents are stripped, empty ones dropped;
    pieces of plain-text files come stripped and carry their own "end"."""
    texts = table.column("text").to_pylist()
    if pieces:
        return texts, table.column("end").to_pylist()
    texts = [s for s in (t.strip() for t in texts if t) if s]
    return texts, [True] * len(texts)


def _map(ds: Any, fn: Any, pieces: bool, work: Path, name: str, procs: int) -> Any:
    """``ds.map(fn, batched=True)`` on Arrow batches: in `procs` processes into work/<name>.arrow for a Dataset,
    lazily for an IterableDataset (streaming)."""
    kw = dict(batched=True, batch_size=ROWS_PER_BATCH[pieces], remove_columns=ds.column_names)
    if not isinstance(ds, datasets.Dataset):
        return ds.with_format("arrow").map(fn, **kw)
    with _environ(TOKENIZERS_PARALLELISM="false" if procs > 1 else None):  # forked workers: one thread each
        return ds.with_format("arrow").map(fn, num_proc=procs if procs > 1 else None, writer_batch_size=1,
                                           cache_file_name=str(work / f"{name}.arrow"), load_from_cache_file=False,
                                           new_fingerprint=f"{name}-{uuid.uuid4().hex}", **kw)


@contextlib.contextmanager
def _environ(**values: str | None) -> Iterator[None]:
    """Set environment variables (None: leave it alone) for the duration of a block."""
    old = {k: os.environ.get(k) for k, v in values.items() if v is not None}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- tokenizer --------------------------------------------------------------------------------------------


def _chars_of_rows(table: pa.Table, pieces: bool) -> pa.Table:
    texts, ends = texts_of(table, pieces)
    codes = np.unique(code_points("".join(texts)))
    return pa.table({"codes": pa.array([codes], pa.list_(pa.uint32())), "docs": pa.array([sum(ends)], pa.int64())})


def char_vocab(docs: Documents, work: Path, procs: int) -> tuple[str, bool]:
    """The sorted characters of every split (one pass over the text), with the separator's when a split has
    two documents or more: the vocabulary of the joined text. Also whether any split has two documents."""
    chars, sep = set(), False
    for i, ds in enumerate(d for d in (docs.train, docs.val) if d is not None):
        rows = _map(ds, functools.partial(_chars_of_rows, pieces=docs.pieces), docs.pieces, work, f"chars{i}", procs)
        table = rows.with_format("arrow")[:]
        chars |= set(map(chr, pc.unique(table.column("codes").combine_chunks().flatten()).to_pylist()))
        sep |= (pc.sum(table.column("docs")).as_py() or 0) >= 2
    return "".join(sorted(chars | (set(DOC_SEPARATOR) if sep else set()))), sep


# --- token files ------------------------------------------------------------------------------------------


def _encode_rows(table: pa.Table, tokenizer: Tokenizer, pieces: bool, separate: bool, dtype: str) -> pa.Table:
    """One output row per batch: the batch's token ids, separators included."""
    ids = tokenizer.encode_documents(*texts_of(table, pieces), separate).astype(dtype)
    return pa.table({"ids": pa.ListArray.from_arrays(pa.array([0, len(ids)], pa.int32()), pa.array(ids))})


def write_split(ds: Any, tok: Tokenizer, separate: bool, pieces: bool, file: Path, budget: int | None,
                work: Path, procs: int) -> int:
    """Tokenize a split (datasets' map) and append its ids to `file`, at most `budget` of them. The separator
    after the last document is dropped (it separates nothing). Returns the number of tokens written."""
    dtype = token_dtype(tok.vocab_size)
    encode = functools.partial(_encode_rows, tokenizer=tok, pieces=pieces, separate=separate, dtype=dtype.name)
    encoded = _map(ds, encode, pieces, work, file.stem, procs)
    n, cut = 0, False
    with open(file, "wb") as f:
        for batch in _batches(encoded):  # one row per batch of documents
            ids = pa.concat_arrays([c.flatten() for c in batch.column("ids").chunks]
                                   if isinstance(batch, pa.Table) else [batch.column("ids").flatten()]).to_numpy()
            if budget is not None and n + len(ids) >= budget:
                ids, cut = ids[: budget - n], True
            f.write(ids.tobytes())
            n += len(ids)
            if cut:
                break
    sep = tok.separator if separate else np.zeros(0, np.int64)
    tail = np.fromfile(file, dtype, offset=(n - len(sep)) * dtype.itemsize) if 0 < len(sep) <= n else None
    if not cut and tail is not None and np.array_equal(tail, sep):
        n -= len(sep)
        os.truncate(file, n * dtype.itemsize)
    return n


def _batches(encoded: Any) -> Iterator[pa.RecordBatch | pa.Table]:
    """The rows of a map's output in order. A Dataset's Arrow cache files are read with plain reads rather than
    through datasets' memory map, whose pages would stay in this process's RSS: the corpus's worth of them."""
    files = [f["filename"] for f in encoded.cache_files] if isinstance(encoded, datasets.Dataset) else []
    if not files or _compat.selects_rows(encoded):  # streaming (no files), or rows selected from the files
        yield from encoded.with_format("arrow").iter(batch_size=1)
        return
    for name in files:
        with pa.OSFile(name) as f:
            yield from pa.ipc.open_stream(f)


def split_tail(train: Path, val: Path, n: int, val_fraction: float, dtype: np.dtype) -> tuple[int, int]:
    """Move the last val_fraction of the stream in `train` to `val`: the first int(n * (1 - val_fraction)) tokens
    train, the rest validate."""
    n_train = int(n * (1.0 - val_fraction))
    stream = np.memmap(train, dtype=dtype, mode="r", shape=(n,))
    with open(val, "wb") as f:
        for i in range(n_train, n, COPY):
            f.write(stream[i : min(i + COPY, n)].tobytes())
    del stream
    os.truncate(train, n_train * dtype.itemsize)
    return n_train, n - n_train
