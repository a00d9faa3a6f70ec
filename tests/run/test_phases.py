"""A stop signal in every phase of a run, sent to a real `python train.py` process: set-up, a training step, a
validation, the final sample, the held-out test and the final writes. Each leaves a true status, a resumable
checkpoint and a closing line that says how to resume; the resume finishes the missing phases and ends where an
uninterrupted run ends (minillm/training/run/signals.py, docs/reliability.md)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from helpers import ROOT, logged, read_rows
from processes import cli, ok

CORPUS_CHARS = 20_000
RUN = [str(ROOT / "train.py"), "model=tiny", "data=files", "data.batch_size=4", "data.val_windows=4",
       "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.log_every_n_steps=1", "logger=csv",
       "callbacks.text_sample.max_new_tokens=8", "callbacks.text_sample.every_validation=false", "run_id=r"]
SIGNAL_IN = "+callbacks.signal._target_=helpers.SignalIn"
SIGNAL_AT = "+callbacks.signal._target_=helpers.SignalAt"
# phase -> the overrides that send the signal there ({s}: its number)
PHASES = {
    "set-up": [SIGNAL_IN, "+callbacks.signal.phase=setup", "+callbacks.signal.signum={s}"],
    "fit": [SIGNAL_AT, "+callbacks.signal.step=2", "+callbacks.signal.signum={s}"],  # after a training step
    "validation": [SIGNAL_AT, "+callbacks.signal.step=4", "+callbacks.signal.during_validation=true",
                   "+callbacks.signal.signum={s}"],  # the last one: the final sample is still to come
    "sample": [SIGNAL_IN, "+callbacks.signal.phase=train_end", "+callbacks.signal.signum={s}"],
    "test": [SIGNAL_IN, "+callbacks.signal.phase=test", "+callbacks.signal.signum={s}"],
    "final writes": ["+logger.signal._target_=helpers.SignalingLogger", "+logger.signal.signum={s}"],
}
HINT = re.compile(r"resume this run with the same command plus (ckpt_path=\S+)")


def command(corpus: Path, name: str, *overrides: str) -> list[str]:
    return [*RUN, f"data.files=[{corpus}]", f"name={name}", *overrides]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, shared_cache, corpus) -> dict:
    cwd = tmp_path_factory.mktemp("full")
    ok(cli(command(corpus, "full"), cwd, shared_cache))
    run = cwd / "logs" / "full" / "runs" / "r"
    return {"summary": json.loads((run / "summary.json").read_text()), "rows": read_rows(run),
            "samples": (run / "samples.txt").read_text()}


def check_phase(phase: str, signum: int, tmp_path: Path, cache: Path, corpus: Path, full: dict) -> None:
    name = phase.replace(" ", "-")
    run = tmp_path / "logs" / name / "runs" / "r"
    stopped = cli(command(corpus, name, *(o.format(s=signum) for o in PHASES[phase])), tmp_path, cache)
    out, sig = stopped.output, signal.Signals(signum).name
    assert "Traceback" not in out, out[-3000:]
    closing = out.strip().splitlines()[-1]  # the closing line comes last
    assert " - run " in closing, out[-3000:]
    if phase == "final writes":  # the run is complete: the writes finish, then it exits as a completed run
        assert stopped.returncode == 0 and f"(a {sig} during the final writes waited for them)" in closing, out[-3000:]
        resumed = out
    elif phase == "set-up":  # nothing trained, nothing kept; the same command again is the resume
        assert stopped.returncode == 128 + signum and f"run stopped by {sig} during set-up" in closing, out[-3000:]
        assert not (tmp_path / "logs" / name).exists() or not any((tmp_path / "logs" / name).rglob("*.*"))
        resumed = ok(cli(command(corpus, name), tmp_path, cache))
    else:
        assert stopped.returncode == 128 + signum, out[-3000:]
        assert f"run stopped by {sig} at step " in closing and "(preempted)" in closing, closing
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "preempted" and summary["failed"] is None and summary["error"] is None
        hint = HINT.search(closing).group(1)
        assert Path(hint.split("=", 1)[1]).is_file()  # a resumable checkpoint
        resumed = ok(cli(command(corpus, name, hint), tmp_path, cache))  # the same command, the fault left out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == full["summary"]["status"] and summary["steps"] == 4, resumed[-3000:]
    for key in ("final_val_loss", "best_val_loss", "test_loss", "test_weights", "tokens"):
        assert summary[key] == full["summary"][key], key
    rows = read_rows(run)
    for key in ("train/loss", "val/loss", "test/loss"):
        assert logged(rows, key) == logged(full["rows"], key), key  # every step once, as the uninterrupted run
    assert (run / "samples.txt").read_text() == full["samples"]  # the final sample, once
    assert " - run " in resumed.strip().splitlines()[-1] and str(run) in resumed.strip().splitlines()[-1]


@pytest.mark.parametrize("phase, signum", [("set-up", signal.SIGINT), ("fit", signal.SIGTERM),
                                           ("validation", signal.SIGINT), ("sample", signal.SIGTERM),
                                           ("test", signal.SIGINT), ("final writes", signal.SIGTERM)])
@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_a_signal_in_each_phase_leaves_a_true_status_and_a_resume_that_finishes_the_run(
        phase, signum, tmp_path, shared_cache, corpus, uninterrupted, sigint):
    check_phase(phase, signum, tmp_path, shared_cache, corpus, uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize("phase, signum", [("set-up", signal.SIGTERM), ("fit", signal.SIGINT),
                                           ("validation", signal.SIGTERM), ("sample", signal.SIGINT),
                                           ("test", signal.SIGTERM), ("final writes", signal.SIGINT)])
def test_the_other_signal_in_each_phase(phase, signum, tmp_path, shared_cache, corpus, uninterrupted, sigint):
    check_phase(phase, signum, tmp_path, shared_cache, corpus, uninterrupted)
