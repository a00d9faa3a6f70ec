"""What a failed benchmark row keeps: a line for the table and enough of the error to diagnose it afterwards, since
a benchmark may run on a machine whose logs are gone by the time its results are read."""

from __future__ import annotations

import traceback

TRACEBACK_LINES = 40


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


def failure(e: BaseException) -> dict[str, str]:
    """``error``: the exception's first line, and its root cause's when it wraps one (``BackendCompilerFailed:
    backend='inductor' raised:`` says nothing alone); ``traceback``: the last TRACEBACK_LINES lines of the whole
    chained traceback."""
    root = e
    while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
        root = root.__cause__ or root.__context__
    error = _first_line(e) + (f" <- {_first_line(root)}" if root is not e else "")
    lines = "".join(traceback.format_exception(e)).rstrip().splitlines()
    return {"error": error, "traceback": "\n".join(lines[-TRACEBACK_LINES:])}


def tail(text: str | bytes | None, lines: int = TRACEBACK_LINES) -> str:
    """The last ``lines`` lines of a process's output stream."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").rstrip().splitlines()[-lines:])
