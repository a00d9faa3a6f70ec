"""What users plausibly do wrong, done as they do it: `python train.py` from a fresh folder, W&B on (the default).

Bad input is one line that names the field or the path and what to do, exit code 2, and leaves no run folder
or half-written file behind. Runs that go wrong (a callback that fails, a diverging run in a sweep, a full
disk, a second run in a folder that is in use, a token store changed on disk) end as documented in
docs/reliability.md, never in a traceback or a lost run."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, logged, read_rows, read_wandb_run, write_corpus
from processes import cli, cli_all, finish, ok, start, summaries

from minillm.training.callbacks.common import Observer
from minillm.training.run.show import HEADER

TRAIN = str(ROOT / "train.py")
SMALL = ["model=tiny", "data=files", "data.batch_size=4", "data.val_windows=4", "trainer.max_steps=2",
         "trainer.val_check_interval=2", "callbacks.text_sample.max_new_tokens=8"]
CORPUS_CHARS = 20_000


def small(corpus: Path, *overrides: str) -> list[str]:
    return [TRAIN, *SMALL, f"data.files=[{corpus}]", *overrides]


def error_line(output: str) -> str:
    """The one line that reports the error (``config error: ...``, ``disk error: ...``, ``data error: ...``)."""
    lines = [line for line in output.splitlines() if re.search(r"\b(config|data|checkpoint|disk) error: ", line)]
    assert len(lines) == 1 and "Traceback" not in output, output[-3000:]
    return lines[0]


def left_behind(cwd: Path, log: str | None = None) -> list[str]:
    """Every file or folder under cwd but the command's own output file and empty folders."""
    return sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*")
                  if p.name != log and not (p.is_dir() and not any(p.iterdir())))


MUP = ["model.parametrization=mup", "model.mup_base_width=32"]
# (what the user typed, what the one line must say); {tmp} is the test's folder
BAD_INPUT = [
    (["seed=-1"], "config error: seed=-1 is invalid; allowed: an integer >= 0 and <= 4294967295"),
    (["trainer.max_steps=ten"], "config error: trainer.max_steps='ten' is invalid; allowed: an integer >= 1"),
    (["norm=groupnorm"], "config error: norm=groupnorm is invalid; allowed: batchnorm, derf, dyt, fused_rmsnorm, "
                         "layernorm, none, powernorm, rmsnorm, scalenorm"),
    (["optimizer.learning_rate=1e-3"], "config error: optimizer.learning_rate is not a key of the config; "
                                       "optimizer has: betas, eps, lr, weight_decay"),
    (["seed=[1"], "config error: an override cannot be parsed"),
    (["experiment=cpu_study"], "config error: callbacks.text_sample.max_new_tokens is not a key of the config; "  # a
     "callbacks has: divergence, progress_bar, stability, summary, totals;"),  # preset without the text sample

    (["hydra/launcher=nope"], "config error: hydra/launcher=nope is invalid; allowed: basic, joblib"),
    (["placement=sideways"], "config error: placement='sideways' is invalid; allowed: pre, post"),
    (["trainer.precision=8"], "config error: trainer.precision='8' is invalid; allowed: 32-true"),
    (["name=../x"], "config error: name='../x' is invalid; allowed: a folder name"),
    (["run_id=a/b"], "config error: run_id='a/b' is invalid; allowed: a folder name"),
    (["+model.vocab_size=50"], "the vocabulary of data.tokenizer='char' on this corpus (leave model.vocab_size"),
    (["train=false"], "config error: train=false evaluates a checkpoint: give ckpt_path="),
    (["ckpt_path=auto"], "config error: ckpt_path=auto needs the run to resume: add run_id=<id>"),
    (["norm=batchnorm", "data.batch_size=1"], "config error: data.batch_size=1 is invalid for norm=batchnorm"),
    (["norm=batchnorm", "data.batch_size=1", "model.norm_options.stats=pooled",
      "+model.attn_norm_options.stats=position"], "config error: data.batch_size=1 is invalid for norm=batchnorm"),
    (["model.attn_norm_options=5"], "config error: model.attn_norm_options=5 is invalid; allowed: a mapping of a "
                                    "norm's options"),
    (["+model.attn_norm_options.alpha0=2.0"], "config error: model.attn_norm_options (rmsnorm): norm 'rmsnorm' does "
                                              "not take option(s) ['alpha0']"),
    (["ckpt_path={tmp}"], "config error: ckpt_path='{tmp}' is a folder, not a checkpoint"),
    (["ckpt_path={tmp}/none.ckpt"], "config error: ckpt_path='{tmp}/none.ckpt' does not exist"),
    (["data.cache_dir={tmp}/corpus.txt"], "data error: data.cache_dir='{tmp}/corpus.txt' cannot hold token "
                                          "stores (it is a file)"),
    (["trainer.accumulate_grad_batches=0"], "config error: trainer.accumulate_grad_batches=0 is invalid"),
    (["scheduler=wsd", "decay_from={tmp}/none.ckpt"], "config error: decay_from='{tmp}/none.ckpt' does not exist"),
    (["scheduler=wsd", "decay_from={tmp}"], "config error: decay_from='{tmp}' is a folder, not a checkpoint"),
    (["scheduler=wsd", "decay_from={tmp}/corpus.txt"], "config error: checkpoint '{tmp}/corpus.txt' is a text file"),
    (["model.qk_norm_axis=null"], "config error: model.qk_norm_axis=null is invalid; allowed: head, flat"),
    (["print_config=maybe"], "config error: print_config='maybe' is invalid; allowed: true or false"),
    (["optimizer._target_=torch.optim.Muon"], "config error: optimizer._target_=torch.optim.Muon would be given every "
                                              "parameter, but Muon only takes the 2-D hidden matrices; allowed: "
                                              "optimizer=muon"),
    # muP's rule for the optimizer and a norm's own options: before the config tree, the W&B start and the data
    (MUP + ["optimizer=muon", "optimizer.adjust_lr_fn=match_rms_adamw"],
     "config error: optimizer.adjust_lr_fn='match_rms_adamw' is invalid; allowed: null or original with "
     "model.parametrization=mup"),
    (MUP + ["optimizer._target_=torch.optim.NAdam"], "config error: optimizer NAdam has no muP lr rule"),
    (["norm=derf", "model.norm_options.alpha0=-1"], "config error: model.norm_options (derf): alpha0=-1 is invalid"),
    # the components' own checks (data, callbacks, module), before the config tree is printed
    (["data.seq_len=0"], "config error: data.seq_len=0 is invalid"),
    (["callbacks.text_sample.max_new_tokens=-1"], "config error: callbacks.text_sample.max_new_tokens=-1 is invalid"),
    (["module.z_loss=-1"], "config error: module.z_loss=-1 is invalid"),
]


@pytest.mark.parametrize("overrides, message", BAD_INPUT, ids=[" ".join(o) for o, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(overrides, message, tmp_path, shared_cache, corpus):
    (tmp_path / "corpus.txt").write_text(corpus.read_text())
    cwd = tmp_path / "work"
    cwd.mkdir()
    pid, log = start(small(tmp_path / "corpus.txt", *(o.format(tmp=tmp_path) for o in overrides)), cwd, shared_cache)
    out = finish(pid, log, overrides)
    assert out.returncode == 2, out.output[-3000:]
    assert message.format(tmp=tmp_path) in error_line(out.output)
    assert HEADER not in out.output  # the error is never buried under the config tree: it is printed after the checks
    assert left_behind(cwd, log.name) == [] and not (tmp_path / "x").exists()  # no run folder, in logs/ or out


# minillm-replay: (the arguments, what its one line must say); {run} is a 4-step run with checkpoints at steps 2 and 4
BAD_REPLAY = [
    ([], "minillm-replay: error: CKPT and --steps A:B are required (or --plot DIR...)"),
    (["{run}/checkpoints"], "minillm-replay: error: CKPT and --steps A:B are required"),
    (["{run}/checkpoints", "--steps", "3:2"], "minillm-replay: error: --steps '3:2' is invalid; allowed: A:B with "
                                              "0 <= A < B"),
    (["{run}/checkpoints", "--steps", "2-4"], "minillm-replay: error: --steps '2-4' is invalid; allowed: A:B"),
    (["{run}/none.ckpt", "--steps", "2:4"], "minillm-replay: error: CKPT '{run}/none.ckpt' does not exist; allowed: "
                                            "a checkpoint, a spikes/step_<N>.json, or a folder of checkpoints"),
    (["{run}/checkpoints", "--steps", "0:4"], "minillm-replay: error: CKPT '{run}/checkpoints' holds no checkpoint "
                                              "at or before step 0 (--steps)"),
    (["{run}/checkpoints/step-2.ckpt", "--steps", "0:4"], "minillm-replay: error: --steps 0:4 starts before the "
                                                          "checkpoint's step 2; allowed: A >= 2"),
    (["{run}/checkpoints", "--steps", "2:9"], "minillm-replay: error: --steps 2:9 goes past the run's last step "
                                              "(trainer.max_steps=4); allowed: B <= 4"),
    (["{run}/checkpoints", "--steps", "2:4", "data.batch_size=2"],
     "minillm-replay: error: the override data.batch_size=2 cannot be replayed (it would change the batches or is "
     "not a stability knob); allowed: norm=, placement=, model.qk_norm="),
    (["{run}/checkpoints", "--steps", "2:4", "seed=3"], "minillm-replay: error: the override seed=3 cannot be "
                                                        "replayed"),
    (["{run}/checkpoints", "--steps", "2:4", "norm=groupnorm"], "minillm-replay: error: norm=groupnorm is invalid; "
                                                                "allowed: batchnorm, derf, dyt"),
    (["{run}/checkpoints", "--steps", "2:4", "optimizer.lr=-1"], "minillm-replay: error: optimizer.lr=-1"),
    (["{run}/checkpoints", "--steps", "2:4", "--out", "{run}"], "minillm-replay: error: --out '{run}' is not empty; "
                                                                "allowed: a new or empty folder"),
    (["{run}/checkpoints", "--steps", "2:4", "--bogus"], "minillm-replay: error: unrecognized arguments: --bogus"),
    (["--plot", "{run}/checkpoints"], "minillm-replay: error: --plot {run}/checkpoints: no replay there"),
]


@pytest.fixture(scope="module")
def replayable(tmp_path_factory, shared_cache, corpus) -> Path:
    """A 4-step run with W&B on and checkpoints after steps 2 and 4."""
    cwd = tmp_path_factory.mktemp("replayable")
    ok(cli(small(corpus, "trainer.max_steps=4", "name=r", "run_id=a",
                 "callbacks.step_checkpoints.every_n_train_steps=2"), cwd, shared_cache))
    return cwd / "logs" / "r" / "runs" / "a"


@pytest.mark.parametrize("args, message", BAD_REPLAY, ids=[" ".join(a) or "nothing" for a, _ in BAD_REPLAY])
def test_bad_replay_input_is_one_line_exit_2_and_leaves_nothing(args, message, replayable, tmp_path, shared_cache):
    before = left_behind(replayable)
    pid, log = start(["-m", "minillm.tools.replay", *(a.format(run=replayable) for a in args)], tmp_path, shared_cache)
    out = finish(pid, log, args)
    lines = [line for line in out.output.splitlines() if "error: " in line]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.output, out.output[-3000:]
    assert lines[0].startswith(message.format(run=replayable)), lines[0]
    assert left_behind(tmp_path, log.name) == [] and left_behind(replayable) == before  # no replay folder


@pytest.mark.parametrize("overrides, message", [
    (["model.dim=33"], "config error: model.dim=33 is invalid"),
    (["norm=derf", "model.norm_options.alpha0=0"], "config error: model.norm_options (derf): alpha0=0 is invalid"),
    (MUP + ["optimizer=muon", "optimizer.adjust_lr_fn=match_rms_adamw"], "config error: optimizer.adjust_lr_fn="),
], ids=["dim", "derf alpha0", "mup muon"])
def test_a_model_config_error_comes_before_the_data_is_prepared(overrides, message, tmp_path, corpus):
    """A BPE trains for minutes on a real corpus: a wrong model.dim, a norm's option or an optimizer muP has no rule
    for must not wait for it."""
    cache = tmp_path / "cache"
    out = cli(small(corpus, "data.tokenizer=bpe", "data.vocab_size=300", *overrides), tmp_path, cache)
    assert out.returncode == 2 and message in error_line(out.output)
    assert not cache.exists() or not any(cache.iterdir())  # no token store was built


# --- runs that go wrong ------------------------------------------------------------------------------------


def test_a_long_warmup_with_wandb_on_trains_and_a_two_step_run_is_not_trained(tmp_path, shared_cache, corpus):
    """The gains have not moved after one step of a 2,000-step warmup: the W&B histograms of constant values
    must not stop the run. Its loss is still at ln V: not_trained, not diverged."""
    ok(cli(small(corpus, "scheduler.warmup_steps=2000", "callbacks.histograms.every_n_steps=1"), tmp_path,
           shared_cache))
    (summary,) = summaries(tmp_path / "logs")
    assert summary["status"] == "not_trained" and not summary["diverged"] and summary["failed"]
    assert summary["callback_errors"] is None and summary["steps"] == 2


def test_a_diverging_run_in_a_sweep_ends_as_diverged_and_the_sweep_goes_on(tmp_path, shared_cache, corpus):
    """fp16 weights overflow at once; the histogram callback then sees infinite values, which it leaves out."""
    args = small(corpus, "callbacks.histograms.every_n_steps=1", "trainer.precision=16-true,32-true")
    ok(cli([args[0], "-m", *args[1:]], tmp_path, shared_cache))
    by_precision = {s["precision"]: s for s in summaries(tmp_path / "logs")}
    assert by_precision["16-true"]["status"] == "diverged" and by_precision["16-true"]["callback_errors"] is None
    assert by_precision["32-true"]["status"] in ("completed", "not_trained")


def test_a_run_that_diverges_before_its_first_validation_leaves_no_non_finite_checkpoint(tmp_path, shared_cache,
                                                                                        corpus):
    """fp16 weights overflow at the first step, long before the validation at step 4: the fit's end must not save
    those weights as last.ckpt (nothing good was ever saved, so there is no checkpoint at all)."""
    ok(cli(small(corpus, "trainer.max_steps=4", "trainer.val_check_interval=4", "trainer.precision=16-true",
                 "logger=csv", "run_id=d"), tmp_path, shared_cache))
    run = tmp_path / "logs" / "default" / "runs" / "d"
    assert json.loads((run / "summary.json").read_text())["status"] == "diverged"
    assert sorted(p.name for p in run.rglob("*.ckpt")) == []


class Broken(Observer):
    """Stands for any logging callback with a bug: it raises at the second step."""

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == 2:
            raise RuntimeError("a bug in a logging callback")


def test_an_observing_callback_that_fails_is_turned_off_and_training_goes_on(tmp_path, shared_cache, corpus):
    out = ok(cli(small(corpus, "trainer.max_steps=4", "trainer.log_every_n_steps=1",
                     "+callbacks.broken._target_=test_hostile.Broken"), tmp_path,
                 shared_cache))
    assert "callback Broken failed in on_train_batch_end: RuntimeError: a bug in a logging callback; it is off" in out
    (summary,) = summaries(tmp_path / "logs")
    assert summary["steps"] == 4 and summary["callback_errors"] == {
        "Broken": "on_train_batch_end: RuntimeError: a bug in a logging callback"}
    (run,) = (tmp_path / "logs" / "default" / "runs").iterdir()
    assert max(int(r["step"]) for r in read_rows(run) if r.get("train/loss")) == 3  # every step logged


def test_the_resume_hint_printed_at_a_stop_resumes_that_run(tmp_path, shared_cache, corpus):
    """No run_id: the stop prints a command that continues this run in its own folder, not a fresh one."""
    args = small(corpus, "trainer.max_steps=6", "trainer.val_check_interval=3", "test=false")
    stop = ["+callbacks.signal._target_=helpers.SignalAt", "+callbacks.signal.signum=15",
            "+callbacks.signal.step=2"]
    out = cli([*args, *stop], tmp_path, shared_cache)
    assert out.returncode == 143, out.output[-3000:]
    hint = re.search(r"resume this run with the same command plus (ckpt_path=\S+)", out.output).group(1)
    ok(cli([*args, hint], tmp_path, shared_cache))
    (run,) = (tmp_path / "logs" / "default" / "runs").iterdir()  # one run folder, the stopped run's
    (summary,) = summaries(run)
    assert summary["status"] in ("completed", "not_trained") and summary["steps"] == 6


def test_two_runs_with_one_run_id_at_once_the_second_is_refused(tmp_path, shared_cache, corpus):
    args = small(corpus, "run_id=same", "trainer.max_steps=40", "trainer.val_check_interval=20")
    first, second = cli_all([args, args], tmp_path, shared_cache)
    codes = sorted([first.returncode, second.returncode])
    assert codes == [0, 2], (first.output[-2000:], second.output[-2000:])
    refused = first if first.returncode == 2 else second
    folder = tmp_path / "logs" / "default" / "runs" / "same"
    assert f"config error: the run folder {folder} is in use by another run" in error_line(refused.output)
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    steps = [int(r["step"]) for r in read_rows(folder) if r.get("train/loss")]
    assert steps == [9, 19, 29, 39]  # one run's rows (every 10 steps), once
    assert len(summaries(folder)) == 1 and not list((folder / ".hydra").glob("resumed-*"))
    assert "is in use by another run" not in (folder / "train.log").read_text()  # the running run's log is its own


def test_a_nan_model_reports_no_perfect_score(tmp_path, shared_cache, corpus):
    """fp16 weights overflow at once: val/loss is NaN, and so is every metric derived from it (bpb was 0.0000, from a
    sum that left the NaNs out), in metrics.csv, the console and the held-out pass."""
    out = ok(cli(small(corpus, "trainer.precision=16-true", "logger=csv", "run_id=fp16"), tmp_path, shared_cache))
    rows = read_rows(tmp_path / "logs" / "default" / "runs" / "fp16")
    for stage in ("val", "test"):
        values = [float(r[f"{stage}/{m}"]) for r in rows if r.get(f"{stage}/loss")
                  for m in ("loss", "ppl", "bpb", "bpc")]
        assert values and not any(math.isfinite(v) for v in values), (stage, values)
    assert "bpb 0.0000" not in out and "bpb=0.0000" not in out and "test/bpb=nan" in out


def test_debug_overfit_is_a_completed_run_whose_val_loss_falls(tmp_path, shared_cache, corpus):
    """debug=overfit trains on one batch and validates on it: the memorized batch's loss falls with the train loss,
    so the run completes (it read as diverged: the held-out loss rises as the model memorizes)."""
    ok(cli(small(corpus, "debug=overfit", "trainer.max_steps=60", "trainer.val_check_interval=30", "optimizer.lr=1e-2",
                 "logger=csv", "run_id=ov"), tmp_path, shared_cache))
    (summary,) = summaries(tmp_path / "logs" / "default" / "runs" / "ov")
    vals = logged(read_rows(tmp_path / "logs" / "default" / "runs" / "ov"), "val/loss")
    assert summary["status"] == "completed" and not summary["diverged"] and vals[59] < 0.5 * vals[29], vals


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_ctrl_c_in_a_sweep_prints_the_command_that_resumes_the_sweep(tmp_path, shared_cache, corpus):
    """Ctrl-C in job 0 of a two-job sweep stops the sweep; the printed command (the same -m command plus run_id and
    ckpt_path=auto) continues job 0 in its folder and runs job 1, in the same sweep folder; run again, it does
    nothing, and the sweep's closing line counts its jobs."""
    args = small(corpus, "trainer.max_steps=4", "logger=csv", "test=false", "name=sw",
                 "+callbacks.signal._target_=helpers.SignalAt", "+callbacks.signal.signum=2",
                 "+callbacks.signal.step=1,99")  # job 0 gets Ctrl-C after step 1, job 1 never
    sweep = [args[0], "-m", *args[1:]]
    stopped = cli(sweep, tmp_path, shared_cache)
    assert stopped.returncode == 130 and "Traceback" not in stopped.output, stopped.output[-3000:]
    extra = re.search(r"resume this sweep with the same command plus (run_id=\S+ ckpt_path=auto)", stopped.output)
    (folder,) = (tmp_path / "logs" / "sw" / "multiruns").iterdir()
    assert extra is not None and f"run_id={folder.name}" in extra.group(1), stopped.output[-2000:]
    resumed = ok(cli([*sweep, *extra.group(1).split()], tmp_path, shared_cache))
    assert [p.name for p in (tmp_path / "logs" / "sw" / "multiruns").iterdir()] == [folder.name]  # no new sweep
    jobs = summaries(folder)
    assert len(jobs) == 2 and {s["status"] for s in jobs} <= {"completed", "not_trained"}
    assert all(s["steps"] == 4 for s in jobs) and "sweep ended, 2 jobs: " in resumed
    assert f"python -m minillm.analysis.report {folder.relative_to(tmp_path)}" in resumed.strip().splitlines()[-1]
    again = ok(cli([*sweep, *extra.group(1).split()], tmp_path, shared_cache))
    assert again.count("ckpt_path=auto: this run has ended, nothing to resume") == 2


def test_a_crashed_job_is_left_as_it_is_when_its_sweep_is_run_again(tmp_path, shared_cache, corpus):
    """A job that crashed (status failed, no checkpoint) does not stop its sweep's rerun with ckpt_path=auto (it
    stopped the whole rerun with "holds a run but no checkpoint"): it is left as it is, in one line that says how to
    run it again, and the sweep's other jobs go on."""
    args = small(corpus, "trainer.max_steps=3", "logger=csv", "test=false", "name=cr", "run_id=cr",
                 "+callbacks.crash._target_=helpers.CrashAt", "+callbacks.crash.at_step=1,99")
    sweep = [args[0], "-m", *args[1:]]
    first = cli(sweep, tmp_path, shared_cache)
    (folder,) = (tmp_path / "logs" / "cr" / "multiruns").iterdir()
    before = summaries(folder)
    assert [s["status"] for s in before] == ["failed", "completed"], first.output[-3000:]
    again = ok(cli([*sweep, "ckpt_path=auto"], tmp_path, shared_cache))
    assert again.count("ckpt_path=auto: this run crashed at step 1 (") == 1, again[-3000:]
    assert f"left as it is (remove {folder / '0'} to run it again)" in again
    assert again.count("ckpt_path=auto: this run has ended, nothing to resume") == 1
    assert summaries(folder) == before


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_job_stopped_by_a_full_disk_does_not_stop_its_sweep(launcher, tmp_path, shared_cache, corpus):
    """A job that ends in one line of its own (a full disk while it trains) fails as a job: the sweep's other jobs
    run, and the sweep ends with exit code 2 (the job's SystemExit ended the whole sweep, under joblib its other
    jobs too)."""
    args = small(corpus, "trainer.max_steps=3", "test=false", "name=fd", "run_id=fd",
                 "+callbacks.full._target_=helpers.FullDiskAt", "+callbacks.full.at_step=1,99",
                 f"hydra/launcher={launcher}", *(["hydra.launcher.n_jobs=2"] if launcher == "joblib" else []))
    out = cli([args[0], "-m", *args[1:]], tmp_path, shared_cache)
    assert out.returncode == 2, out.output[-3000:]
    (folder,) = (tmp_path / "logs" / "fd" / "multiruns").iterdir()
    assert "disk error: cannot write in " in error_line(out.output)
    assert (folder / "1" / "summary.json").exists(), out.output[-3000:]
    assert json.loads((folder / "1" / "summary.json").read_text())["status"] == "completed"
    (wandb_run,) = (folder / "1" / "wandb").glob("offline-run-*")  # W&B on, as by default: the job's run ends whole
    assert read_wandb_run(wandb_run)["summary"]["status"] == "completed"


@pytest.mark.parametrize("values, message", [
    (["seed=0,abc"], "config error: seed='abc' is invalid; allowed: an integer >= 0 and <= 4294967295 (in job #1 of "
                     "the sweep: seed=abc; no job has run)"),
    (["norm=layernorm,rmsnorm", "model.norm_options.eps_mode=inside,sideways"], "(in job #1 of the sweep: "
     "norm=layernorm model.norm_options.eps_mode=sideways; no job has run)"),
], ids=["seed", "norm option"])
def test_a_bad_value_in_a_later_sweep_job_is_refused_before_the_first_trains(values, message, tmp_path,
                                                                             shared_cache, corpus):
    """Every job of a sweep is checked at its start: the one line names the job and its values, and nothing is
    written (no sweep folder, no job trained)."""
    args = small(corpus, "logger=csv", *values)
    pid, log = start([args[0], "-m", *args[1:]], tmp_path, shared_cache)
    out = finish(pid, log, values)
    assert out.returncode == 2 and message in error_line(out.output), out.output[-3000:]
    assert "Launching" not in out.output and left_behind(tmp_path, log.name) == []


def test_a_sweep_prints_one_config_tree(tmp_path, shared_cache, corpus):
    """The resolved config's tree (about 230 lines) once per sweep, job 0's; each later job one line to its file."""
    args = small(corpus, "logger=csv", "test=false", "seed=0,1,2")
    out = ok(cli([args[0], "-m", *args[1:]], tmp_path, shared_cache))
    assert out.count("├── model\n") == 1 and out.count("job #0's tree, with this job's overrides") == 2, out[-3000:]
    (sweep,) = (tmp_path / "logs" / "default" / "multiruns").iterdir()
    assert "├── model" in (sweep / "0" / "train.log").read_text()
    assert f"(in full: {sweep / '2'}/.hydra/config.yaml)" in (sweep / "2" / "train.log").read_text()


def test_the_closing_line_says_failed_quotes_paths_and_an_empty_spike_capture_says_so(tmp_path, shared_cache,
                                                                                      corpus):
    """A 2-step run completes with a final val loss above the unigram loss (it counts as failed), in a folder whose
    path has a space, with spike capture on and no spike."""
    import shlex

    cwd = tmp_path / "my runs"
    cwd.mkdir()
    out = ok(cli(small(corpus, "logger=csv", "run_id=a", "callbacks.spike.steps=2"), cwd, shared_cache))
    run = cwd / "logs" / "default" / "runs" / "a"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["failed"], summary
    last = out.strip().splitlines()[-1]
    assert last.startswith("[") and "run completed after 2 steps (final val loss" in last
    assert f"; it counts as failed: final val loss >= {summary['unigram_loss']:.4f}, the unigram loss" in last
    assert last.endswith(f"table and plots: python -m minillm.analysis.report {shlex.quote(str(run))}"), last
    assert shlex.split(last.rsplit("table and plots: ", 1)[1])[-1] == str(run)
    assert f"callbacks.spike: no loss spike or divergence in this run; nothing written to {run / 'spikes'}" in out


def test_train_false_reads_the_model_config_from_the_checkpoint(tmp_path, shared_cache, corpus):
    """A checkpoint of a non-default model (3 layers, v_norm, LayerNorm, Post-LN) evaluates with train=false and its
    path only, to the run's own test loss; a model setting given on the command line is still checked against it."""
    ok(cli(small(corpus, "logger=csv", "run_id=big", "model.n_layers=3", "model.v_norm=true", "norm=layernorm",
                 "placement=post"), tmp_path, shared_cache))
    run = tmp_path / "logs" / "default" / "runs" / "big"
    trained = json.loads((run / "summary.json").read_text())
    ckpt = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    ok(cli(small(corpus, "logger=csv", "train=false", ckpt), tmp_path, shared_cache))
    (evaluation,) = run.glob("evaluations/*/evaluation.json")
    assert json.loads(evaluation.read_text())["test_loss"] == pytest.approx(trained["test_loss"])
    out = cli(small(corpus, "logger=csv", "train=false", "norm=rmsnorm", ckpt), tmp_path, shared_cache)
    assert out.returncode == 2 and "trained with a different model config (norm: checkpoint 'layernorm'" in error_line(
        out.output)


# a Ctrl-C that lands while Python imports Lightning (the interpreter raises KeyboardInterrupt there), made
# deterministic: a signal sent after a fixed delay lands in the imports only on a slow enough machine
CTRL_C_IN_IMPORTS = """
import builtins, runpy, sys
real = builtins.__import__
def ctrl_c(name, *args, **kwargs):
    if name.split(".")[0] == "lightning":
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)
builtins.__import__ = ctrl_c
if sys.argv[1] == "train.py":
    runpy.run_path(sys.argv[2], run_name="__main__")
else:  # what the console script's wrapper runs
    from minillm.training.entry import main
    sys.exit(main())
"""


@pytest.mark.parametrize("entry", ["train.py", "minillm-train"])
def test_ctrl_c_while_train_py_imports_its_libraries_is_one_line(entry, tmp_path):
    """Ctrl-C while train.py or the console script imports torch, Lightning and Hydra: one line, exit 130."""
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CTRL_C_IN_IMPORTS, entry, str(TRAIN)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    line = "stopped by SIGINT (Ctrl-C) while Python imported minillm's libraries: nothing ran, nothing was written"
    assert out.returncode == 130 and (out.stdout + out.stderr).strip().splitlines() == [line], out.stderr[-2000:]
    assert left_behind(tmp_path) == []


WARNED = [  # (what the user typed, the start of the warning line each setting gets)
    (["model.qk_norm_axis=flat", "model.branch_scale_init=0.5", "+scheduler.decay_fraction=0.3",
      "model.parametrization=mup", "model.mup_base_width=64", "model.attn_scale=0.2"],
     ["model.qk_norm_axis=flat does nothing without a QK-norm (model.qk_norm=none)",
      "model.branch_scale_init=0.5 does nothing with model.branch_scale=none",
      "scheduler.decay_fraction=0.3 does nothing with scheduler.kind=cosine",
      "model.attn_scale=0.2 replaces muP's attention scale",
      "model.mup_base_width=64 is above model.dim=32"]),
    (["model.ngpt=true", "norm=none", "model.parametrization=mup", "model.mup_base_width=32", "optimizer=muon"],
     ["model.ngpt=true with model.parametrization=mup: nGPT puts every matrix back on the unit sphere",
      "optimizer.weight_decay=0.01 with model.ngpt=true: nGPT trains without weight decay"]),
    ([], []),
]


@pytest.mark.parametrize("overrides, warned", WARNED, ids=["idle and muP", "nGPT", "default"])
def test_settings_that_do_nothing_or_override_a_rule_get_one_warning_line_each(overrides, warned, tmp_path,
                                                                               shared_cache, corpus):
    out = ok(cli(small(corpus, "logger=csv", *overrides), tmp_path, shared_cache))
    lines = [line.split("warning: ", 1)[1] for line in out.splitlines() if "[minillm][WARNING] - warning: " in line]
    assert len(lines) == len(warned) and all(got.startswith(want) for got, want in zip(lines, warned, strict=True)), \
        lines


def test_a_token_store_changed_on_disk_is_one_error_naming_the_folder(tmp_path, corpus):
    cache = tmp_path / "cache"
    ok(cli(small(corpus, "logger=csv"), tmp_path, cache))
    (store,) = [p for p in cache.iterdir() if p.is_dir()]
    with open(store / "train.bin", "r+b") as f:  # same size, bytes overwritten: ids outside the vocabulary
        f.seek(100)
        f.write(b"\xff" * 64)
    cwd = tmp_path / "again"
    cwd.mkdir()
    pid, log = start(small(corpus), cwd, cache)
    out = finish(pid, log, [])
    assert out.returncode == 2
    line = error_line(out.output)
    assert f"data error: token cache {str(store)!r} is unreadable" in line and "delete that folder" in line
    assert left_behind(cwd, log.name) == []


# --- file systems that refuse -------------------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size, read_only) -> a folder on a tmpfs of that size (unmounted after the test); skips where this
    process may not mount (CI and the development machines run the tests as root)."""
    mounted = []

    def mount(size: str = "1m", read_only: bool = False) -> Path:
        folder = tmp_path / f"fs{len(mounted)}"
        folder.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_a_read_only_log_folder_is_one_line(tmp_path, shared_cache, corpus, tmpfs):
    logs = tmpfs(read_only=True)
    out = cli(small(corpus, f"paths.log_dir={logs}"), tmp_path, shared_cache)
    assert out.returncode == 2
    assert f"disk error: cannot write {logs}/default" in error_line(out.output)
    assert "Read-only file system" in out.output


def test_a_full_cache_is_one_line_naming_data_cache_dir_not_the_input(tmp_path, tmpfs):
    """The token store does not fit the cache's disk: the line names data.cache_dir (it blamed the input text)."""
    cache = tmpfs(size="300k")
    book = write_corpus(tmp_path / "book.txt", n_chars=400_000)
    out = cli(small(book, f"data.cache_dir={cache}"), tmp_path, tmp_path / "unused")
    assert out.returncode == 2
    line = error_line(out.output)
    assert f"data error: data.cache_dir='{cache}' cannot hold the token store" in line and "No space left" in line
    assert not any(cache.iterdir())  # the half-built store is gone


def test_a_read_only_cache_is_one_line_naming_data_cache_dir(tmp_path, corpus, tmpfs):
    cache = tmpfs(read_only=True)
    out = cli(small(corpus, f"data.cache_dir={cache}"), tmp_path, tmp_path / "unused")
    assert out.returncode == 2
    assert (f"data error: data.cache_dir='{cache}' cannot hold token stores (Read-only file system)"
            in error_line(out.output))
    assert not (tmp_path / "logs").exists() or left_behind(tmp_path / "logs") == []


def test_a_full_disk_ends_the_run_in_one_line_with_nothing_half_written(tmp_path, shared_cache, corpus, tmpfs):
    """The run folder's disk fills up when the first checkpoint is written (the tiny model's optimizer state
    does not fit): one line, exit 2, no partial checkpoint or summary."""
    logs = tmpfs(size="160k")
    out = cli(small(corpus, f"paths.log_dir={logs}", "logger=csv"), tmp_path, shared_cache)
    assert out.returncode == 2
    line = error_line(out.output)  # the one line: no "Error executing job" of Hydra's before it
    assert f"disk error: cannot write {logs}/" in line and "No space left on device" in line, line
    files = [p for p in logs.rglob("*") if p.is_file()]
    assert not [p for p in files if ".tmp" in p.name], files
    for summary in logs.rglob("summary.json"):
        json.loads(summary.read_text())  # complete, if written at all


def test_the_sweep_check_goes_on_past_a_job_whose_error_is_not_about_the_config(monkeypatch, capsys):
    """A job whose check meets an error that is not a refusal (that job will meet it itself) does not end the
    check: a refused later job is still found before anything runs."""
    from minillm.errors import ConfigError
    from minillm.training.run import checks_sweep

    def check(config, job):
        if job == ["seed=0"]:
            raise RuntimeError("not about the config")
        raise ConfigError("seed: 'abc' is not an integer")

    monkeypatch.setattr(checks_sweep, "sweep_jobs", lambda config: ([["seed=0"], ["seed=abc"]], {"seed"}))
    monkeypatch.setattr(checks_sweep, "check_job", check)
    with pytest.raises(SystemExit) as stop:
        checks_sweep.SweepCheck().on_multirun_start(None)
    assert stop.value.code == 2 and "in job #1 of the sweep: seed=abc" in capsys.readouterr().err
