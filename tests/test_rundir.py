"""Run folders (minillm/rundir.py): unique per start, stable across the restarts of one run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from minillm import rundir


@pytest.fixture(autouse=True)
def fresh_id(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    rundir.new_run_id.cache_clear()
    yield
    rundir.new_run_id.cache_clear()


def test_a_local_run_id_is_the_start_time_plus_random_digits_and_fixed_within_a_process():
    first = rundir.new_run_id()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_[0-9a-f]{6}", first)
    assert rundir.new_run_id() == first  # every resolution of hydra.run.dir in this process agrees
    rundir.new_run_id.cache_clear()
    assert rundir.new_run_id() != first  # another process, the same second: another folder


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_ID": "4711"}, "slurm-4711"),
    ({"SLURM_JOB_ID": "4712", "SLURM_ARRAY_JOB_ID": "4700", "SLURM_ARRAY_TASK_ID": "3"}, "slurm-4700_3"),
    ({"TORCHELASTIC_RUN_ID": "abc"}, "torchrun-abc"),
])
def test_cluster_jobs_share_and_keep_one_run_id(env, expected, monkeypatch):
    """Every rank of a SLURM job (and a requeued job) resolves the same folder; so do torchrun's ranks."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert rundir.new_run_id() == expected


def test_torchrun_without_a_rendezvous_id_gets_a_local_id(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert not rundir.new_run_id().startswith("torchrun")


def test_run_folder_from_run_id_or_from_the_checkpoint_being_resumed(tmp_path):
    assert rundir.run_dir("logs/x/runs", "try1", None) == "logs/x/runs/try1"
    assert rundir.run_dir("logs/x/runs", None, "auto").startswith("logs/x/runs/")
    ckpt = tmp_path / "logs" / "x" / "runs" / "old" / "checkpoints" / "last.ckpt"
    assert rundir.run_dir("logs/x/runs", None, str(ckpt)) == str(ckpt.parent.parent)  # continue in its folder
    elsewhere = tmp_path / "weights.ckpt"
    assert rundir.run_dir("logs/x/runs", "try2", str(elsewhere)) == "logs/x/runs/try2"


def test_a_resumed_run_keeps_the_first_commands_hydra_files(tmp_path):
    assert rundir.hydra_subdir(str(tmp_path / "new")) == ".hydra"
    (tmp_path / "old" / ".hydra").mkdir(parents=True)
    (tmp_path / "old" / ".hydra" / "config.yaml").write_text("a: 1\n")
    sub = rundir.hydra_subdir(str(tmp_path / "old"))
    assert sub.startswith(".hydra/resumed-") and rundir.hydra_subdir(str(tmp_path / "old")) == sub


@pytest.mark.parametrize("accelerator, devices, gpus, tasks", [("gpu", 4, 4, 4), ("cpu", 2, 0, 1), ("cuda", 1, 1, 1)])
def test_slurm_resources_follow_the_trainer(accelerator, devices, gpus, tasks):
    assert (rundir.slurm_gpus(accelerator, devices), rundir.slurm_tasks(accelerator, devices)) == (gpus, tasks)


def test_slurm_needs_a_gpu_count():
    with pytest.raises(ValueError, match="trainer.devices = the GPUs per node"):
        rundir.slurm_gpus("gpu", -1)


def test_hydra_config_uses_the_resolvers_and_no_runtime_cwd():
    text = (Path(__file__).parents[1] / "configs" / "hydra" / "default.yaml").read_text()
    assert "${hydra:runtime.cwd}" not in text and "minillm.run_dir" in text and "minillm.run_id" in text
