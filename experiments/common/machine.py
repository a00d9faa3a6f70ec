"""The machine a result was produced on, in one line: what every committed result names.

A round's analysis names the machine its runs ran on, as the runs recorded it (``runs_machine``: the CPU kernels
and torch version each summary.json holds), never the one the analysis happens to run on, so its results come back
the same wherever they are regenerated; ``machine()`` describes this computer, for what is measured here (the
benchmarks, S1's gradients at init, S6's timings, S5's fp16 overflow probe).
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (lscpu, else /proc/cpuinfo, else the platform's processor string)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    """CPU model and the kernels torch runs on it, cores, GPU (or "no GPU"), torch version, e.g. "AMD EPYC (AVX2
    kernels), 2 cores, no GPU, torch 2.13.0+cpu": the same code rounds differently under other kernels."""
    import torch

    gpu = "no GPU"
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        gpu = (f"{n}x " if n > 1 else "") + torch.cuda.get_device_name(0)
    kernels = torch.backends.cpu.get_cpu_capability()
    return f"{cpu_model()} ({kernels} kernels), {os.cpu_count()} cores, {gpu}, torch {torch.__version__}"


def this_checkout() -> str:
    """The commit this script runs from, as a result names it: "1d63f5d", or "1d63f5d (with uncommitted changes)"."""
    from minillm.version import provenance as code_provenance

    code = code_provenance()
    if not code["git_commit"]:
        return "unknown"
    return code["git_commit"][:7] + (" (with uncommitted changes)" if code["git_dirty"] else "")


def run_kernels(runs: list[dict]) -> str:
    """The CPU kernels and torch versions the runs themselves recorded (summary.json), e.g. "AVX2 kernels, torch
    2.13.0+cpu: 8 runs; AVX512 kernels, torch 2.13.0+cpu: 24 runs": machine() names where the analysis ran."""
    counts: dict[str, int] = {}
    for r in runs:
        key = f"{r.get('cpu_capability') or 'unrecorded'} kernels, torch {r.get('torch_version') or 'unrecorded'}"
        counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"{k}: {n} runs" for k, n in sorted(counts.items()))


def runs_machine(runs: Iterable[dict]) -> str:
    """The machine an analysis's runs ran on, from their own records, e.g. "the runs' records, AVX2 kernels, torch
    2.13.0+cpu: 44 runs" (the runs record no CPU model or core count; older ones record no kernels either, and the
    line says so)."""
    return f"the runs' records, {run_kernels(list(runs))}"


def runs_commits(runs: Iterable[dict]) -> str:
    """The commits the runs recorded, short and sorted ("+dirty" where a run's checkout had uncommitted changes)."""
    return ", ".join(sorted({environment(r).split(",")[0] for r in runs}))


def environment(run: dict) -> str:
    """Where a run ran, as its summary.json recorded it: "3bfe66c+dirty, AVX2 kernels, torch 2.13.0+cpu"."""
    commit = run.get("git_commit")
    code = f"{commit[:7]}{'+dirty' if run.get('git_dirty') else ''}" if commit else "commit unrecorded"
    kernels, torch = run.get("cpu_capability") or "unrecorded", run.get("torch_version") or "unrecorded"
    return f"{code}, {kernels} kernels, torch {torch}"


def environments(runs: list[dict], arm: Callable[[dict], object]) -> dict[str, dict[str, int]]:
    """arm(run) -> {environment: runs}: the commits, kernels and torch versions each arm of a comparison ran with."""
    out: dict[str, dict[str, int]] = {}
    for r in runs:
        envs = out.setdefault(str(arm(r)), {})
        envs[environment(r)] = envs.get(environment(r), 0) + 1
    return out


def provenance(runs: list[dict], arm: Callable[[dict], object]) -> str:
    """One line for results.md: each arm's environments, and whether the arms of the comparison differ (a change
    of CPU kernels alone moves a run's loss by 0.01-0.06 nats at high lr; a commit may change the code path)."""
    envs = environments(runs, arm)
    differ = len({frozenset(e) for e in envs.values()}) > 1
    body = "; ".join(f"{a}: " + ", ".join(f"{e} ({n} runs)" for e, n in sorted(e_.items())) for a, e_ in envs.items())
    return (f"**Provenance per arm** ({'the arms differ' if differ else 'the same for every arm'}): {body}.")
