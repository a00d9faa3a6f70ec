"""Helpers shared by the training tests: a tiny corpus and composed real configs."""

from __future__ import annotations

import csv
import random
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

WORDS = ("the king and queen of love shall come to night with fair sweet words my lord "
         "thou art what is this now good sir I will not be so").split()


def write_corpus(path: Path, n_chars: int = 30_000, seed: int = 0) -> Path:
    """Generate a small English-like text file (no network, nothing committed)."""
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))).capitalize() + "."
        lines.append(line)
        size += len(line) + 1
    path.write_text("\n".join(lines) + "\n")
    return path


TINY = [
    "model=tiny",
    "data=files",
    "data.batch_size=8",
    "data.val_windows=8",
    "trainer=cpu",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.log_every_n_steps=1",
    "scheduler.warmup_steps=1",
    "++callbacks.text_sample.max_new_tokens=8",
    "logger=csv",
]


def compose_cfg(tmp_path: Path, corpus: Path, *overrides: str) -> DictConfig:
    """Compose configs/train.yaml as train.py would, with outputs under tmp_path."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[*TINY, f"data.files=[{corpus}]", *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
        cfg.paths.log_dir = str(tmp_path / "logs")
        cfg.paths.cache_dir = str(tmp_path / "cache")
        del cfg["hydra"]  # as in a real run, where @hydra.main hands over the job config without it
    return cfg


def read_rows(run_dir: Path) -> list[dict]:
    """The rows of a run's csv/metrics.csv (Lightning's CSVLogger: sparse, one row per log call)."""
    with open(Path(run_dir) / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def logged(rows: list[dict], key: str) -> dict[int, float]:
    """step -> value of one metric."""
    return {int(r["step"]): float(r[key]) for r in rows if r.get(key)}
