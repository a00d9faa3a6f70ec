"""The repository itself: lint, and documentation that matches the code and CI."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_code_is_ruff_clean():
    if shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"],
                                                       capture_output=True).returncode:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


def referenced_tests(text: str) -> list[tuple[str, str]]:
    """(file, test name) for `tests/x.py::name` and for `::name` after such a file in the same document."""
    refs, current = [], None
    for match in re.finditer(r"(tests/[\w/]+\.py)?::(\w+)", text):
        current = match.group(1) or current
        refs.append((current, match.group(2)))
    return refs


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_test_a_document_names_exists(doc):
    refs = referenced_tests(doc.read_text())
    for path, name in refs:
        assert path is not None, f"{doc.name}: ::{name} names no file"
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), f"{doc.name}: {path}::{name}"


def test_readme_states_the_command_ci_runs_and_has_no_placeholders():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "bash scripts/setup.sh && .venv/bin/python -m pytest"
    assert f"\n{command}\n" in readme and command in ci
    assert not re.findall(r"\b[A-Z]{3,}_[A-Z_]{3,}\b", readme.replace("WANDB_MODE", "").replace(
        "MINILLM_CACHE", "").replace("TORCH_VERSION", "").replace("TRITON_INTERPRET", "").replace(
        "ATEN_CPU_CAPABILITY", "").replace("TORCHINDUCTOR_CACHE_DIR", ""))
