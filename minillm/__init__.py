"""minillm: a small LLaMA-style decoder for comparing normalization choices.

The package is built in floors, each importing only the ones below it:

- core (this folder): the model, norms/, kernels/, placements, generation, forensics, metric names, errors,
  outcomes, the schema of what a run leaves;
- ``minillm.training``: the Hydra job, the LightningModule, callbacks, data, optimizers, checkpoints, loggers;
- ``minillm.analysis``: finished runs, reports and comparisons (no torch, no Lightning);
- ``minillm.tools``: the command-line tools beside train.py.

``from minillm import Transformer`` still works; the names are imported on first use, so ``import minillm`` (and
``minillm.analysis``) loads no torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from minillm.version import __version__

_LAZY = {"ModelConfig": "minillm.model", "Transformer": "minillm.model", "NORMS": "minillm.norms",
         "build_norm": "minillm.norms"}

__all__ = ["NORMS", "ModelConfig", "Transformer", "__version__", "build_norm"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'minillm' has no attribute {name!r}")
