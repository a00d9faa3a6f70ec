"""Where minillm's files are, and the names a sweep's runs share: plain Python (no Hydra, no Lightning), so the
analysis floor can ask without loading the training stack."""

from __future__ import annotations

from pathlib import Path


def config_dir() -> str:
    """configs/ of the checkout (or of an editable install), else the copy a wheel ships in the package."""
    package = Path(__file__).resolve().parent
    packaged = package / "configs"
    return str(packaged if packaged.is_dir() else package.parent / "configs")


def sweep_group(name: str, sweep_dir: str | Path) -> str:
    """The W&B group of a sweep's runs: ``<name>-<sweep folder>`` (a run outside a sweep is in group ``name``)."""
    return f"{name}-{Path(sweep_dir).name}"
