"""The user's journey, run as the user runs it: README's commands as written, the experiment presets' sweeps,
parallel and cluster launchers, simultaneous runs, DDP with its loggers on. Every command is a real process
started from a fresh working directory (no hydra.sweep.dir, nothing set that a user would not set)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CONFIGS, ROOT, check_derived_files, write_corpus
from processes import Result, cli, cli_all, environ, ok, summaries

# What the README says the test appends to each `python train.py` line (README.md, "Using it").
README_SUFFIX = ("model=tiny data.batch_size=4 data.val_windows=4 data.val_fraction=0.002 trainer.max_steps=2 "
                 "trainer.val_check_interval=2 callbacks.text_sample.max_new_tokens=8").split()


def readme_commands() -> list[str]:
    """The command lines of README.md's "Using it" block, comments stripped."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Using it\n\n```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def write_task(folder: Path) -> None:
    """/path/task.jsonl and /path/tasks: a multiple-choice task in the characters of write_corpus' text, as
    minillm-eval's JSONL and as an lm-evaluation-harness task (my_task) over the same file."""
    items = [{"context": f"The {w} and", "choices": [" the", " my", " fair"], "answer": i % 3}
             for i, w in enumerate(("king", "queen", "lord", "love", "night", "sir"))]
    (folder / "task.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    (folder / "tasks").mkdir()
    (folder / "tasks" / "my_task.yaml").write_text(
        f"task: my_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'task.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: context\ndoc_to_choice: choices\n"
        'doc_to_target: answer\ntarget_delimiter: ""\nmetric_list:\n  - metric: acc\n')


PLACEHOLDERS = {"every_n_train_steps=400": "every_n_train_steps=1", "step-800.ckpt": "step-1.ckpt"}


def readme_args(command: str, cwd: Path, book: Path, folder: Path) -> list[str]:
    """A README line as the argv of the process that runs it (placeholders filled, README's suffix added)."""
    command = command.replace("/path/book.txt", str(book)).replace("/path/dir", str(folder))
    command = command.replace("/path/task.jsonl", str(folder.parent / "task.jsonl"))
    command = command.replace("/path/tasks", str(folder.parent / "tasks"))
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    if "<id>" in command:
        command = command.replace("<id>", max((cwd / "logs" / "my_sweep" / "multiruns").iterdir()).name)
    args = shlex.split(command)[1:]
    return [str(ROOT / "train.py"), *args[1:], *README_SUFFIX] if args[0] == "train.py" else args


def run_readme(tmp_path: Path, cache: Path, run_all, run_one) -> tuple[Path, dict[str, str]]:
    """Every README usage line from a fresh folder; lines that read what earlier ones wrote (the report,
    resuming, evaluating, --help last) wait for all earlier ones, the others run two at a time."""
    book = write_corpus(tmp_path / "book.txt", n_chars=60_000)
    folder = tmp_path / "dir"
    folder.mkdir()
    write_corpus(folder / "more.txt", n_chars=30_000, seed=1)
    write_task(tmp_path)
    cwd = tmp_path / "work"
    cwd.mkdir()
    commands = readme_commands()
    assert len(commands) >= 15 and all(c.startswith("python ") for c in commands), commands
    logs: dict[str, str] = {}
    batch: list[str] = []

    def flush() -> None:
        args = [readme_args(c, cwd, book, folder) for c in batch]
        logs.update(zip(batch, (ok(r) for r in run_all(args, cwd, cache)), strict=True))
        batch.clear()

    for command in commands:
        if any(s in command for s in ("<id>", "ckpt_path=", "--help", "decay_from=")) or "train.py" not in command:
            flush()
            logs[command] = ok(run_one(readme_args(command, cwd, book, folder), cwd, cache))
        else:
            batch.append(command)
    flush()
    return cwd, logs


def check_readme_results(cwd: Path, logs: dict[str, str]) -> None:
    assert "placement: pre, post, peri, branch, deepnorm, double, mix" in logs["python train.py --help"]
    sweep = max((cwd / "logs" / "my_sweep" / "multiruns").iterdir())
    assert len(summaries(sweep)) == 6 and (sweep / "report" / "report.md").is_file()
    verdicts = json.loads((sweep / "report" / "verdicts.json").read_text())  # 2 steps, 1 seed: inconclusive
    assert len(verdicts["comparisons"]) == 4 and {c["stratum"]["placement"] for c in verdicts["comparisons"]} == {
        "pre", "post"}
    par = summaries(cwd / "logs" / "par" / "multiruns")  # Hydra's joblib launcher: parallel processes
    assert {(s["norm"], s["seed"]) for s in par} == {(n, s) for n in ("layernorm", "rmsnorm") for s in (0, 1)}
    (par_log,) = [log for command, log in logs.items() if "hydra/launcher=joblib" in command]
    assert "Joblib.Parallel" in par_log
    (ddp_log,) = [log for command, log in logs.items() if "trainer=ddp_cpu" in command]
    assert ddp_log.count("resolved config") == 1  # printed once, by rank 0, before the ranks start
    first = cwd / "logs" / "my_run" / "runs" / "first"
    (summary,) = summaries(first)  # resumed in its own folder: still one run
    assert summary["status"] != "preempted" and summary["steps"] == 2 and summary["test_loss"] is not None
    assert summary["test_weights"] == "final"  # the evaluation of best.ckpt did not rewrite the training's record
    (resume_log,) = [log for command, log in logs.items() if "run_id=first ckpt_path=auto" in command]
    assert "ckpt_path=auto: this run has ended, nothing to resume" in resume_log  # it trained its 2 steps: ended
    assert not list((first / ".hydra").glob("resumed-*")) and len(list((first / "wandb").glob("offline-run-*"))) == 1
    (evaluation,) = (first / "evaluations").glob("*/evaluation.json")  # train=false: its own folder, beside
    assert json.loads(evaluation.read_text())["test_weights"].endswith("best.ckpt")
    # the ecosystem lines: Muon, TensorBoard, a decay branch and its report, evaluation, export, import, inspection
    assert {s["optimizer"] for s in summaries(cwd / "logs" / "default")} >= {"AdamW", "MuonWithAdamW"}
    assert list((cwd / "logs" / "default").rglob("tensorboard/events.out.tfevents.*"))
    (branch,) = [s for s in summaries(cwd / "logs" / "wsd") if s.get("parent")]
    assert branch["parent"]["step"] == 1 and branch["steps"] == 2 and "stable" not in branch["run_dir"]
    assert (cwd / "logs" / "wsd" / "report" / "loss_vs_tokens.png").is_file()
    (task_log,) = [log for command, log in logs.items() if "--tasks /path/task.jsonl" in command]
    assert "task: acc " in task_log and "chance 0.3333" in task_log
    (harness_log,) = [log for command, log in logs.items() if "minillm.tools.harness" in command]
    assert re.search(r"\|my_task\s*\|.*\|acc\s*\|", harness_log), harness_log[-2000:]
    assert (cwd / "imported.ckpt").is_file() and (cwd / "hf-model" / "model.safetensors").is_file()
    assert json.loads((cwd / "imported.ckpt.inspect" / "depth_profile.json").read_text())["layers"]


def test_readme_usage_commands_run_as_written(tmp_path, shared_cache):
    """Each command line of README's usage block, with the documented suffix, from a fresh directory."""
    check_readme_results(*run_readme(tmp_path, shared_cache, cli_all, cli))


@pytest.mark.slow
def test_readme_commands_in_fresh_interpreters(tmp_path, shared_cache):
    """The same, each command in a new `python` process (the default suite forks them, see start)."""
    def fresh(args: list[str], cwd: Path, cache: Path) -> Result:
        out = subprocess.run([sys.executable, *args], cwd=cwd, env=environ(cache, {}), capture_output=True,
                             text=True, timeout=900)
        return Result(args, out.returncode, out.stdout + out.stderr)

    check_readme_results(*run_readme(tmp_path, shared_cache, lambda cmds, cwd, cache: [
        fresh(a, cwd, cache) for a in cmds], fresh))


def test_two_runs_started_at_once_get_two_complete_run_folders(tmp_path, shared_cache, corpus):
    """The same command twice at the same moment (a SLURM array, two agents): two folders, each complete."""
    args = [str(ROOT / "train.py"), "name=twins", "data=files", f"data.files=[{corpus}]", "logger=csv",
            "test=false", *README_SUFFIX[:2], *README_SUFFIX[4:]]
    logs = [ok(r) for r in cli_all([args, args], tmp_path, shared_cache)]  # both processes start at once
    runs = sorted((tmp_path / "logs" / "twins" / "runs").iterdir())
    assert len(runs) == 2, runs
    for run, log in zip(runs, sorted(logs, key=lambda s: str(runs[0]) not in s), strict=True):
        assert (run / "summary.json").is_file() and (run / "csv" / "metrics.csv").is_file()
        own = (run / "train.log").read_text()
        assert f"run directory {run}" in own and str(runs[0] if run == runs[1] else runs[1]) not in own
        assert "step 2/2" in own and "step 2/2" in log  # plain progress lines, stdout not being a terminal
        assert "`Trainer.fit` stopped" in own  # Lightning's own messages reach train.log


@pytest.mark.slow  # the README's joblib line runs in the default suite
def test_joblib_launcher_runs_a_sweep_in_parallel_processes(tmp_path, shared_cache, corpus):
    out = ok(cli([str(ROOT / "train.py"), "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "name=jl",
                  "data=files", f"data.files=[{corpus}]", "logger=csv", "callbacks=stability", "test=false",
                  *README_SUFFIX[:2], *README_SUFFIX[4:6], "norm=layernorm,rmsnorm", "seed=0,1"],
                 tmp_path, shared_cache))
    assert "n_jobs=2" in out  # Hydra's joblib launcher reports its pool
    jobs = summaries(tmp_path / "logs" / "jl" / "multiruns")
    assert len(jobs) == 4 and {(s["norm"], s["seed"]) for s in jobs} == {
        (n, s) for n in ("layernorm", "rmsnorm") for s in (0, 1)}
    statuses = [s["status"] for s in jobs]  # 2 steps: a run may end not yet under ln V (not_trained), none failed
    assert set(statuses) <= {"completed", "diverged", "not_trained"}, statuses


@pytest.mark.slow  # the joblib launcher runs in the default suite
def test_submitit_launcher_preset_runs_its_jobs_with_the_local_executor(tmp_path, shared_cache, corpus):
    """hydra/launcher=slurm_local: the slurm preset's settings (resources from the trainer config) through
    submitit's local executor, which runs each job as a process here, as SLURM would on a cluster."""
    ok(cli([str(ROOT / "train.py"), "-m", "hydra/launcher=slurm_local", "name=sub", "data=files",
            f"data.files=[{corpus}]", "logger=csv", "callbacks=stability", "test=false", "trainer=cpu",
            *README_SUFFIX[:2], *README_SUFFIX[4:6], "norm=layernorm,rmsnorm"], tmp_path, shared_cache))
    (sweep,) = (tmp_path / "logs" / "sub" / "multiruns").iterdir()
    assert len(summaries(sweep)) == 2 and any((sweep / ".submitit").rglob("*_log.out"))


def test_ddp_cpu_run_with_default_callbacks_and_loggers(tmp_path, shared_cache, corpus):
    """trainer=ddp_cpu for 30 steps with every default callback and logger (W&B offline + CSV), validation
    and the held-out pass: completes, and the summary covers the run the forked processes trained."""
    ok(cli([str(ROOT / "train.py"), "trainer=ddp_cpu", "trainer.max_steps=30", "trainer.val_check_interval=15",
            "model=tiny", "data=files", f"data.files=[{corpus}]", "data.batch_size=4", "data.val_windows=8",
            "callbacks.text_sample.max_new_tokens=8", "name=ddp"], tmp_path, shared_cache))
    (run,) = (tmp_path / "logs" / "ddp" / "runs").iterdir()
    summary = check_derived_files(run)  # summary.json, metrics.csv and the W&B summary agree
    assert summary["status"] == "completed" and summary["steps"] == 30 and summary["test_loss"] is not None
    assert summary["tokens"] == 30 * 4 * 32 * 2  # both processes' batches
    rows = (run / "csv" / "metrics.csv").read_text()
    assert rows.count("\n") > 10 and "test/loss" in rows.splitlines()[0]
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    assert list((run / "wandb").rglob("samples_*.table.json"))  # the forked processes' W&B media, in the run folder
    assert not (tmp_path / "wandb").exists()  # not under the working directory


# --- the experiment presets' sweeps ----------------------------------------------------------------------------


def preset_sweeps() -> dict[str, str]:
    """experiment preset -> the sweep command its header documents (`python train.py -m experiment=...`)."""
    out = {}
    for path in sorted((CONFIGS / "experiment").glob("*.yaml")):
        found = re.search(r"#\s+(python train\.py -m experiment=\S+[^#\n]*)", path.read_text())
        if found:
            out[path.stem] = found.group(1).strip()
    return out


def sweep_axes(overrides: list[str]) -> tuple[list[str], list[list[str]]]:
    """(fixed overrides, the sweep's axes) of `train.py -m <overrides>`: the axes are hydra.sweeper.params and
    the command line's sweeps, each parsed by Hydra's own override parser, as its basic sweeper does."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        params = compose("train", fixed, return_hydra_config=True).hydra.sweeper.params
    swept = [f"{k}={v}" for k, v in (OmegaConf.to_container(params) if params else {}).items()]
    swept += [o.input_line for o in parsed if o.is_sweep_override()]
    axes = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
            for o in parser.parse_overrides(swept)]
    return fixed, axes


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_every_value_of_every_preset_sweep_passes_the_checks(tmp_path, corpus):
    """Each preset's documented sweep: its first job, and each value of each axis with the first job's others,
    compose and pass train.py's checks and build their model config, before anyone spends hours on it."""
    from helpers import compose_cfg

    from minillm.training.run.build import model_config
    from minillm.training.run.checks import check_config

    presets = preset_sweeps()
    assert {"s2_warmup", "s3_lr_sensitivity", "s4_batchnorm", "s5_precision", "s7_depth"} <= set(presets)
    for name, command in presets.items():
        fixed, axes = sweep_axes(shlex.split(command)[3:])
        assert len(axes) >= 1 and all(len(a) >= 2 for a in axes), (name, axes)
        first = [axis[0] for axis in axes]
        jobs = [first] + [first[:i] + [value] + first[i + 1:] for i, axis in enumerate(axes) for value in axis[1:]]
        for job in jobs:
            cfg = compose_cfg(tmp_path, corpus, *fixed, *job)
            check_config(cfg)
            assert model_config(cfg, 11).placement == cfg.placement, (name, job)


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(preset_sweeps()))
def test_preset_sweep_runs_as_documented(preset, tmp_path, shared_cache, corpus):
    """The whole documented sweep of a preset, every job, with README's suffix (minutes: slow). The studies
    generate no samples (cpu_study keeps only the stability callbacks), so the suffix's sample length is left out."""
    command = preset_sweeps()[preset]
    suffix = [a for a in README_SUFFIX[:2] + README_SUFFIX[4:] if not a.startswith("callbacks.text_sample")]
    args = [str(ROOT / "train.py"), *shlex.split(command)[2:], "data=files", f"data.files=[{corpus}]", *suffix]
    ok(cli(args, tmp_path, shared_cache))
    assert summaries(tmp_path / "logs")

