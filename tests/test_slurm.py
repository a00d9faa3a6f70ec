"""The cluster path on a real SLURM cluster (the `slurm_cluster` fixture: a one-node cluster on this machine, started
by scripts/slurm_cluster.sh; skipped with the reason where SLURM cannot be installed). Each test runs what
docs/scaling.md tells a user, with a tiny model and few steps: the launcher sweep, the sbatch script (two DDP tasks
through srun, one run folder), a job requeued mid-run, a time limit reached with the preset's signal."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import CONFIGS, ROOT
from processes import cli, start, summaries
from slurm_jobs import finish_within, sbatch, state, wait_until

pytestmark = pytest.mark.usefixtures("slurm_cluster")

TINY = ["model=tiny", "data.batch_size=4", "data.val_windows=4", "trainer.max_steps=2", "trainer.val_check_interval=2",
        "callbacks.text_sample.max_new_tokens=8", "threads=1"]


# what a job needs of the submitting shell (sbatch passes its environment on): the commands the tests fork start
# with a bare environment (tests/processes.py)
PASSED = {k: os.environ[k] for k in ("PATH", "PYTHONPATH") if k in os.environ}


def node_cpus() -> int:
    out = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, timeout=30)
    return int(re.match(r"\d+", out.stdout).group())


def sweep_args(corpus: Path, *extra: str) -> list[str]:
    """docs/scaling.md's launcher sweep on the test corpus (`python train.py -m hydra/launcher=slurm ...`)."""
    return [str(ROOT / "train.py"), "-m", "hydra/launcher=slurm", "name=slurm_sweep", "data=files",
            f"data.files=[{corpus}]", "logger=csv", "test=false", *TINY, *extra]


def submitted_scripts(cwd: Path) -> list[str]:
    return [p.read_text() for p in cwd.rglob(".submitit/*/*_submission.sh")] + [
        p.read_text() for p in cwd.rglob(".submitit/*_submission.sh")]


def test_slurm_preset_asks_at_most_what_a_node_has():
    """cpus_per_task follows the run (threads + DataLoader workers; 8 when threads is null) and the node: on a node
    with fewer CPUs the job asks what the node has, and starts, instead of waiting forever (PartitionConfig)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from minillm.training.run import slurm
    from minillm.training.run.hydra import config_dir

    config_dir()
    slurm.partitions.cache_clear()
    cpus = node_cpus()
    asked = {}
    for extra in ([], ["threads=1"], ["threads=1", "data=shakespeare", "data.num_workers=1"]):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = compose("train", overrides=["hydra/launcher=slurm", *extra], return_hydra_config=True)
        asked[" ".join(extra)] = cfg.hydra.launcher.cpus_per_task
    GlobalHydra.instance().clear()
    assert asked == {"": min(8, cpus), "threads=1": 1, "threads=1 data=shakespeare data.num_workers=1": min(2, cpus)}


def test_slurm_sweep_refuses_in_one_line_what_the_cluster_cannot_give(tmp_path, shared_cache, corpus):
    """CPUs, memory, nodes or GPUs beyond a node of the partition, or a partition the cluster lacks: one line naming
    each setting, exit code 2, before anything is submitted."""
    cpus = node_cpus()
    out = cli(sweep_args(corpus, f"hydra.launcher.cpus_per_task={cpus + 1}", "hydra.launcher.mem_gb=100000",
                         "hydra.launcher.nodes=3", "trainer=gpu", "trainer.devices=1"), tmp_path, shared_cache)
    assert out.returncode == 2, out.output[-3000:]
    (line,) = [x for x in out.output.splitlines() if "cannot give" in x]
    assert line.startswith("config error: the SLURM cluster cannot give what this sweep asks: ")
    for part in (f"hydra.launcher.cpus_per_task={cpus + 1} x tasks_per_node=1: a node of partition",
                 "hydra.launcher.mem_gb=100000: a node of partition", "hydra.launcher.nodes=3 (trainer.num_nodes)",
                 "hydra.launcher.gpus_per_node=1 (trainer.devices): a node of partition"):
        assert part in line, line
    out = cli(sweep_args(corpus, "hydra.launcher.partition=nope"), tmp_path, shared_cache)
    assert out.returncode == 2 and "hydra.launcher.partition=nope is not a partition of this cluster (sinfo lists: " \
        in out.output and "Traceback" not in out.output, out.output[-3000:]
    assert not submitted_scripts(tmp_path)  # nothing was submitted


def test_slurm_sweep_as_documented_completes_and_says_a_pending_reason_once(tmp_path, shared_cache, corpus,
                                                                            slurm_jobs):
    """docs/scaling.md's `python train.py -m hydra/launcher=slurm norm=layernorm,rmsnorm` (tiny, threads=1) on a node
    another job holds at first: the jobs wait (said once, with squeue's reason), then, the node freed, both complete;
    on this cluster without accounting no sacct warning repeats every few seconds."""
    blocker = tmp_path / "blocker.sh"
    blocker.write_text(f"#!/bin/bash\n#SBATCH --job-name=minillm-test-blocker --cpus-per-task={node_cpus()}\n"
                       "#SBATCH --output=/dev/null\nsleep 300\n")
    slurm_jobs.append(sbatch(blocker, tmp_path, dict(os.environ)))
    wait_until(lambda: state(slurm_jobs[0]) == "RUNNING", 60, "the blocking job to start")
    pid, log = start(sweep_args(corpus, "norm=layernorm,rmsnorm"), tmp_path, shared_cache, **PASSED)
    wait_until(lambda: "pending (" in log.read_text(), 120, "the sweep to say its jobs are pending")
    subprocess.run(["scancel", slurm_jobs[0]], check=True, timeout=60)  # the node is free: the jobs start
    code, output = finish_within(pid, log, 300)
    assert code == 0 and "Traceback" not in output, output[-3000:]
    jobs = summaries(tmp_path / "logs" / "slurm_sweep" / "multiruns")
    assert sorted(s["norm"] for s in jobs) == ["layernorm", "rmsnorm"]
    assert {s["status"] for s in jobs} <= {"completed", "not_trained"}, jobs
    assert "sweep ended, 2 jobs:" in output
    pending = [x for x in output.splitlines() if "pending (" in x]
    assert len(pending) == 1 and "pending (Resources)" in pending[0], output[-3000:]
    assert "Bypassing sacct error" not in output and "accounting storage is disabled" not in output
    assert output.count("sacct answers nothing on this cluster") == 1
    (script,) = submitted_scripts(tmp_path)
    assert "#SBATCH --cpus-per-task=1\n" in script  # threads=1, no DataLoader workers
