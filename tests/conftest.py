"""Shared pytest setup and fixtures."""

import os
import signal
from pathlib import Path

import pytest
import torch

# One CPU thread per test process, and in the processes the tests start: tiny models on a shared CPU run
# several times faster so (no oversubscribed OpenMP pools), and the suite runs its test processes in parallel.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

# --- fused kernels (tests/test_kernels.py) --------------------------------------------------------------
# Without a CUDA GPU, run the Triton kernels on the CPU interpreter. This must happen before anything
# imports minillm.kernels.rmsnorm: Triton decides interpreter vs GPU when the kernels are defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# --- end fused kernels -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _torch_deterministic_mode_per_test(monkeypatch):
    """Each test starts with torch's deterministic mode as the process began, whatever an earlier test's Trainer
    set (trainer.deterministic=auto turns it on for CPU runs), and CUBLAS_WORKSPACE_CONFIG as it was."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    value = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value or "")  # records it (set or absent) for the restore
    if value is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, request) -> Path:
    """A generated English-like text file, one per test module (size: the module's CORPUS_CHARS)."""
    from helpers import write_corpus

    n_chars = getattr(request.module, "CORPUS_CHARS", 30_000)
    return write_corpus(tmp_path_factory.mktemp("corpus") / "tiny.txt", n_chars=n_chars)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """One token cache for the module's processes (the corpus is tokenized once, by the first command)."""
    return tmp_path_factory.mktemp("token-cache")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, corpus) -> Path:
    """The uninterrupted run that every resumed run must reproduce."""
    from helpers import run_fast

    return run_fast(tmp_path_factory.mktemp("full"), corpus)


@pytest.fixture
def sigint():
    """Sets SIGINT's handler for one test (Python's default_int_handler unless the test sets another) and
    restores the one before: pytest started as a background job of a script begins with SIGINT ignored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """A running SLURM cluster (found, or started by scripts/slurm_cluster.sh when SLURM is installed); the test
    skips with the reason otherwise (tests/slurm_jobs.py)."""
    from slurm_jobs import find_cluster

    reason = find_cluster()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def slurm_jobs():
    """The ids of the SLURM jobs a test submits (append them): the ones still queued at its end are cancelled."""
    from slurm_jobs import cancel

    jobs: list[str] = []
    yield jobs
    cancel(jobs)
