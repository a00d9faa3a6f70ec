"""PreemptionCheckpoint (minillm/training/callbacks/preemption.py): SIGTERM, SIGUSR2 and Ctrl-C stop at a step boundary
with a
checkpoint that resumes exactly, also around a validation."""


from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    FAST,
    MARKER,
    ROOT,
    TINY,
    compose_cfg,
    logged,
    read_rows,
    run_fast,
)

import minillm.training.train as train_script
from minillm.training.checkpointing import (
    read_checkpoint_header,
)

CORPUS_CHARS = 8000  # the corpus fixture's size for this module


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_signal_to_train_py_saves_a_checkpoint_that_resumes_exactly(signum, tmp_path, corpus, full_run):
    """A real `python train.py` gets SIGTERM / Ctrl-C from outside after step 2: it saves preempted.ckpt, logs
    how to resume and exits 128 + signal; resuming continues at step 2 with the uninterrupted run's losses."""
    run_dir = tmp_path / "first"
    cmd = [sys.executable, str(ROOT / "train.py"), *TINY, f"data.files=[{corpus}]", *FAST,
           "+callbacks.wait._target_=helpers.WaitForSignalAt", "+callbacks.wait.step=2",
           f"hydra.run.dir={run_dir}", f"paths.cache_dir={tmp_path / 'cache'}"]
    path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # see sigint
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if MARKER in line:
                proc.send_signal(signum)
                break
        out.extend(proc.stdout)
        rc = proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.stdout.close()
    text = "".join(out)
    ckpt = run_dir / "checkpoints" / "preempted.ckpt"
    assert rc == 128 + signum, text[-3000:]
    assert f"{signum.name}: stopped at step 2" in text and f"ckpt_path={ckpt}" in text, text[-3000:]
    assert "Traceback" not in text
    assert read_checkpoint_header(ckpt)["global_step"] == 2

    resumed = logged(read_rows(run_fast(tmp_path / "resumed", corpus, f"ckpt_path='{ckpt}'")), "train/loss")
    full = logged(read_rows(full_run), "train/loss")
    assert sorted(resumed) == [2, 3, 4, 5]
    assert all(full[s] == resumed[s] for s in resumed), (full, resumed)


def test_first_ctrl_c_stops_after_the_step_with_a_checkpoint(tmp_path, corpus, sigint):
    """In-process Ctrl-C: the same path as SIGTERM (the subprocess test above resumes from it)."""
    cfg = compose_cfg(tmp_path, corpus, *FAST, "+callbacks.signal._target_=helpers.SignalAt",
                      f"+callbacks.signal.signum={int(signal.SIGINT)}", "+callbacks.signal.step=2")
    with pytest.raises(SystemExit) as exit_info:
        train_script.train(cfg)
    assert exit_info.value.code == 128 + signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a later Ctrl-C is a plain one
    ckpt = Path(cfg.paths.output_dir) / "checkpoints" / "preempted.ckpt"
    assert read_checkpoint_header(ckpt)["global_step"] == 2


def test_a_run_started_with_ctrl_c_ignored_keeps_ignoring_it(tmp_path, corpus, sigint):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cfg = compose_cfg(tmp_path, corpus, *FAST, "+callbacks.signal._target_=helpers.SignalAt",
                      f"+callbacks.signal.signum={int(signal.SIGINT)}", "+callbacks.signal.step=2")
    train_script.train(cfg)  # no SystemExit
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert max(logged(read_rows(cfg.paths.output_dir), "train/loss")) == 5  # all 6 steps
    assert not (Path(cfg.paths.output_dir) / "checkpoints" / "preempted.ckpt").exists()


@pytest.mark.parametrize("step, during_validation, val_batches", [
    (3, True, 2),  # signal during a validation: held until it ends, then the run stops
    (3, False, 1),  # signal as the step before a one-batch validation ends: stops after the validation
    (3, False, 2),  # ... before a longer one (Lightning alone would cut it after its first batch and lose it)
    (3, "end", 1),  # signal as the validation ends, after this callback's hook: stops now, not a validation later
])
@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_preemption_around_validation_resumes_exactly(step, during_validation, val_batches, tmp_path, corpus,
                                                      full_run):
    val = f"data.val_windows={8 * val_batches}"  # 8 windows per batch
    cfg = compose_cfg(tmp_path / "first", corpus, *FAST, val,
                      "+callbacks.signal._target_=helpers.SignalAt",
                      f"+callbacks.signal.signum={int(signal.SIGTERM)}", f"+callbacks.signal.step={step}",
                      f"+callbacks.signal.during_validation={during_validation}")
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(SystemExit) as exit_info:
        train_script.train(cfg)
    assert exit_info.value.code == 128 + signal.SIGTERM
    assert {s: signal.getsignal(s) for s in before} == before  # our handlers are gone again
    ckpt = Path(cfg.paths.output_dir) / "checkpoints" / "preempted.ckpt"
    assert read_checkpoint_header(ckpt)["global_step"] == step

    resumed_dir = run_fast(tmp_path / "resumed", corpus, f"ckpt_path={ckpt}", val)
    resumed = logged(read_rows(resumed_dir), "train/loss")
    full = logged(read_rows(full_run if val_batches == 1 else run_fast(tmp_path / "full", corpus, val)), "train/loss")
    assert sorted(resumed) == list(range(step, 6)), resumed  # logged at the same steps, not one later
    assert all(full[s] == resumed[s] for s in resumed), (full, resumed)
    # no validation is lost: the interrupted and the resumed segment together validated at steps 3 and 6
    vals = {**logged(read_rows(cfg.paths.output_dir), "val/loss"), **logged(read_rows(resumed_dir), "val/loss")}
    assert sorted(vals) == [2, 5], vals
