"""The cluster path on a real SLURM cluster (the `slurm_cluster` fixture: a one-node cluster on this machine, started
by scripts/slurm_cluster.sh; skipped with the reason where SLURM cannot be installed). Each test runs what
docs/scaling.md tells a user, with a tiny model and few steps: the launcher sweep, the sbatch script (two DDP tasks
through srun, one run folder), a job requeued mid-run, a time limit reached with the preset's signal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import CONFIGS, ROOT, logged, read_rows
from processes import cli, environ, start, summaries
from slurm_jobs import finish_within, sbatch, state, wait_ended, wait_until

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


# --- docs/scaling.md's sbatch script: two DDP tasks through srun, requeued mid-run --------------------------------

# the script's lines a CPU node of this cluster changes: two tasks of one CPU, a tiny model on the test corpus
SBATCH_CPU = {
    "--ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task=8": "--ntasks-per-node=2 --cpus-per-task=1",
    "srun python train.py trainer=ddp trainer.devices=4 model=gpt125m":
        "srun {python} {root}/train.py trainer=ddp trainer.accelerator=cpu trainer.devices=2 trainer.precision=32-true"
        " model=tiny data=files data.files=[{corpus}] logger=csv test=false data.batch_size=4 data.val_windows=4"
        " trainer.max_steps=12 trainer.val_check_interval=4 callbacks.text_sample.max_new_tokens=8 threads=1 {extra}",
}


def doc_sbatch_script(folder: Path, corpus: Path, extra: str = "") -> Path:
    """docs/scaling.md's sbatch script as written, with SBATCH_CPU's lines for this cluster, saved as big.sh."""
    text = re.search(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", (ROOT / "docs" / "scaling.md").read_text(), re.S)
    script = text.group(1)
    for old, new in SBATCH_CPU.items():
        assert old in script, old
        script = script.replace(old, new.format(python=sys.executable, root=ROOT, corpus=corpus, extra=extra))
    path = folder / "big.sh"
    path.write_text(script)
    return path


def job_env(cache: Path) -> dict[str, str]:
    """The submitting shell's environment (sbatch passes it on), with the tests' helpers importable in the job."""
    env = environ(cache, {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "tests"), env.get("PYTHONPATH")) if p)
    return env


def run_doc_script(cwd: Path, corpus: Path, cache: Path, jobs: list[str], extra: str = "",
                   during: Callable[[str], None] | None = None) -> tuple[str, Path]:
    """Submit the script from cwd as the docs say (mkdir -p logs && sbatch big.sh), wait until it has ended; (job id,
    its run folder). ``during(job id)`` runs while it is queued or running."""
    cwd.mkdir(exist_ok=True)
    (cwd / "logs").mkdir(exist_ok=True)
    job = sbatch(doc_sbatch_script(cwd, corpus, extra), cwd, job_env(cache))
    jobs.append(job)
    if during is not None:
        during(job)
    final = wait_ended(job, timeout=400)
    out = cwd / "logs" / f"slurm-{job}.out"
    assert final in ("COMPLETED", ""), f"job {job} ended {final}:\n{out.read_text()[-3000:] if out.exists() else ''}"
    return job, cwd / "logs" / "big" / "runs" / f"slurm-{job}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, corpus, shared_cache):
    """The doc's sbatch script run to its end, uninterrupted: (job id, run folder, the SLURM job's log)."""
    from slurm_jobs import cancel

    jobs: list[str] = []
    cwd = tmp_path_factory.mktemp("sbatch")
    try:
        job, run = run_doc_script(cwd, corpus, shared_cache, jobs)
    finally:
        cancel(jobs)
    return job, run, (cwd / "logs" / f"slurm-{job}.out").read_text()


@pytest.mark.slow
def test_doc_sbatch_script_trains_two_srun_tasks_in_one_run_folder(uninterrupted):
    """Two tasks of one job (srun, Lightning's SLURM environment, DDP over gloo) train one run in one folder,
    logs/big/runs/slurm-<job id>, with the batches of both processes."""
    job, run, log = uninterrupted
    assert sorted(p.name for p in run.parent.iterdir()) == [f"slurm-{job}"]
    (summary,) = summaries(run)
    assert summary["status"] in ("completed", "not_trained") and summary["steps"] == 12, summary
    assert summary["tokens"] == 12 * 4 * 32 * 2  # both tasks' batches: 2 processes
    assert "Starting with 2 processes" in log and "distributed_backend=gloo" in log
    assert list((run / "checkpoints").glob("last.ckpt")) and not (run / "checkpoints" / "preempted.ckpt").exists()


@pytest.mark.slow
def test_doc_sbatch_job_requeued_mid_run_resumes_to_the_same_losses(tmp_path, corpus, shared_cache, slurm_jobs,
                                                                    uninterrupted):
    """`scontrol requeue` while the job trains: SLURM stops both tasks (SIGTERM), they save preempted.ckpt after one
    step they agree on and exit; the requeued job (same id, same folder) resumes with ckpt_path=auto and ends with
    the losses of the uninterrupted job, bit for bit."""
    def requeue_when_paused(job: str) -> None:
        log = tmp_path / "logs" / f"slurm-{job}.out"
        wait_until(lambda: log.exists() and "PAUSED 6" in log.read_text(), 300, "the job to reach step 6")
        subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)

    job, run = run_doc_script(tmp_path, corpus, shared_cache, slurm_jobs, during=requeue_when_paused,
                              extra="+callbacks.pause._target_=slurm_jobs.PauseAt +callbacks.pause.step=6")
    log = (tmp_path / "logs" / f"slurm-{job}.out").read_text()
    assert re.search(r"SIGTERM: stopped at step [67] and saved", log), log[-3000:]
    assert log.count("Starting with 2 processes") == 2  # the job's two starts
    (summary,) = summaries(run)
    assert summary["steps"] == 12 and summary["status"] == uninterrupted_status(uninterrupted)
    for key in ("train/loss", "val/loss"):
        assert logged(read_rows(run), key) == logged(read_rows(uninterrupted[1]), key), key


def uninterrupted_status(uninterrupted) -> str:
    return summaries(uninterrupted[1])[0]["status"]


@pytest.mark.slow
def test_slurm_sweep_job_at_its_time_limit_saves_requeues_and_resumes_exactly(tmp_path, shared_cache, corpus):
    """docs/scaling.md's launcher sweep with ckpt_path=auto, its job brought to its time limit mid-run (its limit
    lowered to 2 minutes while it trains): SLURM sends the preset's USR2 (signal_delay_s=120 before the limit),
    PreemptionCheckpoint saves preempted.ckpt, submitit requeues the job, the job resumes in its folder (the limit
    set back, as a long job's last segment has time) and ends with the losses of an uninterrupted run."""
    steps = ["trainer.max_steps=12", "trainer.val_check_interval=4"]
    env = {**PASSED, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "tests"), PASSED.get("PYTHONPATH")) if p)}
    pid, log = start(sweep_args(corpus, "ckpt_path=auto", *steps, "+callbacks.pause._target_=slurm_jobs.PauseAt",
                                "+callbacks.pause.step=6"), tmp_path, shared_cache, **env)
    job, code = "", None
    try:
        job_log = wait_until(lambda: next(iter(tmp_path.rglob(".submitit/*/*_0_log.out")), None), 120, "the job")
        job = job_log.parent.name
        wait_until(lambda: "PAUSED 6" in job_log.read_text(), 300, "the job to reach step 6")
        subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=2"], check=True, timeout=60)
        wait_until(lambda: "Requeued job" in job_log.read_text(), 120, "the time limit's signal and the requeue")
        subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=240"], check=True, timeout=60)
        code, output = finish_within(pid, log, 400)
    finally:
        if job:
            subprocess.run(["scancel", job], capture_output=True, timeout=60)
        if code is None:  # a wait above failed: the submitter is still running
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    assert code == 0 and "Traceback" not in output, output[-3000:]
    text = job_log.read_text()
    assert "Caught signal SIGUSR2" in text and "SIGUSR2: stopped at step 6 and saved" in text, text[-3000:]
    (run,) = [p.parent for p in (tmp_path / "logs").rglob("summary.json")]
    (summary,) = summaries(run)
    assert summary["steps"] == 12 and (run / "checkpoints" / "preempted.ckpt").is_file()
    reference = tmp_path / "reference"
    reference.mkdir()
    ref_args = [a for a in sweep_args(corpus, *steps) if a not in ("-m", "hydra/launcher=slurm")]
    assert cli(ref_args, reference, shared_cache).returncode == 0
    (ref_run,) = [p.parent for p in (reference / "logs").rglob("summary.json")]
    assert summary["status"] == summaries(ref_run)[0]["status"]
    for key in ("train/loss", "val/loss"):
        assert logged(read_rows(run), key) == logged(read_rows(ref_run), key), key


@pytest.mark.slow
def test_slurm_sweep_whose_job_is_cancelled_ends_instead_of_waiting_forever(tmp_path, shared_cache, corpus):
    """A sweep's job cancelled while it trains (scancel) leaves no result: on this cluster without accounting the
    wait sees it leave the queue and the sweep ends with submitit's error (before: it waited for ever)."""
    env = {**PASSED, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "tests"), PASSED.get("PYTHONPATH")) if p)}
    pid, log = start(sweep_args(corpus, "trainer.max_steps=12", "+callbacks.pause._target_=slurm_jobs.PauseAt",
                                "+callbacks.pause.step=6"), tmp_path, shared_cache, **env)
    job, code = "", None
    try:
        job_log = wait_until(lambda: next(iter(tmp_path.rglob(".submitit/*/*_0_log.out")), None), 120, "the job")
        job = job_log.parent.name
        wait_until(lambda: "PAUSED 6" in job_log.read_text(), 300, "the job to reach step 6")
        subprocess.run(["scancel", "--signal=KILL", job], check=True, timeout=60)
        code, output = finish_within(pid, log, 180)
    finally:
        if job:
            subprocess.run(["scancel", job], capture_output=True, timeout=60)
        if code is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    assert code != 0 and "has not produced any output" in output, output[-3000:]
