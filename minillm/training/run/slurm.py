"""A sweep on SLURM (``hydra/launcher=slurm``): what the cluster offers, checked at submission, and the jobs watched
without sacct.

    cpus_per_task  ``threads`` plus the DataLoader workers (8 when ``threads`` is null), at most what a node of
                   the partition has for each task (from ``sinfo``): on a 2-CPU node a job asks 2, not 8 (it would
                   wait forever)
    at submission  ``SlurmSubmission`` (a Hydra callback, configs/hydra/default.yaml) compares the preset's request
                   (partition, nodes, CPUs, GPUs, memory) with what ``sinfo`` says the partition has; what it cannot
                   give is one line naming the setting (``hydra.launcher.<key>``), exit code 2, nothing submitted
    while waiting  ``slurm_queue.QueueWatcher`` replaces submitit's job watcher: where ``sacct`` answers nothing
                   (no accounting) job states come from ``squeue`` instead of submitit's warning every few seconds,
                   a job that ended without a result is seen as ended, and a pending job says why (squeue's
                   reason) once per reason

Nothing here runs without SLURM's tools: with no ``sinfo`` the request is submitted as it is.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from minillm.errors import ConfigError

log = logging.getLogger("minillm")

@dataclass(frozen=True)
class Partition:
    """What the nodes of a SLURM partition have (the largest node when they differ)."""

    name: str
    nodes: int
    cpus: int
    mem_mb: int
    gpus: int


def run_tool(*command: str) -> str | None:
    """A SLURM command's stdout, or None when the tool is missing or no cluster answers."""
    if shutil.which(command[0]) is None:
        return None
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _number(text: str) -> int:
    found = re.match(r"\d+", text)
    return int(found.group()) if found else 0


def _gpus(gres: str) -> int:
    """GPUs in sinfo's %G (``gpu:4``, ``gpu:a100:4(S:0-1)``, ``(null)``)."""
    return sum(int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres))


@cache
def partitions() -> dict[str, Partition] | None:
    """Every partition sinfo lists, the default one also under the key ``""``; None without a cluster."""
    out = run_tool("sinfo", "-h", "-o", "%P|%D|%c|%m|%G")
    if out is None:
        return None
    found: dict[str, Partition] = {}
    for line in out.splitlines():
        name, nodes, cpus, mem, gres = (line.split("|") + [""] * 5)[:5]
        key = name.rstrip("*")
        old = found.get(key, Partition(key, 0, 0, 0, 0))
        part = Partition(key, old.nodes + _number(nodes), max(old.cpus, _number(cpus)),
                         max(old.mem_mb, _number(mem)), max(old.gpus, _gpus(gres)))
        found[key] = part
        if name.endswith("*"):
            found[""] = part
    return found


def partition(name: Any) -> Partition | None:
    """The partition a job would run in (None: no cluster answers, or no such partition)."""
    known = partitions()
    return None if known is None else known.get("" if name in (None, "") else str(name))


DEFAULT_CPUS = 8  # CPUs per task when ``threads`` is null: torch's threads then take what the task gets


def slurm_cpus(threads: Any, workers: Any, partition_name: Any, tasks_per_node: Any) -> Any:
    """``${minillm.slurm_cpus:${threads},<loader workers>,<partition>,<tasks per node>}``: a task's CPUs, its torch
    threads plus its DataLoader workers (8 when ``threads`` is null), at most a node's CPUs shared by its tasks."""
    fixed = isinstance(threads, int) and not isinstance(threads, bool) and threads > 0
    wanted = threads + (workers if isinstance(workers, int) and workers > 0 else 0) if fixed else DEFAULT_CPUS
    part = partition(partition_name)
    if part is None or not isinstance(tasks_per_node, int) or tasks_per_node < 1:
        return wanted
    return max(1, min(wanted, part.cpus // tasks_per_node))


def shortfalls(launcher: DictConfig) -> list[str]:
    """What the partition cannot give of the launcher's request (empty when it can, or nothing answers)."""
    known = partitions()
    if known is None:
        return []
    name = launcher.get("partition")
    part = partition(name)
    if part is None:
        listed = ", ".join(sorted(k for k in known if k)) or "none"
        what = f"hydra.launcher.partition={name}" if name else "the default partition"
        return [f"{what} is not a partition of this cluster (sinfo lists: {listed})"]
    tasks, cpus = launcher.get("tasks_per_node") or 1, launcher.get("cpus_per_task") or 1
    gpus, nodes, mem_gb = launcher.get("gpus_per_node") or 0, launcher.get("nodes") or 1, launcher.get("mem_gb")
    where = f"partition {part.name}"
    out = []
    if nodes > part.nodes:
        out.append(f"hydra.launcher.nodes={nodes} (trainer.num_nodes): {where} has {part.nodes} node(s)")
    if tasks * cpus > part.cpus:
        out.append(f"hydra.launcher.cpus_per_task={cpus} x tasks_per_node={tasks}: a node of {where} has "
                   f"{part.cpus} CPUs")
    if gpus > part.gpus:
        out.append(f"hydra.launcher.gpus_per_node={gpus} (trainer.devices): a node of {where} has {part.gpus} GPUs")
    if mem_gb and mem_gb * 1024 > part.mem_mb:
        out.append(f"hydra.launcher.mem_gb={mem_gb}: a node of {where} has {part.mem_mb / 1024:.1f} GB")
    return out


def is_slurm_launcher(target: Any) -> bool:
    return str(target).endswith("submitit_launcher.SlurmLauncher")


class SlurmSubmission(Callback):
    """Hydra callback: before a SLURM sweep submits, refuse in one line what the cluster cannot give (exit code 2,
    nothing submitted), and watch the jobs with QueueWatcher."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        launcher = config.hydra.launcher
        if not is_slurm_launcher(launcher.get("_target_")):
            return
        missing = shortfalls(launcher)
        if missing:  # Hydra turns a callback's exception into a warning and goes on: exit here
            print(f"{ConfigError.what}: the SLURM cluster cannot give what this sweep asks: {'; '.join(missing)}",
                  file=sys.stderr, flush=True)
            sys.exit(2)
        from minillm.training.run.slurm_queue import install_watcher  # submitit: only where a SLURM sweep starts

        install_watcher()
