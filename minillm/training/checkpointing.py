"""What Lightning lacks for trustworthy checkpoints: atomic files, readable errors for bad ones, the checks
before resuming (same model, same training settings), and finding the checkpoint to resume a run from.

Lightning already restores the optimizer, LR scheduler, loop counters, RNG-free data stream
(minillm/training/data/windows.py),
GradScaler and buffers such as BatchNorm running statistics; docs/reliability.md lists what rests on what.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
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


def _unreadable(path: Any, err: BaseException) -> CheckpointError:
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return CheckpointError(
        f"checkpoint {str(path)!r} cannot be read ({type(err).__name__}: {reason[:200]}); it is truncated "
        "(a save cut short) or not a checkpoint written by torch.save"
    )


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
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        raise _unreadable(file, err) from err
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
            ckpt = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist") from err
        except Exception as err:
            raise _unreadable(path, err) from err
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
