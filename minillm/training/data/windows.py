"""Windows over token arrays (np.memmap of a token store, or any array) and the samplers that share them out.

Batches are tuples `(x, y)` of int64 `(B, T)` with `y[:, t] = x[:, t + 1]` (a window of T + 1 tokens):
  - train: random windows; the start of global sample i is splitmix64(seed, i) mod (#starts), a pure function,
    so a resumed run continues at sample `global_step * batch_size * accumulate_grad_batches * world_size`;
    under DDP each process takes its share of each step's consecutive samples (`StreamSampler`).
  - val/test: consecutive windows at starts 0, T, 2T, ... so every val token is predicted exactly once;
    val may use an evenly spaced subset (`val_windows`), test always uses all of them; under DDP each
    process evaluates a contiguous share, every window once.
A window reads T + 1 tokens from the memory map: processes share the token files through the page cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

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


class _TokenWindows(Dataset):
    """Pickles a memory-mapped token array as its file, not its contents (DataLoader workers started by spawn)."""

    tokens: np.ndarray

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        t = self.tokens
        if isinstance(t, np.memmap) and t.filename is not None:
            state["tokens"] = ("memmap", t.filename, t.dtype.str, t.offset, t.shape)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        t = state["tokens"]
        if isinstance(t, tuple) and t[0] == "memmap":
            state["tokens"] = np.memmap(t[1], dtype=np.dtype(t[2]), mode="r", offset=t[3], shape=t[4])
        self.__dict__.update(state)


def _window(tokens: np.ndarray, start: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.from_numpy(tokens[start : start + seq_len + 1].astype(np.int64))  # (T + 1,)
    return w[:-1], w[1:]


class RandomWindows(_TokenWindows):
    """Global sample index i -> window at `window_starts(seed, [i], N - seq_len)`; any i >= 0 is valid."""

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int) -> None:
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.n_starts = len(tokens) - seq_len  # starts 0 .. N - seq_len - 1 leave room for T + 1 tokens

    def __len__(self) -> int:
        """Nominal size (the number of distinct starts); the train loader's StreamSampler goes beyond it."""
        return self.n_starts

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _window(self.tokens, int(window_starts(self.seed, [i], self.n_starts)[0]), self.seq_len)


class FixedWindows(_TokenWindows):
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


