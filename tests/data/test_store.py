"""Token store (minillm/training/data/store.py): cache keys from metadata, hits that read no text, corrupted stores,
concurrent preparation (threads and processes, DDP ranks on one store), max_tokens, the prepare command."""

import hashlib
import json
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
from helpers import make_dm, mixed_text

from minillm.errors import DataError
from minillm.training import data as D
from minillm.training.data import CharTokenizer, TextDataModule
from minillm.training.data import store as S

datasets.disable_progress_bars()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(mixed_text(), encoding="utf-8")
    return path


def spec(path: Path, tokenizer: str = "char", val_fraction: float = 0.1, **kw) -> S.StoreSpec:
    return S.StoreSpec(D.CorpusSpec("files", (str(path),)), tokenizer, val_fraction=val_fraction, **kw)


def test_cache_hit_does_not_retokenize(corpus: Path, tmp_path: Path, monkeypatch):
    cold = make_dm(corpus, tmp_path)
    assert cold.cache_hit is False and (cold.cache_path / "meta.json").is_file()

    def boom(*args, **kwargs):
        raise AssertionError("tokenizer built, encode called or text loaded on a cache hit")

    monkeypatch.setattr(CharTokenizer, "encode", boom)
    monkeypatch.setattr(CharTokenizer, "from_text", staticmethod(boom))
    monkeypatch.setattr(S, "load_documents", boom)
    warm = make_dm(corpus, tmp_path)
    assert warm.cache_hit is True and warm.cache_path == cold.cache_path
    assert warm.tokenizer == cold.tokenizer
    np.testing.assert_array_equal(warm.train_tokens, cold.train_tokens)
    np.testing.assert_array_equal(warm.val_tokens, cold.val_tokens)
    assert isinstance(warm.train_tokens, np.memmap) and Path(warm.train_tokens.filename).parent == warm.cache_path


_OPENED: list[str] | None = None  # paths opened while the audit hook below is armed (hooks cannot be removed)


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


def test_a_cache_hit_reads_no_text(tmp_path: Path):
    """After preparing, the corpus is made unreadable (chmod 000; and, as root can read anyway, every file
    opened by Python is recorded): a hit only stats the corpus and opens meta.json and the token files."""
    global _OPENED
    files = [tmp_path / f"{i}.jsonl" for i in range(2)]
    for i, f in enumerate(files):
        f.write_text("".join(json.dumps({"text": mixed_text(500, i * 10 + j)}) + "\n" for j in range(5)))
    kw = dict(tokenizer="bpe", vocab_size=300)
    cold = make_dm(tmp_path / "*.jsonl", tmp_path, **kw)
    for f in files:
        f.chmod(0)
    sys.addaudithook(_audit)
    _OPENED = []
    try:
        start = time.perf_counter()
        warm = make_dm(tmp_path / "*.jsonl", tmp_path, **kw)
        seconds = time.perf_counter() - start
        opened = {Path(p).resolve() for p in _OPENED}
    finally:
        _OPENED = None
        for f in files:
            f.chmod(0o644)
    assert warm.cache_hit and warm.tokenizer == cold.tokenizer and seconds < 5
    assert not {f.resolve() for f in files} & opened
    assert {p.name for p in opened if warm.cache_path in p.parents} == {"meta.json", "train.bin", "val.bin"}
    os.utime(files[1], ns=(1, 1))  # a changed corpus (new mtime): another store
    assert make_dm(tmp_path / "*.jsonl", tmp_path, **kw).cache_path != cold.cache_path


def test_cache_key_covers_text_tokenizer_and_split(tmp_path: Path):
    path = tmp_path / "c.txt"
    path.write_text("abc" * 50)
    keys = {spec(path).key(), spec(path, "byte").key(), spec(path, val_fraction=0.2).key(),
            spec(path, "bpe").key(), spec(path, "bpe", vocab_size=300).key(), spec(path, max_tokens=100).key()}
    path.write_text("abd" * 50)  # same size: the mtime tells
    os.utime(path, ns=(10**18, 10**18))
    keys.add(spec(path).key())
    assert len(keys) == 7
    assert spec(path, num_proc=4).key() == spec(path).key()  # speed, not content
    first = S.prepare_store(spec(path), tmp_path / "cache")
    again = S.prepare_store(spec(path), tmp_path / "cache")  # same settings: hit
    assert (first.hit, again.hit) == (False, True) and again.path == first.path
    assert first.path.name.startswith("files-char-") and len(first.meta["key"]) == 64


def test_a_corrupted_store_says_which_folder_to_delete(corpus: Path, tmp_path: Path):
    store = S.prepare_store(spec(corpus), tmp_path)
    with open(store.path / "val.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(DataError) as err:
        S.prepare_store(spec(corpus), tmp_path)
    assert str(err.value) == (f"token cache {str(store.path)!r} is unreadable (ValueError: val.bin holds 10 bytes, "
                              f"meta.json says {len(store.val)} uint8 tokens); delete that folder and run again (it "
                              "is rebuilt from the corpus)")
    (store.path / "meta.json").write_text("{not json")
    with pytest.raises(DataError, match=r"^token cache '.*' is unreadable \(JSONDecodeError: .*delete that folder"):
        make_dm(corpus, tmp_path, cache_dir=str(tmp_path))
    (store.path / "meta.json").unlink()  # a folder without meta.json was never a build's: not overwritten
    with pytest.raises(DataError, match=r"^token cache '.*' is incomplete \(no meta.json\); delete that folder"):
        S.prepare_store(spec(corpus), tmp_path)
    assert (store.path / "train.bin").is_file()


def test_concurrent_preparers_build_once_and_leave_one_loadable_store(corpus: Path, tmp_path: Path, monkeypatch):
    """Two threads miss at the same moment (a barrier); the lock lets one build while the other waits and then
    opens the finished store: one build, no temp folders or lock files left."""
    barrier, builds, real_build = threading.Barrier(2, timeout=30), [], S.build_store
    real_complete = S.is_complete

    def racing_complete(path):
        found = real_complete(path)
        if threading.current_thread().name.startswith("prep") and not getattr(threading.current_thread(), "met",
                                                                               False):
            threading.current_thread().met = True
            barrier.wait()  # both threads have passed the first cache check before either builds
        return found

    monkeypatch.setattr(S, "is_complete", racing_complete)
    monkeypatch.setattr(S, "build_store", lambda *a: builds.append(a) or time.sleep(0.3) or real_build(*a))
    results, errors = [], []

    def run():
        try:
            results.append(S.prepare_store(spec(corpus), tmp_path / "cache"))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, name=f"prep{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(builds) == 1 and sorted(r.hit for r in results) == [False, True]  # one built, one waited
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [results[0].path.name]  # no temp dirs, no locks
    again = S.prepare_store(spec(corpus), tmp_path / "cache")
    assert again.hit and again.tokenizer == results[0].tokenizer
    text = corpus.read_text(encoding="utf-8").strip()
    np.testing.assert_array_equal(np.concatenate([again.train, again.val]), again.tokenizer.encode(text))


def test_a_builder_that_loses_the_rename_uses_the_winner(tmp_path: Path, monkeypatch):
    """Without a working lock (both checks miss, as if another machine finished just then), the build still ends
    in one complete store: the rename onto a finished store fails and the finished one is used."""
    path = tmp_path / "c.txt"
    path.write_text(mixed_text(500))
    first = S.prepare_store(spec(path, "byte"), tmp_path / "cache")
    real, answers = S.is_complete, [False, False]
    monkeypatch.setattr(S, "is_complete", lambda p: answers.pop() if answers else real(p))
    second = S.prepare_store(spec(path, "byte"), tmp_path / "cache")  # misses twice, builds, finds the target taken
    assert second.path == first.path and (first.path / "meta.json").is_file()
    assert len(list((tmp_path / "cache").iterdir())) == 1
    np.testing.assert_array_equal(second.train, first.train)


def test_the_bpe_learns_from_the_train_split_only(tmp_path: Path):
    """The BPE is trained on the first (1 - val_fraction) of the bytes (and at most bpe_train_bytes): words that
    only the held-out tail has get no merges; a corpus of one document trains it on its start."""
    docs = [mixed_text(2000, s) for s in range(4)] + ["jazzy jujube " * 600]  # j, z, y only there
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    dm = make_dm(tmp_path / "d.jsonl", tmp_path, tokenizer="bpe", vocab_size=400, val_fraction=0.3)
    assert "jazzy jujube" in dm.tokenizer.decode(dm.val_tokens)
    assert sorted(t for t in dm.tokenizer.hf.get_vocab() if set(t) & set("jzy")) == ["j", "y", "z"]  # no merges
    limited = make_dm(tmp_path / "d.jsonl", tmp_path, tokenizer="bpe", vocab_size=400, bpe_train_bytes=60)
    assert 257 < limited.vocab_size < dm.vocab_size - 5  # 60 bytes of text teach fewer merges
    (tmp_path / "one.txt").write_text(docs[0] + docs[-1])
    one = make_dm(tmp_path / "one.txt", tmp_path, tokenizer="bpe", vocab_size=400, val_fraction=0.5)
    assert one.vocab_size > 280 and sorted(t for t in one.tokenizer.hf.get_vocab() if set(t) & set("jzy")) == [
        "j", "y", "z"]
    # with max_tokens, val is the tail of the first max_tokens tokens: the BPE stops before it, far from the end
    docs = [mixed_text(5000, 0), mixed_text(300, 1), "jazzy jujube " * 400]
    docs += [mixed_text(2000, s) for s in range(2, 13)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    capped = make_dm(tmp_path / "c.jsonl", tmp_path, tokenizer="bpe", vocab_size=400, max_tokens=8000,
                     val_fraction=0.5)
    assert "jazzy" in capped.tokenizer.decode(capped.val_tokens)
    assert "j" not in capped.tokenizer.decode(capped.train_tokens)
    assert sorted(t for t in capped.tokenizer.hf.get_vocab() if set(t) & set("jzy")) == ["j", "y", "z"]


def test_max_tokens_keeps_the_start_of_the_stream(corpus: Path, tmp_path: Path):
    full = make_dm(corpus, tmp_path, tokenizer="byte")
    capped = make_dm(corpus, tmp_path, tokenizer="byte", max_tokens=1000, val_fraction=0.2)
    assert (len(capped.train_tokens), len(capped.val_tokens)) == (800, 200)
    np.testing.assert_array_equal(np.concatenate([capped.train_tokens, capped.val_tokens]),
                                  np.concatenate([full.train_tokens, full.val_tokens])[:1000])


def test_the_prepare_command(corpus: Path, tmp_path: Path, capsys):
    from minillm.tools.prepare import main

    args = ["data=files", f"data.files=[{corpus}]", f"paths.cache_dir={tmp_path / 'cache'}", "data.tokenizer=bpe",
            "data.vocab_size=300"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["hit"] is False and Path(first["path"]).parent == tmp_path / "cache"
    assert first["train_tokens"] > 0 and first["dtype"] == "uint16" and "bpe300" in first["path"]
    assert (Path(first["path"]) / "tokenizer.json").is_file()
    assert main(args) == 0 and json.loads(capsys.readouterr().out)["hit"] is True
    dm = TextDataModule(source="files", files=[str(corpus)], tokenizer="bpe", vocab_size=300, seq_len=16,
                        cache_dir=str(tmp_path / "cache"))
    dm.setup()
    assert dm.cache_hit and str(dm.cache_path) == first["path"]  # training finds the prepared store
    assert main([*args, "data.vocab_size=3"]) == 2
    assert capsys.readouterr().err.strip() == "config error: data.vocab_size=3 is invalid; allowed: an integer >= 257"
    assert main(["data=nope"]) == 2
    assert capsys.readouterr().err.startswith("config error: ")


def _rank(corpus: str, go: str, cache: str, rank: int, out: str) -> None:
    """One DDP rank (a forked process): wait for the start signal, prepare and set up, read its windows."""
    from types import SimpleNamespace

    dm = TextDataModule(source="files", files=[corpus], seq_len=16, batch_size=4, train_samples=64, val_windows=10,
                        cache_dir=cache)
    while not Path(go).exists():
        time.sleep(0.005)
    dm.prepare_data()
    dm.setup("fit")
    dm.trainer = SimpleNamespace(global_step=0, accumulate_grad_batches=1, world_size=2, global_rank=rank)
    Path(out).write_text(json.dumps({
        "hit": dm.cache_hit, "path": str(dm.cache_path), "mapped": str(dm.train_tokens.filename),
        "digest": hashlib.sha256(dm.train_tokens.tobytes() + dm.val_tokens.tobytes()).hexdigest(),
        "train": [x.tolist() for x, _ in dm.train_dataloader()], "val": [x.tolist() for x, _ in dm.val_dataloader()]}))


def test_two_processes_prepare_one_store_and_read_the_global_stream_as_ddp_ranks(tmp_path: Path):
    """Two processes (the two ranks of a DDP run, forked as trainer=ddp_cpu does, or two runs started together)
    prepare the same corpus at the same moment: one tokenizes, the other waits for it; both map the same token
    files, and the windows they read as ranks 0 and 1 are the global sample stream of one process with twice
    the batch."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(mixed_text(200_000))
    go, cache = tmp_path / "go", tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank, args=(str(corpus), str(go), str(cache), rank, str(tmp_path / f"{rank}.json")))
             for rank in (0, 1)]
    for p in procs:
        p.start()
    time.sleep(0.2)
    go.touch()  # both start preparing now
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(r["hit"] for r in ranks) == [False, True]  # one prepared, the other waited for it
    assert len({r["digest"] for r in ranks}) == 1 and len({r["path"] for r in ranks}) == 1
    assert ranks[0]["mapped"] == ranks[1]["mapped"] == str(Path(ranks[0]["path"]) / "train.bin")
    assert [p.name for p in cache.iterdir()] == [Path(ranks[0]["path"]).name]  # one store, nothing else left

    one = make_dm(corpus, tmp_path, batch_size=8, train_samples=64, val_windows=10)
    assert one.cache_hit and hashlib.sha256(one.train_tokens.tobytes() + one.val_tokens.tobytes()).hexdigest() == \
        ranks[0]["digest"]
    for step, (x, _) in enumerate(one.train_dataloader()):
        assert x.tolist() == ranks[0]["train"][step] + ranks[1]["train"][step]
    assert [w for x, _ in one.val_dataloader() for w in x.tolist()] == [
        w for r in ranks for batch in r["val"] for w in batch]


def test_a_store_changed_in_place_is_caught_by_its_checksum(corpus: Path, tmp_path: Path):
    """Bytes overwritten without changing the file's size, ids still inside the vocabulary: the checksum that
    meta.json recorded differs, and the error names the folder to delete."""
    store = S.prepare_store(spec(corpus), tmp_path)
    ids = np.fromfile(store.path / "train.bin", dtype=np.uint8)
    ids[10:20] = ids[30:40]  # valid ids, wrong text
    ids.tofile(store.path / "train.bin")
    with pytest.raises(DataError, match=r"^token cache '.*' is unreadable \(ValueError: train.bin was changed after "
                                        r"the store was written .*\); delete that folder and run again"):
        S.prepare_store(spec(corpus), tmp_path)


def test_a_big_store_changed_in_place_is_caught_by_the_first_batch_outside_the_vocabulary(corpus, tmp_path,
                                                                                             monkeypatch):
    """Stores above VERIFY_BYTES are not hashed at every start: an id outside the vocabulary is caught before
    the batch reaches the model (an embedding index error otherwise)."""
    dm = make_dm(corpus, tmp_path)
    with open(dm.store.path / "train.bin", "r+b") as f:
        f.write(b"\xff" * (dm.seq_len + 1) * 64)  # the first windows' bytes
    monkeypatch.setattr(S, "VERIFY_BYTES", 0)
    dm = make_dm(corpus, tmp_path)  # opens: sizes check, no hashing
    batch = next(x for x in dm.train_dataloader() if int(x[0].max()) >= dm.vocab_size)
    with pytest.raises(DataError, match=r"holds ids outside the vocabulary of \d+: it was changed after it was "
                                        r"written; delete that folder"):
        dm.on_before_batch_transfer(batch, 0)



def test_the_bpe_trainer_is_fed_one_piece_at_a_time(tmp_path: Path, monkeypatch):
    """tokenizers' trainer holds 256 of the items it is given: an item is one piece of a plain-text file, never a
    batch of them, so what it holds is bounded by the piece size, not by the corpus. The merges are those of the
    whole text."""
    from minillm.training.data import corpus as C
    from minillm.training.data.tokenizer import train_bpe

    monkeypatch.setattr(C, "PIECE_BYTES", 2000)
    (tmp_path / "a.txt").write_text("\n".join(mixed_text(60, s) for s in range(400)))
    spec = S.StoreSpec(C.CorpusSpec(source="files", files=(str(tmp_path / "a.txt"),)), tokenizer="bpe",
                       vocab_size=400)
    docs = C.load_documents(spec.corpus, tmp_path / "work")
    items = list(S.bpe_texts(spec, docs))
    assert len(items) > 20 and all(isinstance(t, str) and len(t.encode()) < 2000 + 400 for t in items)
    whole = train_bpe([items], 400)  # the same texts in one item
    assert whole.hf.to_str() == train_bpe(iter(items), 400).hf.to_str()


@pytest.mark.parametrize(("cores", "threaded", "mb", "expected"), [
    (2, False, 40, 1),   # few cores: one process, whatever the corpus
    (4, False, 40, 4),   # char/byte on a large corpus: the cores
    (16, False, 40, 8),  # at most 8
    (16, False, 1, 1),   # a small corpus: forking costs more than it saves
    (16, True, 40, 1),   # a Hugging Face tokenizer's own threads use every core
])
def test_tokenizing_processes_by_default(monkeypatch, cores, threaded, mb, expected):
    from minillm.training.data.token_files import auto_num_proc

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    ds = datasets.Dataset.from_dict({"text": ["x" * (1 << 20)] * mb})
    assert auto_num_proc(ds, threaded) == expected
