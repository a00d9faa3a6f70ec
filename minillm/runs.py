"""A sweep on disk: the run folders under a folder (their summary.json, their logged curves) and the grouping of
runs by config values that the report's table and the comparison engine share."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


def find_runs(sweep_dir: str | Path, replays: bool = False) -> list[Run]:
    """Every folder under sweep_dir (itself included) holding a summary.json, in path order; a replay
    (minillm-replay: a summary.json with a ``replay`` record, in <run>/replays/) only with ``replays=True``."""
    paths = sorted(Path(sweep_dir).rglob("summary.json"))
    runs = [Run(p.parent, json.loads(p.read_text())) for p in paths]
    return [r for r in runs if replays or "replay" not in r.summary]


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


def load_runs(sweep_dirs: str | Path | Sequence[str | Path]) -> list[Run]:
    """Every run under the sweep folders (preempted ones included); FileNotFoundError when there is none."""
    dirs = [sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else list(sweep_dirs)
    found = [run for d in dirs for run in find_runs(d)]
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


WINDOW_FILES = {"final_val_loss": "val_windows.npy", "test_loss": "test_windows.npy"}  # metric -> LitLM's file


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
