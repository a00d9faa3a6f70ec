"""Hydra at the edges of a run: where configs/ is, and every error of composing a config as one line.

Hydra reports its own errors (an unknown option of a group, a misspelt key, an override it cannot parse, a
resolver that refused a value) in several lines with its search path, and exits 1. ``one_line`` turns each
into the one-line form the rest of minillm uses (``<field>=<value> is invalid; allowed: ...``), which the
entry points print with exit code 2.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.errors import (
    ConfigCompositionException,
    InstantiationException,
    MissingConfigException,
    OverrideParseException,
)
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf.errors import OmegaConfBaseException

from minillm import paths
from minillm.errors import ConfigError, JobStopped, causes, disk_error
from minillm.training.run import resolvers


def config_dir() -> str:
    """minillm.paths.config_dir, with minillm's resolvers registered: the configs use them (run folders, SLURM
    sizes), so composing a config needs them."""
    resolvers.register_resolvers()
    return paths.config_dir()


@contextmanager
def config_errors() -> Iterator[None]:
    """Report what the components' own checks raise while being built (inside Hydra's instantiate too) as
    ConfigError; Lightning's own validation (MisconfigurationException) and a misspelt keyword count too."""
    try:
        yield
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        if isinstance(cause, MisconfigurationException):
            raise ConfigError(str(cause)) from cause
        if isinstance(cause, TypeError) and "unexpected keyword argument" in str(cause):
            raise ConfigError(" ".join(str(err).split())) from cause
        if "Error locating target" in str(err):  # a _target_ that does not import
            raise ConfigError(str(err).splitlines()[0]) from err
        raise
    except MisconfigurationException as err:
        raise ConfigError(str(err)) from err


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _config_error(err: BaseException) -> ConfigError | None:
    """The ConfigError that caused err (a resolver or a component refused a value), if any."""
    return next((e for e in causes(err) if isinstance(e, ConfigError)), None)


def one_line(err: BaseException) -> str | None:
    """``config error: ...`` for an error of composing the config, None for anything else (a bug)."""
    refused = _config_error(err)
    if refused is not None:
        return f"{refused.what}: {refused}"
    if isinstance(err, MissingConfigException) and err.options is not None and err.missing_cfg_file:
        group, _, value = err.missing_cfg_file.rpartition("/")
        options = sorted(err.options)
        return (f"config error: {group}={value} is invalid; allowed: {', '.join(options)}"
                f"{_suggest(value, options)}")
    if isinstance(err, OverrideParseException):
        return f"config error: an override cannot be parsed ({' '.join(str(err).split())}); write key=value"
    if isinstance(err, ConfigCompositionException):
        cause = err.__cause__
        first = str(err).splitlines()[0]
        if isinstance(cause, OmegaConfBaseException) and "not in struct" in str(cause) and "override" in first:
            key = first.split("'")[1] if first.count("'") >= 2 else str(getattr(cause, "full_key", "?"))
            parent = getattr(cause, "parent_node", None)
            keys = parent.keys() if hasattr(parent, "keys") else []
            options = sorted(str(k) for k in keys if not str(k).startswith("_"))
            where, _, leaf = key.rpartition(".")
            try:  # the deepest node that exists (callbacks, when callbacks.text_sample is not in this config)
                where = parent._get_full_key(None) if parent is not None and parent._get_parent() is not None else ""
            except Exception:  # noqa: BLE001  (an older OmegaConf: the key's own parent)
                pass
            if where and key.startswith(where + "."):
                leaf = key[len(where) + 1:].split(".")[0]  # the first part that is missing
            elif not where:
                leaf = key.split(".")[0]
            known = f"; {where or 'the top level'} has: {', '.join(options)}" if options else ""
            return (f"config error: {key} is not a key of the config{known}{_suggest(leaf, options)}; to add a "
                    f"new key write +{key}=...")
        return f"config error: {' '.join(str(err).split())}"
    if isinstance(err, OmegaConfBaseException):
        return f"config error: {' '.join(str(err).split())}"
    return None


def route_library_logs() -> None:
    """Lightning's log lines and Python warnings go through the root logger Hydra set up, so train.log (the
    run's console log) holds them too; Lightning adds its own console handler when imported before that."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "torchmetrics"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.captureWarnings(True)


@contextmanager
def errors_in_one_line() -> Iterator[None]:
    """Around a Hydra entry point: Hydra raises its errors instead of printing its report and exiting 1
    (HYDRA_FULL_ERROR), and each one that is about the config or the disk becomes one line on stderr, exit 2; so does
    a sweep whose job stopped in a line of its own (JobStopped), once its other jobs have run."""
    previous = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except JobStopped:  # its line is logged, and Hydra's "Error executing job with overrides: ..." names the job
        sys.exit(2)
    except Exception as err:
        line = one_line(err) or disk_error(err)
        if line is None:
            raise
        print(line, file=sys.stderr)
        sys.exit(2)
    finally:
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous
