"""A real SLURM cluster for the tests: found running, or started by scripts/slurm_cluster.sh (a one-node cluster
on this machine) when SLURM's tools are installed; else the reason the SLURM tests skip. The jobs a test submits are
its own: it waits for them and cancels only them (by job id), never a cluster or a job it did not start."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
from filelock import FileLock
from helpers import ROOT

SCRIPT = ROOT / "scripts" / "slurm_cluster.sh"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED", ""}  # "": no longer in the queue


def node_ready() -> bool:
    """A SLURM cluster answers and its node can take jobs."""
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and any(s.strip("*~#") in ("idle", "mix", "alloc") for s in out.stdout.split())


def find_cluster() -> str | None:
    """None when a cluster is ready (found, or started here); else why the SLURM tests skip, in one line."""
    if node_ready():
        return None
    if shutil.which("slurmctld") is None or shutil.which("sinfo") is None:
        return ("SLURM is not installed (bash scripts/slurm_cluster.sh start installs Debian's packages as root and "
                "starts a one-node cluster)")
    with FileLock(f"/tmp/minillm-slurm-start-{os.getuid()}.lock"):  # one start for all test processes
        if node_ready():
            return None
        out = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=180)
    if out.returncode or not node_ready():
        lines = (out.stderr or out.stdout).strip().splitlines()
        return f"no SLURM cluster: {lines[-1] if lines else 'scripts/slurm_cluster.sh start failed'}"
    return None


def state(job: str) -> str:
    """The job's state in squeue ('' once it has left the queue)."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True, text=True,
                         timeout=30)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""


def wait_until(condition: Callable[[], object], timeout: float, what: str, poll: float = 0.5) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_ended(job: str, timeout: float = 300) -> str:
    """Wait until the job has ended; its final state."""
    final = {}

    def ended() -> bool:
        final["state"] = state(job)
        return final["state"] in ENDED

    wait_until(ended, timeout, f"SLURM job {job} to end")
    return final["state"]


def sbatch(script: Path, cwd: Path, env: dict[str, str]) -> str:
    """Submit a batch script from cwd (the environment travels with the job, as sbatch's default); its job id."""
    out = subprocess.run(["sbatch", "--parsable", str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def cancel(jobs: list[str]) -> None:
    """Cancel the tests' own jobs that are still queued (by id)."""
    queued = [j for j in jobs if state(j) not in ENDED]
    if queued:
        subprocess.run(["scancel", *queued], capture_output=True, timeout=60)


def finish_within(pid: int, log: Path, timeout: float) -> tuple[int, str]:
    """(exit code, output) of a command started by processes.start; killed (and the test failed) past timeout,
    so a sweep that would wait forever fails instead."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), log.read_text(errors="replace")
        time.sleep(0.5)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"still running after {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


class PauseAt(L.Callback):
    """In a job: after training step `step`, print `PAUSED <step>` and wait up to `seconds` for a stop signal (the
    preemption callback has one), so that what the test sends from outside lands mid-run on any machine."""

    def __init__(self, step: int, seconds: float = 90):
        self.step, self.seconds = step, seconds

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step != self.step:
            return
        print(f"PAUSED {self.step}", flush=True)
        end = time.monotonic() + self.seconds
        while time.monotonic() < end and not any(getattr(c, "signum", None) for c in trainer.callbacks):
            time.sleep(0.05)
