"""Bad input fails early, in one line: ConfigError and the checks shared by every component.

Each component checks its own arguments when it is built (ModelConfig, the norms, TextDataModule, LitLM, the
callbacks), with the helpers below, so a bad value fails before anything trains, with a message that names the
field, the value and what is allowed. train.py reports a ConfigError (and its subclasses DataError and
CheckpointError) as ``<what>: <message>`` with exit code 2; every other exception is a bug and keeps its
traceback. The console scripts parse their arguments with ``ArgumentParser`` (Hydra's and lm-eval's parsers through
``parse_in_one_line``), so a bad flag is one line too; a disk that refuses is ``disk_error``'s line, naming the file
(``writing``). Plain Python: no Hydra, no Lightning.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A value in the run's configuration that cannot work: reported as one line, exit code 2."""

    what = "config error"


class DataError(ConfigError):
    """Input data that cannot be used (a file, a corpus, the token cache): one line naming the file."""

    what = "data error"


class CheckpointError(ConfigError):
    """A checkpoint file that cannot be read, or does not match the run that tries to resume from it."""


class JobStopped(Exception):
    """A sweep job's own one-line stop (a config or disk error it met), already logged: raised instead of SystemExit,
    so that Hydra records it as that job's failure and runs the sweep's other jobs, which then exits with code 2."""


def invalid(field: str, value: Any, allowed: str) -> ConfigError:
    """The one message format: ``<field>=<value> is invalid; allowed: <what is allowed>``."""
    shown = "null" if value is None else repr(value)  # as an override writes it (model.x=null)
    return ConfigError(f"{field}={shown} is invalid; allowed: {allowed}")


def check_int(field: str, value: Any, low: int | None = None, high: int | None = None,
              optional: bool = False) -> None:
    """An int (not a bool) within [low, high]; None passes when optional."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low) or (
            high is not None and value > high):
        bounds = " and ".join(b for b in (f">= {low}" if low is not None else "",
                                          f"<= {high}" if high is not None else "") if b)
        raise invalid(field, value, f"an integer{' ' + bounds if bounds else ''}{' or null' if optional else ''}")


def check_number(field: str, value: Any, low: float | None = None, high: float | None = None,
                 low_open: bool = False, optional: bool = False) -> None:
    """A finite int or float within [low, high] ((low, high] with low_open); None passes when optional."""
    if optional and value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (low is None or (value > low if low_open else value >= low)) and (high is None or value <= high)
    if not ok:
        parts = [f"{'>' if low_open else '>='} {low:g}" if low is not None else "",
                 f"<= {high:g}" if high is not None else ""]
        bounds = " and ".join(p for p in parts if p)
        raise invalid(field, value, f"a finite number{' ' + bounds if bounds else ''}"
                                    f"{' or null' if optional else ''}")


def check_betas(field: str, value: Any) -> None:
    """Adam's (beta1, beta2): two numbers in [0, 1)."""
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in value)):
        raise invalid(field, value, "two numbers in [0, 1), e.g. [0.9,0.95]")


def check_choice(field: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise invalid(field, value, ", ".join(str(a) for a in allowed))


def check_bool(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise invalid(field, value, "true or false")


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+,-]*")


def check_name(field: str, value: Any, optional: bool = False) -> None:
    """A folder name: letters, digits and . _ = + , - (no slash, no spaces); an int (``run_id=7``) is one."""
    if optional and value is None:
        return
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise invalid(field, value, "a folder name of letters, digits and . _ = + , - (no / or spaces)")


DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST}
SPACE_ERRORS = {errno.ENOSPC, errno.EDQUOT}  # a full disk or quota: always a write, never a bad input file


def causes(err: BaseException | None) -> Iterator[BaseException]:
    """err, then what caused it (``__cause__``, else ``__context__``), each once (a chain can loop back)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def disk_oserror(err: BaseException | None, kinds: set[int] = DISK_ERRORS) -> OSError | None:
    """The OSError of a file a run cannot write (errno in ``kinds``) found in err or what caused it; None if none."""
    return next((e for e in causes(err) if isinstance(e, OSError) and e.errno in kinds), None)


def disk_error(err: BaseException | None, where: str | os.PathLike | None = None) -> str | None:
    """``disk error: ...`` for a file a run cannot write (a full disk, a read-only or forbidden folder, a path
    that is a file), found in err or what caused it; None for anything else. A full disk's write error names no
    file: then ``where`` (the folder being written) is named."""
    found = disk_oserror(err)
    if found is None:
        return None
    path = found.filename or (f"in {where}" if where is not None else None)
    return (f"disk error: cannot write{f' {path}' if path else ''} ({os.strerror(found.errno)}); free space or "
            "choose a writable folder (paths.log_dir for run folders, data.cache_dir for token stores)")


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Name ``path`` in a disk error raised inside the block (a full disk's write error names no file)."""
    try:
        yield
    except Exception as err:
        found = disk_oserror(err)
        if found is None or found.filename:
            raise
        raise OSError(found.errno, os.strerror(found.errno), str(path)) from err


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser for minillm's console scripts: a bad flag or argument is one line, ``<prog>: error:
    <message>``, exit code 2 (argparse prints its usage block first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_in_one_line(parse: Callable[[], T]) -> T:
    """Run the argument parsing of another library's command line (Hydra's, lm-eval's): its error is one line, as
    ArgumentParser's (the usage block it prints before is dropped); anything else it prints passes as it is."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            result = parse()
    except SystemExit as exit_:
        errors = [line for line in printed.getvalue().splitlines() if ": error: " in line]
        sys.stderr.write(errors[-1] + "\n" if exit_.code == 2 and errors else printed.getvalue())
        raise
    sys.stderr.write(printed.getvalue())
    return result
