"""Commands run as a user runs them, fast: each one a process forked from the test process (which has already
imported minillm, torch, Lightning, Hydra and W&B, ~8 s per fresh interpreter), that runs the script as
__main__ with its own argv, working directory and environment, its output in a file (not a terminal)."""

from __future__ import annotations

import io
import json
import os
import runpy
import shlex
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import wandb.sdk.launch.inputs.internal  # noqa: F401  (what wandb.init imports: ~3 s, once, not per process)

import minillm.training.data  # noqa: F401  (with datasets: imported once here, for the forked commands)
import minillm.training.train  # noqa: F401


class Result:
    """What a command left: its exit code and everything it printed (stdout and stderr, in order)."""

    def __init__(self, args: list[str], returncode: int, output: str):
        self.args, self.returncode, self.output = args, returncode, output


def environ(cache: Path, env: dict[str, str]) -> dict[str, str]:
    environ = {**os.environ, "MINILLM_CACHE": str(cache), "OMP_NUM_THREADS": "1", **env}
    environ.pop("WANDB_MODE", None)  # W&B as configured: offline
    return environ


def start(args: list[str], cwd: Path, cache: Path, setup: Callable[[], None] | None = None,
          **env: str) -> tuple[int, Path]:
    """Start `python <args>` in cwd as a new process whose stdout and stderr go to a file (not a terminal).

    The process is forked from this one, which has already imported minillm and its libraries, W&B included
    (that takes ~8 s per process); it then runs the script (train.py, or the module after -m) as __main__ with
    its own argv, cwd and environment, exactly as the interpreter would. test_readme_commands_in_fresh_
    interpreters (slow) runs the same commands with a new interpreter each. ``setup`` runs in the child first
    (e.g. to give it a mount namespace of its own)."""
    log = Path(tempfile.mkstemp(suffix=".log", dir=cwd)[1])
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            fd = os.open(log, os.O_WRONLY | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
            os.chdir(cwd)
            if setup is not None:
                setup()
            os.environ.clear()
            os.environ.update(environ(cache, env))
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.argv = list(args)
            if args[0] == "-m":
                sys.argv = [args[1], *args[2:]]
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(args[0], run_name="__main__")
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid, log


def finish(pid: int, log: Path, args: list[str]) -> Result:
    _, status = os.waitpid(pid, 0)
    return Result(args, os.waitstatus_to_exitcode(status), log.read_text(errors="replace"))


def cli(args: list[str], cwd: Path, cache: Path, setup: Callable[[], None] | None = None, **env: str) -> Result:
    """`python <args>` in cwd, run to its end (see start)."""
    return finish(*start(args, cwd, cache, setup, **env), args)


def cli_all(commands: list[list[str]], cwd: Path, cache: Path, parallel: int = 2) -> list[Result]:
    """Several commands, `parallel` at a time (separate processes), in order of their results."""
    results: dict[int, Result] = {}
    running: dict[int, tuple[int, Path, list[str]]] = {}
    for i, args in enumerate(commands):
        while len(running) >= parallel:
            pid, status = os.wait()
            j, log, a = running.pop(pid)
            results[j] = Result(a, os.waitstatus_to_exitcode(status), log.read_text(errors="replace"))
        pid, log = start(args, cwd, cache)
        running[pid] = (i, log, args)
    while running:
        pid, status = os.wait()
        j, log, a = running.pop(pid)
        results[j] = Result(a, os.waitstatus_to_exitcode(status), log.read_text(errors="replace"))
    return [results[i] for i in range(len(commands))]


def ok(out: Result) -> str:
    assert out.returncode == 0, f"{shlex.join(out.args)}\n{out.output[-4000:]}"
    assert "Traceback" not in out.output, out.output[-4000:]
    return out.output


def summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.rglob("summary.json"))]
