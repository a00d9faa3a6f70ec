"""The training entry point of train.py and the console script minillm-train: ``main`` imports the trainer (torch,
Lightning and Hydra take seconds) inside a guard, so a Ctrl-C during those imports is one line, not a traceback."""

from __future__ import annotations

import sys

INTERRUPTED = ("stopped by SIGINT (Ctrl-C) while Python imported minillm's libraries: nothing ran, nothing was "
               "written")


def main() -> None:
    try:
        from minillm.training.train import main as train
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        sys.exit(130)
    train()
