"""What Lightning lacks for trustworthy checkpoints: atomic files, readable errors for bad ones, the checks
before resuming (same model, same training settings), and finding the checkpoint to resume a run from.

Lightning already restores the optimizer, LR scheduler, loop counters, RNG-free data stream
(minillm/training/data/windows.py),
GradScaler and buffers such as BatchNorm running statistics; docs/reliability.md lists what rests on what.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import re
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import torch
from lightning.pytorch.plugins import TorchCheckpointIO

from minillm.errors import CheckpointError, writing
from minillm.model import ModelConfig
from minillm.norms import canonical_norms
from minillm.training.optim import schedule_settings

log = logging.getLogger("minillm")



# --- checkpoint files ---------------------------------------------------------------------------------


ZIP_MAGIC = b"PK\x03\x04"  # how every file torch.save writes (its zip format) begins


def _is_text(head: bytes) -> bool:
    if not head or b"\x00" in head:
        return False
    for cut in range(4):  # the head may end inside a multi-byte character
        try:
            head[:len(head) - cut].decode("utf-8")
            return True
        except UnicodeDecodeError:
            pass
    return False


def _first_sentence(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    text = text.split(". ")[0].rstrip(".")
    return text if len(text) <= 160 else text[:160].rsplit(" ", 1)[0] + " ..."


def unreadable(path: Any, err: BaseException) -> CheckpointError:
    """The one line for a file that torch.load (weights only) cannot read, told from the file itself: empty, a
    pickle whose objects the weights-only reader refuses (a payload: none of it ran), a zip archive cut short,
    text, or something else (the error's first sentence)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        head = b""
    call = re.search(r"GLOBAL (\S+)", str(err))
    refused = isinstance(err, pickle.UnpicklingError) and (  # torch's weights-only reader refused what it asks for
        call or head.startswith(ZIP_MAGIC) or head[:1] == b"\x80")  # a call, or a binary pickle (not text)
    if not head:
        why = "is empty (0 bytes), not a checkpoint"
    elif refused:
        detail = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", str(err))
        what = f"a call of {call.group(1)}" if call else detail.group(1).rstrip(".") if detail else "objects"
        why = (f"is refused unread: it is a pickle that asks for more than tensors and plain values ({what}), which "
               "minillm never loads, so nothing of it ran; allowed: a checkpoint minillm wrote")
    elif head.startswith(ZIP_MAGIC):  # torch's zip format, cut short (no central directory, or no archive at all)
        why = "is truncated: its zip archive has no end (a save or a copy cut short)"
    elif _is_text(head):
        why = "is a text file, not a checkpoint"
    else:
        why = f"is not a checkpoint written by torch.save ({type(err).__name__}: {_first_sentence(err)})"
    return CheckpointError(f"checkpoint {str(path)!r} {why}")


@contextlib.contextmanager
def quiet_reader() -> Iterator[None]:
    """Without the weights-only reader's note on a pickle protocol it may not follow (the error line says more)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        yield


def load_weights_only(path: str | os.PathLike, mmap: bool = False) -> Any:
    """torch.load of tensors and plain values only (a pickle payload is refused, never run); ``mmap``: tensors are
    not read (a file in torch's zip format; an older format is read whole). CheckpointError (unreadable) when the
    file is not a checkpoint."""
    try:
        with open(path, "rb") as f:
            mmap = mmap and f.read(4) == ZIP_MAGIC
        with quiet_reader():
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:
        raise unreadable(path, err) from err


def _check_is_lightning(path: Any, ckpt: Any) -> dict:
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"checkpoint {str(path)!r} is not a Lightning checkpoint (no 'state_dict')")
    return ckpt


def read_checkpoint_header(path: str | os.PathLike, field: str = "ckpt_path") -> dict:
    """The checkpoint as a dict, memory-mapped (tensors are not read): cheap access to hyper_parameters.
    For a sharded (FSDP) checkpoint directory, its metadata file (no state_dict). ``field`` names the option or
    argument the path came from in the errors."""
    sharded = Path(path).is_dir()
    file = Path(path) / "meta.pt" if sharded else Path(path)
    if sharded and not file.is_file():
        inside = sorted(Path(path).glob("**/*.ckpt"))[:3]
        hint = f", e.g. {', '.join(map(str, inside))}" if inside else ""
        raise CheckpointError(f"{field}={str(path)!r} is a folder, not a checkpoint: give a .ckpt file{hint}")
    if not file.is_file():
        raise CheckpointError(f"{field}={str(path)!r} does not exist")
    ckpt = load_weights_only(file, mmap=True)
    return ckpt if sharded else _check_is_lightning(path, ckpt)


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose local saves never leave a half-written file at the target path.

    torch.save writes ``.<name>.tmp-<pid>-<rand>`` in the target's directory, the file is fsynced, then
    ``os.replace`` renames it over the target (atomic on POSIX within one filesystem). A crash or kill during
    a save leaves the previous checkpoint untouched. (Lightning's own save stages the file in the system temp
    dir and moves it, which is a copy, not a rename, when /tmp is another filesystem.) Remote (fsspec) paths
    use Lightning's save. Loading wraps read errors in a CheckpointError that names the file.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or fsspec.utils.get_protocol(str(path)) != "file":
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            with writing(path), open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        try:  # make the rename itself durable
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass

    def load_checkpoint(self, path: Any, map_location: Any = lambda storage, loc: storage,
                        weights_only: bool | None = None) -> dict[str, Any]:
        try:
            with quiet_reader():
                ckpt = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist") from err
        except Exception as err:
            raise unreadable(path, err) from err
        return _check_is_lightning(path, ckpt)


# --- resuming with the same model ---------------------------------------------------------------------


_FIELD_DEFAULTS = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                   for f in dataclasses.fields(ModelConfig)
                   if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


def _canonical(model: dict) -> dict:
    """The norms by canonical name (fused_rmsnorm is rmsnorm: minillm.norms.canonical_norm); norm_options.sync
    (pool BatchNorm statistics over DDP processes) and norm_impl (how the same function is computed) change
    neither the weights nor the function."""
    out = canonical_norms({**_FIELD_DEFAULTS, **model})  # a field added since: its default
    out.pop("norm_impl", None)
    if isinstance(out.get("norm_options"), dict):
        out["norm_options"] = {k: v for k, v in out["norm_options"].items() if k != "sync"}
    return out


def config_diff(saved: dict, current: dict) -> list[str]:
    """``"key: checkpoint X, config Y"`` for each key whose value differs (a key one side lacks is <absent>)."""
    missing = "<absent>"
    return [f"{k}: checkpoint {saved.get(k, missing)!r}, config {current.get(k, missing)!r}"
            for k in sorted(set(saved) | set(current)) if saved.get(k, missing) != current.get(k, missing)]


def model_config_diff(saved: dict, current: dict) -> list[str]:
    """config_diff of two ModelConfig dicts, their norms by canonical name (see _canonical)."""
    return config_diff(_canonical(saved), _canonical(current))


def check_model_config(saved: dict | None, current: dict, source: str = "the checkpoint") -> None:
    """Raise CheckpointError listing every difference between the checkpoint's model config and this one."""
    if saved is None:
        raise CheckpointError(f"{source} has no hyper_parameters['model']: not a minillm checkpoint")
    diffs = model_config_diff(saved, current)
    if diffs:
        raise CheckpointError(
            f"{source} was trained with a different model config ({'; '.join(diffs)}); resume with the "
            "checkpoint's settings or start a new run without ckpt_path"
        )


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys: {"optimizer": {"lr": 1}} -> {"optimizer.lr": 1}."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def check_settings(saved: dict | None, current: dict, source: str = "the checkpoint") -> None:
    """Raise CheckpointError listing every training setting (``hyper_parameters["run_settings"]``) that differs;
    a checkpoint that records none passes."""
    if saved is None:
        return
    saved = {**saved, "scheduler": schedule_settings(saved.get("scheduler"))}  # as run_settings stores it now
    diffs = config_diff(flatten(saved), flatten(current))
    if diffs:
        raise CheckpointError(
            f"{source} was trained with other settings ({'; '.join(diffs)}); a resumed run must keep them: "
            "resume with the checkpoint's settings, or start a new run without ckpt_path")


RESUME_FILES = ("preempted.ckpt", "last.ckpt")  # what ckpt_path=auto looks for in <run dir>/checkpoints


def find_resume_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint ``ckpt_path=auto`` resumes from: of ``<run_dir>/checkpoints/{preempted,last}.ckpt``, the
    readable one with the most steps (ties: the newer file); None when there is none. Unreadable files (a save
    cut short) are skipped with a warning."""
    found = []
    for name in RESUME_FILES:
        path = Path(run_dir) / "checkpoints" / name
        if not path.is_file():
            continue
        try:
            step = int(read_checkpoint_header(path).get("global_step", 0))
        except CheckpointError as err:
            log.warning(f"ckpt_path=auto: skipping {path}: {err}")
            continue
        found.append((step, path.stat().st_mtime, path))
    return max(found)[2] if found else None
