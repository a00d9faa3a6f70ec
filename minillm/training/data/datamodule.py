"""TextDataModule: a token store (prepared once, memory-mapped) -> train/val/test windows for Lightning."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from minillm.errors import ConfigError, DataError, check_bool, check_int, invalid
from minillm.outcome import unigram_loss
from minillm.training.data.corpus import SOURCES, CorpusSpec
from minillm.training.data.store import StoreSpec, TokenStore, prepare_store
from minillm.training.data.tokenizer import Tokenizer, check_tokenizer_spec, tokenizer_from_state
from minillm.training.data.windows import FixedWindows, RandomWindows, ResumableLoader, StreamSampler, eval_starts

log = logging.getLogger("minillm.training.data")
COUNT_CHUNK = 1 << 22  # tokens per np.bincount when counting unigrams (bounded memory on big corpora)


def _positive_int(field: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        allowed = "an int > 0" + (" or null" if optional else "")
        raise ConfigError(f"data.{field}={value!r} is invalid; allowed: {allowed}")


def _optional_str(field: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"data.{field}={value!r} is invalid; allowed: a name or null")


def _counts(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """(V,) int64 token counts, in chunks (np.bincount converts its input to int64)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, len(tokens), COUNT_CHUNK):
        counts += np.bincount(tokens[i : i + COUNT_CHUNK], minlength=vocab_size)
    return counts


class TextDataModule(L.LightningDataModule):
    """LM data from Shakespeare, local files or a hub dataset, tokenized by char, byte, a trained BPE or any
    Hugging Face tokenizer into a token store (minillm.training.data.store); windows as in
    minillm.training.data.windows."""

    def __init__(
        self,
        source: str = "shakespeare",
        files: Sequence[str] | str | None = None,
        hub_name: str | None = None,
        hub_config: str | None = None,
        hub_split: str = "train",
        hub_revision: str | None = None,
        hub_val_split: str | None = "auto",
        streaming: bool = False,
        text_column: str = "text",
        tokenizer: str = "char",
        vocab_size: int = 4096,
        bpe_train_bytes: int | None = None,
        seq_len: int = 256,
        batch_size: int = 32,
        val_fraction: float = 0.1,
        val_windows: int | None = None,
        max_tokens: int | None = None,
        num_workers: int = 0,
        num_proc: int | None = None,
        cache_dir: str = "~/.cache/minillm",
        seed: int = 0,
        train_samples: int | None = None,
        sample_prompt: str | None = None,
    ) -> None:
        super().__init__()
        if source not in SOURCES:
            raise ConfigError(f"data.source={source!r} is unknown; allowed: {list(SOURCES)}")
        check_tokenizer_spec(tokenizer)
        _positive_int("seq_len", seq_len)
        _positive_int("batch_size", batch_size)
        _positive_int("val_windows", val_windows, optional=True)
        _positive_int("train_samples", train_samples, optional=True)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"data.num_workers={num_workers!r} is invalid; allowed: an int >= 0")
        is_number = isinstance(val_fraction, (int, float)) and not isinstance(val_fraction, bool)
        if not is_number or not 0 < val_fraction < 1:
            raise invalid("data.val_fraction", val_fraction, "a float in (0, 1)")
        if tokenizer == "bpe":
            check_int("data.vocab_size", vocab_size, low=257)  # 256 bytes + the end-of-document token
        check_int("data.bpe_train_bytes", bpe_train_bytes, low=1, optional=True)
        check_int("data.max_tokens", max_tokens, low=2, optional=True)
        check_int("data.num_proc", num_proc, low=1, optional=True)
        check_bool("data.streaming", streaming)
        for name, value in (("hub_config", hub_config), ("hub_revision", hub_revision),
                            ("hub_val_split", hub_val_split)):
            _optional_str(name, value)
        for name, value in (("hub_split", hub_split), ("text_column", text_column)):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"data.{name}={value!r} is invalid; allowed: a name")
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
        if streaming and source != "hub":
            raise ConfigError(f"data.streaming=true is invalid with data.source={source}; allowed: false "
                              "(streaming reads hub datasets)")
        if streaming and tokenizer == "char":
            raise ConfigError("data.tokenizer=char is invalid with data.streaming=true (its vocabulary needs the "
                              "whole corpus first); allowed: byte, bpe, a tokenizer.json or hf:<name>")
        if sample_prompt is not None and not isinstance(sample_prompt, str):
            raise ConfigError(f"data.sample_prompt={sample_prompt!r} is invalid; allowed: a string or null")
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
        self._sample_prompt = sample_prompt
        corpus = CorpusSpec(source, tuple(files) if files else None, hub_name, hub_config, hub_split, hub_revision,
                            hub_val_split, text_column, streaming, "replace" if tokenizer == "byte" else "strict")
        self.spec = StoreSpec(corpus, tokenizer, vocab_size, self.val_fraction, max_tokens, bpe_train_bytes,
                              num_proc)
        self.store: TokenStore | None = None
        self.tokenizer: Tokenizer | None = None
        self.train_tokens: np.ndarray | None = None  # (N_train,) np.memmap, compact unsigned dtype
        self.val_tokens: np.ndarray | None = None  # (N_val,)
        self.train_set: RandomWindows | None = None  # set in setup()
        self.val_set: FixedWindows | None = None  # the windows val/loss is taken over
        self.test_set: FixedWindows | None = None  # every val window
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
        """Cross entropy (nats/token) of the validated targets (the next tokens of the val windows, the tokens
        val/loss averages over) under the train split's token frequencies with add-one smoothing: what a model
        that ignores all context scores on the same tokens. A run that ends above it failed (minillm.outcome)."""
        if self._unigram_loss is None:
            if self.val_set is None:
                raise RuntimeError("call prepare_data() and setup() first")
            starts, t, val = self.val_set.starts, self.seq_len, self.val_tokens
            if np.array_equal(starts, np.arange(len(starts)) * t):  # every window: one run of targets, not copied
                targets = val[1 : len(starts) * t + 1]
            else:
                targets = val[(starts[:, None] + np.arange(1, t + 1)).ravel()]
            self._unigram_loss = unigram_loss(_counts(self.train_tokens, self.vocab_size),
                                              _counts(targets, self.vocab_size))
        return self._unigram_loss

    def _load_tokens(self) -> None:
        if self.train_tokens is not None:
            return
        from_checkpoint = self.tokenizer  # set by load_state_dict before setup, if at all
        store = self.store = prepare_store(self.spec, self.cache_dir)
        self.tokenizer, self.train_tokens, self.val_tokens = store.tokenizer, store.train, store.val
        self.cache_path, self.cache_hit = store.path, store.hit
        log.info("data: %s -> %s train + %s val %s tokens, vocab %d, token store %s %s", self.source,
                 f"{len(store.train):,}", f"{len(store.val):,}", self.tokenizer.kind, self.vocab_size,
                 "hit" if store.hit else "written", store.path)
        _check_same_tokenizer(from_checkpoint, self.tokenizer)

    @property
    def sample_prompt(self) -> str:
        """Where generated samples start on this corpus: ``data.sample_prompt``, else the held-out split's
        first line (at most 16 tokens), which any tokenizer of this corpus can encode."""
        if self._sample_prompt is not None:
            return self._sample_prompt
        text = self.tokenizer.decode(self.val_tokens[:16].tolist())
        return text.split("\n")[0] or text

    def prepare_data(self) -> None:
        self._load_tokens()  # prepares the token store once; other processes wait for it, then open it

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

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Every id is in the vocabulary (an id outside it means the token store was changed on disk)."""
        x, y = batch
        if int(torch.maximum(x.max(), y.max())) >= self.vocab_size:
            raise DataError(f"token cache {str(self.cache_path)!r} holds ids outside the vocabulary of "
                            f"{self.vocab_size}: it was changed after it was written; delete that folder and run "
                            "again (it is rebuilt from the corpus)")
        return batch

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
        """The validation windows; when the trainer overfits (trainer.overfit_batches, debug=overfit), the train
        stream's first batches, the ones it trains on: its val loss is the memorized batch's, which must fall (the
        held-out windows' loss rises as the model memorizes, and the run would read as diverged)."""
        if getattr(getattr(self, "trainer", None), "overfit_batches", 0):
            return self._loader(self.train_set, shuffle=False)
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
