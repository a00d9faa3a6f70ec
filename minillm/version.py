"""The version of minillm (its one source: pyproject.toml reads it from here) and where a run's code came from."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

__version__ = "0.3.0"


@cache
def provenance() -> dict[str, str | bool | None]:
    """minillm's version, the git commit of the checkout it runs from (None when installed from a wheel), and the
    numeric environment: torch's version and the CPU kernels it dispatches to (AVX2, AVX512, ...). Recorded in
    summary.json, the W&B config and every checkpoint. The same code and seed give bit-identical losses only
    under the same torch and CPU capability; another vector ISA rounds differently and moves a run's losses by a
    few thousandths of a nat (README, "The default run")."""
    import torch

    root = Path(__file__).resolve().parents[1]
    commit, dirty = None, None
    if (root / ".git").exists():
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        try:
            commit = git("rev-parse", "HEAD")
            dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        except (OSError, subprocess.SubprocessError):
            pass
    return {"minillm_version": __version__, "git_commit": commit, "git_dirty": dirty,
            "torch_version": str(torch.__version__), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
