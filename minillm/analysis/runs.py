"""A sweep on disk: the run folders under a folder (their summary.json, their logged curves) and the grouping of
runs by config values that the report's table and the comparison engine share."""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minillm import schema


@dataclass
class Run:
    """One run folder: its summary and (read on demand) its logged curves."""

    dir: Path
    summary: dict[str, Any]
    _curves: dict[str, list[tuple[int, float]]] | None = field(default=None, repr=False)

    @property
    def curves(self) -> dict[str, list[tuple[int, float]]]:
        if self._curves is None:
            self._curves = read_curves(self.dir / "csv" / "metrics.csv")
        return self._curves

    def get(self, key: str) -> Any:
        return self.summary.get(key)


class RunsError(ValueError):
    """A run folder that cannot be read; the message names the file."""


def read_summary(path: Path) -> dict[str, Any]:
    """A summary.json as a dict; RunsError naming the file when it is not one (truncated, edited, unreadable, or
    not a run's by minillm.schema: a required field missing, a field of another type)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise RunsError(f"{path}: not a readable summary.json ({type(err).__name__}: {' '.join(str(err).split())})"
                        ) from None
    if not isinstance(summary, dict):
        raise RunsError(f"{path}: not a readable summary.json (a JSON {type(summary).__name__}, not an object)")
    if wrong := schema.problems(summary):
        raise RunsError(f"{path}: not a readable summary.json ({'; '.join(wrong)}: minillm.schema's fields)")
    return summary


def find_runs(sweep_dir: str | Path, replays: bool = False, bad: list[str] | None = None) -> list[Run]:
    """Every folder under sweep_dir (itself included) holding a summary.json, in path order; a replay
    (minillm-replay: a summary.json with a ``replay`` record, in <run>/replays/) only with ``replays=True``.
    A summary.json that cannot be read is RunsError, or, given a ``bad`` list, its message goes there and the
    folder is skipped."""
    runs = []
    for path in sorted(Path(sweep_dir).rglob("summary.json")):
        try:
            runs.append(Run(path.parent, read_summary(path)))
        except RunsError as err:
            if bad is None:
                raise
            bad.append(str(err))
    return [r for r in runs if replays or "replay" not in r.summary]


LOCK = ".lock"  # what a run holds while it trains (minillm.training.run.folder)
FINISHED_FILES = ("summary.json", "evaluation.json")


def lock_held(path: Path) -> bool:
    """Whether a process holds the run folder's lock file (an flock, minillm.training.run.folder), i.e. the run is
    running."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock taken for the test
    return False


def unfinished(sweep_dirs: str | Path | Sequence[str | Path]) -> list[str]:
    """Run folders under the sweep folders that have not ended: a run's lock is held (it trains now), or the folder
    holds a run (its lock file) but no summary.json yet (it trains, or was killed before writing one)."""
    dirs = [sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else list(sweep_dirs)
    found = []
    for lock in sorted({p for d in dirs for p in Path(d).rglob(LOCK)}):
        folder = lock.parent
        if lock_held(lock) or not any((folder / f).exists() for f in FINISHED_FILES):
            found.append(str(folder))
    return found


def read_curves(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] from a Lightning CSVLogger file (sparse rows; 'nan' kept as NaN)."""
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    if not path.exists():
        return curves
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = row.get("step")
            if not step:
                continue
            for key, value in row.items():
                if key not in ("step", "epoch") and value not in (None, ""):
                    curves[key].append((int(float(step)), float(value)))
    return curves


def load_runs(sweep_dirs: str | Path | Sequence[str | Path], bad: list[str] | None = None) -> list[Run]:
    """Every run under the sweep folders (preempted ones included); FileNotFoundError when there is none; a
    summary.json that cannot be read as find_runs says."""
    dirs = [sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else list(sweep_dirs)
    found = [run for d in dirs for run in find_runs(d, bad=bad)]
    if not found:
        raise FileNotFoundError(f"no summary.json under {', '.join(map(str, dirs))}")
    return found


def label(value: Any) -> str:
    """A value as the command line and the tables write it (dicts as JSON, floats as %g)."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def hashable(value: Any) -> Any:
    """Dict and list values (e.g. norm_options) as their JSON text, so they can form a group key."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def sort_key(value: Any) -> tuple:
    """Numbers first, in order, then everything else by its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, str(value))


def group_runs(runs: Iterable[Any], keys: Sequence[str]) -> dict[tuple, list[Any]]:
    """Runs (Run objects or summary dicts: anything with ``get``) by their values of keys, in sort_key order."""
    groups: dict[tuple, list[Any]] = defaultdict(list)
    for r in runs:
        groups[tuple(hashable(r.get(k)) for k in keys)].append(r)
    return dict(sorted(groups.items(), key=lambda kv: [sort_key(v) for v in kv[0]]))


# metric -> LitLM's file of per-window losses
WINDOW_FILES = {schema.FINAL_VAL_LOSS: "val_windows.npy", schema.TEST_LOSS: "test_windows.npy"}


def eval_windows(record: dict[str, Any], metric: str) -> list[float] | None:
    """The per-window losses behind a run's ``metric`` (final_val_loss: the last validation's, test_loss: the test
    pass's): ``record["val_windows"]`` / ``record["test_windows"]`` when the record carries them, else the .npy
    LitLM saved in the run folder (``run_dir``); None for another metric or when neither exists."""
    name = WINDOW_FILES.get(metric)
    if name is None:
        return None
    given = record.get(name.removesuffix(".npy"))
    if given is not None:
        return [float(v) for v in given]
    folder = record.get("run_dir")
    path = Path(folder) / name if folder else None
    if path is None or not path.exists():
        return None
    import numpy as np

    return [float(v) for v in np.load(path)]


# --- records: what the comparison engine reads of each run ---------------------------------------------------


def flat_settings(settings: Mapping | None, prefix: str = "settings.") -> dict[str, Any]:
    """summary.json's nested ``settings`` as dotted keys (settings.optimizer.betas: [0.9, 0.95])."""
    out: dict[str, Any] = {}
    for key, value in (settings or {}).items():
        if isinstance(value, Mapping) and value:
            out.update(flat_settings(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def records_of(runs: Iterable[Any]) -> list[dict]:
    """summary dicts from summary dicts or Run objects. A Run's files are read from its folder (``run_dir`` is the
    folder its summary.json is in, never the path the summary recorded: a copied or moved sweep reads its own
    files); the recorded one is kept as ``recorded_run_dir``. ``settings`` are added as dotted keys."""
    out = []
    for run in runs:
        summary = getattr(run, "summary", run)
        folder = getattr(run, "dir", None)
        record = {**summary, **flat_settings(summary.get("settings")), "recorded_run_dir": summary.get("run_dir")}
        record["run_dir"] = str(folder) if folder is not None else summary.get("run_dir")
        if folder is not None:
            record["run_path"] = os.path.realpath(folder)
        out.append(record)
    return out


def _identities(record: Mapping) -> set:
    """What identifies a run: its folder's real path, and the folder and start time its summary recorded (a copy)."""
    ids = {("path", record["run_path"])} if record.get("run_path") else set()
    if record.get("recorded_run_dir") and record.get("started_at"):
        ids.add(("run", record["recorded_run_dir"], record["started_at"]))
    return ids


def _first_listings(records: Sequence[Mapping]) -> list[bool]:
    seen: set = set()
    first = []
    for r in records:
        ids = _identities(r)
        first.append(not ids & seen)
        seen |= ids
    return first


def without_duplicates(records: Sequence[dict]) -> tuple[list[dict], list[str]]:
    """The records with each run once: the same folder (its real path) or a copy of it (the same recorded folder
    and start time) listed again is left out; returns (records, the folders left out)."""
    first = _first_listings(records)
    return ([r for r, f in zip(records, first, strict=True) if f],
            [str(r.get("run_dir")) for r, f in zip(records, first, strict=True) if not f])


def distinct_runs(runs: Sequence[Run]) -> tuple[list[Run], list[str]]:
    """The runs with each once (without_duplicates' rule), and the folders left out."""
    first = _first_listings(records_of(runs))
    return ([r for r, f in zip(runs, first, strict=True) if f],
            [str(r.dir) for r, f in zip(runs, first, strict=True) if not f])
