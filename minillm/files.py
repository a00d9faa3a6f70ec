"""Writing what a run leaves: strict JSON (a non-finite number is null) written whole or not at all. Plain Python
(a one-element tensor is read by duck typing, so the analysis floor can use this without torch)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def json_safe(value: Any) -> Any:
    """Strict JSON: non-finite floats become null, one-element tensors numbers, mappings dicts (string keys),
    sequences lists, other objects strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if hasattr(value, "numel") and hasattr(value, "item"):  # a tensor
        return json_safe(value.item()) if value.numel() == 1 else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [json_safe(v) for v in value]
    return str(value)


def write_json(path: str | Path, data: Any, indent: int = 2) -> Path:
    """``data`` as strict JSON at ``path``, written to a temporary file and renamed over it (atomic on POSIX), so a
    crash or a full disk leaves the previous file, never half a new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(json_safe(data), indent=indent) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
