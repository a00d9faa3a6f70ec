"""Run folders (minillm/resolvers.py): unique per start, stable across the restarts of one run."""

from __future__ import annotations

import re

import pytest
from helpers import CONFIGS

from minillm.errors import ConfigError
from minillm.training.run import resolvers


@pytest.fixture(autouse=True)
def fresh_id(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    resolvers.new_run_id.cache_clear()
    yield
    resolvers.new_run_id.cache_clear()


def test_a_local_run_id_is_the_start_time_plus_random_digits_and_fixed_within_a_process():
    first = resolvers.new_run_id()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_[0-9a-f]{6}", first)
    assert resolvers.new_run_id() == first  # every resolution of hydra.run.dir in this process agrees
    resolvers.new_run_id.cache_clear()
    assert resolvers.new_run_id() != first  # another process, the same second: another folder


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_ID": "4711"}, "slurm-4711"),
    ({"SLURM_JOB_ID": "4712", "SLURM_ARRAY_JOB_ID": "4700", "SLURM_ARRAY_TASK_ID": "3"}, "slurm-4700_3"),
    ({"TORCHELASTIC_RUN_ID": "abc"}, "torchrun-abc"),
])
def test_cluster_jobs_share_and_keep_one_run_id(env, expected, monkeypatch):
    """Every rank of a SLURM job (and a requeued job) resolves the same folder; so do torchrun's ranks."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert resolvers.new_run_id() == expected


def test_torchrun_without_a_rendezvous_id_gets_a_local_id(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert not resolvers.new_run_id().startswith("torchrun")


def test_run_folder_from_run_id_or_from_the_checkpoint_being_resumed(tmp_path):
    assert resolvers.run_dir("logs", "x", "try1", None) == "logs/x/runs/try1"
    assert resolvers.run_dir("logs", "x", "try1", "auto") == "logs/x/runs/try1"
    ckpt = tmp_path / "logs" / "x" / "runs" / "old" / "checkpoints" / "last.ckpt"
    assert resolvers.run_dir("logs", "x", None, str(ckpt)) == str(ckpt.parent.parent)  # continue in its folder
    evaluation = resolvers.run_dir("logs", "x", "e1", str(ckpt), False)  # train=false: beside the training's record
    assert evaluation == str(ckpt.parent.parent / "evaluations" / "e1")
    elsewhere = tmp_path / "weights.ckpt"
    assert resolvers.run_dir("logs", "x", "try2", str(elsewhere)) == "logs/x/runs/try2"


def test_ckpt_path_auto_without_a_run_id_is_refused_naming_the_runs_it_could_mean(tmp_path, monkeypatch):
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "x" / "runs" / "r1" / "checkpoints").mkdir(parents=True)
    (tmp_path / "x" / "runs" / "r1" / "checkpoints" / "last.ckpt").write_bytes(b"")
    (tmp_path / "x" / "runs" / "r2").mkdir()  # no checkpoint: not named
    with pytest.raises(ConfigError, match=r"^ckpt_path=auto needs the run to resume: add run_id=<id> .*"
                                          r"runs with a checkpoint: run_id=r1$"):
        resolvers.run_dir(str(tmp_path), "x", None, "auto")
    with pytest.raises(ConfigError, match="ckpt_path=auto in a sweep needs run_id"):
        resolvers.sweep_dir(str(tmp_path), "x", None, "auto", "hydra._internal.core_plugins.BasicLauncher")
    submitit = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert resolvers.sweep_dir(str(tmp_path), "x", None, "auto", submitit).startswith(f"{tmp_path}/x/multiruns/")
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # a requeued SLURM job gets its id again
    resolvers.new_run_id.cache_clear()
    try:
        assert resolvers.run_dir(str(tmp_path), "x", None, "auto") == f"{tmp_path}/x/runs/slurm-77"
    finally:
        resolvers.new_run_id.cache_clear()


@pytest.mark.parametrize("name, run_id", [("../x", None), ("a/b", None), ("ok", "../up"), ("", None)])
def test_names_that_would_leave_the_log_folder_are_refused_before_any_folder_exists(name, run_id):
    with pytest.raises(ConfigError, match=r"is invalid; allowed: a folder name"):
        resolvers.run_dir("logs", name, run_id, None)
    with pytest.raises(ConfigError, match=r"is invalid; allowed: a folder name"):
        resolvers.sweep_dir("logs", name, run_id, None)


def test_min_resolver_passes_a_value_that_is_not_a_number_through_to_its_check():
    assert resolvers.minimum(400, 1600) == 400 and resolvers.minimum(400, 7) == 7
    assert resolvers.minimum(400, "ten") == "ten"  # then trainer.max_steps='ten' is named by its own check


def test_a_resumed_run_keeps_the_first_commands_hydra_files(tmp_path):
    assert resolvers.hydra_subdir(str(tmp_path / "new")) == ".hydra"
    (tmp_path / "old" / ".hydra").mkdir(parents=True)
    (tmp_path / "old" / ".hydra" / "config.yaml").write_text("a: 1\n")
    sub = resolvers.hydra_subdir(str(tmp_path / "old"))
    assert sub.startswith(".hydra/resumed-") and resolvers.hydra_subdir(str(tmp_path / "old")) == sub


@pytest.mark.parametrize("accelerator, devices, gpus, tasks", [("gpu", 4, 4, 4), ("cpu", 2, 0, 1), ("cuda", 1, 1, 1)])
def test_slurm_resources_follow_the_trainer(accelerator, devices, gpus, tasks):
    assert (resolvers.slurm_gpus(accelerator, devices), resolvers.slurm_tasks(accelerator, devices)) == (gpus, tasks)


def test_slurm_needs_a_gpu_count():
    with pytest.raises(ValueError, match="trainer.devices = the GPUs per node"):
        resolvers.slurm_gpus("gpu", -1)


def test_hydra_config_uses_the_resolvers_and_no_runtime_cwd():
    text = (CONFIGS / "hydra" / "default.yaml").read_text()
    assert "${hydra:runtime.cwd}" not in text and "minillm.run_dir" in text and "minillm.sweep_dir" in text
