"""One run, one folder, one process writing it: the run folder's lock, and leaving nothing behind when a start
is refused.

A run holds an exclusive lock (``flock``) on ``<run>/.lock`` from its start to its end, in its first process
(global rank 0; the other DDP processes are part of the same run). A second start in the same folder (two
commands with one ``run_id``, or a resume while the run still trains) is refused with one line instead of
interleaving two runs' checkpoints, metrics and summary. The lock goes with the process, also when it is
killed, so a stale lock never blocks a resume.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from lightning.fabric.utilities.rank_zero import rank_zero_only

from minillm.errors import ConfigError

LOCK = ".lock"
# what a refused start may have written into a fresh run folder: Hydra's files and the console log
START_FILES = {".hydra", "train.log", LOCK}


class RunFolderLock:
    """Holds ``<folder>/.lock`` while a run uses the folder (only in the process of global rank 0)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self._fd: int | None = None

    def acquire(self) -> None:
        if rank_zero_only.rank != 0 or self._fd is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigError(f"the run folder {self.folder} is in use by another run (process {holder}); give this "
                              "run another run_id, or resume it with ckpt_path=auto once that run has ended") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    def __enter__(self) -> RunFolderLock:
        return self  # acquire() inside the block, where its refusal is handled

    def __exit__(self, *exc: object) -> None:
        self.release()


def discard_start(folder: str | os.PathLike, hydra_subdir: str, fresh: bool, log_dir: str | os.PathLike) -> None:
    """After a start was refused (a config error before training): remove what this start wrote. A fresh
    folder that holds only Hydra's files and the console log goes entirely, with the folders above it up to
    ``log_dir`` that it leaves empty; in a folder that holds a run, only this start's ``.hydra/resumed-<time>``."""
    folder, stop = Path(folder).resolve(), Path(log_dir).resolve()
    if not folder.is_dir():
        return
    if fresh and {p.name for p in folder.iterdir()} <= START_FILES:
        shutil.rmtree(folder, ignore_errors=True)
        parent = folder.parent
        while parent != stop and stop in parent.parents:
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break
            parent = parent.parent
    elif hydra_subdir.startswith(".hydra/resumed-"):
        shutil.rmtree(folder / hydra_subdir, ignore_errors=True)
