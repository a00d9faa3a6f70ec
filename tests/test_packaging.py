"""Install anywhere: the wheel carries the configs and the console scripts, one version source, the version and
commit recorded with every run, checkpoints evaluated and sampled from the command line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import CONFIGS, ROOT, compose_cfg

import minillm
import minillm.training.train as train_script
from minillm.tools.evaluate import evaluate
from minillm.version import provenance

SCRIPTS = {"minillm-train": "minillm.training.entry:main", "minillm-report": "minillm.analysis.report:main",
           "minillm-eval": "minillm.tools.evaluate:main", "minillm-sample": "minillm.tools.sample:main",
           "minillm-export": "minillm.tools.export:main", "minillm-prepare": "minillm.tools.prepare:main",
           "minillm-import": "minillm.tools.import_hf:main", "minillm-inspect": "minillm.tools.inspection:main",
           "minillm-lm-eval": "minillm.tools.evaluate:lm_eval_main"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w",
                           str(out), str(ROOT)], check=True, capture_output=True, text=True, timeout=300)
    # every folder of the package is declared: setuptools says nothing about configs/ (it warned ~600 times)
    assert "absent from the `packages` configuration" not in done.stdout + done.stderr
    (path,) = out.glob("minillm-*.whl")
    return path


def test_the_wheel_holds_every_config_the_console_scripts_and_the_license(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"minillm/configs/{p.relative_to(CONFIGS)}" for p in CONFIGS.rglob("*.yaml")}
    assert configs and configs <= names, sorted(configs - names)[:5]
    assert {"minillm/training/train.py", "minillm/training/callbacks/stability.py",
            "minillm/kernels/rmsnorm.py"} <= names
    info = f"minillm-{minillm.__version__}.dist-info"
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert all(f"{name} = {target}" in entry_points for name, target in SCRIPTS.items()), entry_points
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: MIT" in metadata and f"Version: {minillm.__version__}" in metadata
    assert f"{info}/licenses/LICENSE" in names
    assert "triton" in metadata and "sys_platform == \"linux\"" in metadata  # Triton only where it exists


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_an_installed_wheel_finds_its_own_configs(wheel, tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp_path), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    code = "import minillm.training.train as t; print(t.config_dir())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    folder = Path(out.stdout.strip())
    assert folder == tmp_path / "minillm" / "configs" and (folder / "train.yaml").is_file()


def test_every_package_is_listed_for_the_wheel():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "minillm").rglob("__init__.py")}
    groups = {".".join(("minillm", *d.relative_to(ROOT).parts)) for d in (ROOT / "configs").rglob("*") if d.is_dir()}
    assert found | {"minillm.configs"} | groups == listed


def test_one_version_source():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert minillm.__version__ == provenance()["minillm_version"]


def test_a_user_config_folder_joins_through_hydras_search_path(tmp_path, corpus):
    mine = tmp_path / "my_configs" / "experiment"
    mine.mkdir(parents=True)
    (mine / "mine.yaml").write_text("# @package _global_\nname: mine\nmodel:\n  n_layers: 3\n")
    cfg = compose_cfg(tmp_path, corpus, f"hydra.searchpath=[file://{tmp_path / 'my_configs'}]", "experiment=mine")
    assert cfg.name == "mine" and cfg.model.n_layers == 3


def test_runs_record_the_version_and_commit_and_eval_gives_their_held_out_numbers(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=4", "test=true")
    metrics = train_script.train(cfg)
    run = Path(cfg.paths.output_dir)
    summary = json.loads((run / "summary.json").read_text())
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    expected = provenance()
    assert expected["git_commit"] is None or len(expected["git_commit"]) == 40  # a checkout here
    for record in (summary, ckpt["minillm"]):
        assert {k: record[k] for k in expected} == expected
    overrides = ["model=tiny", "data=files", f"data.files=[{corpus}]", f"paths.cache_dir={tmp_path / 'cache'}"]
    held_out = evaluate(run / "checkpoints" / "last.ckpt", overrides)
    assert held_out["test/loss"] == pytest.approx(metrics["test/loss"], rel=1e-6)
    assert held_out["test/bpc"] == pytest.approx(metrics["test/bpc"], rel=1e-6)


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_eval_command_errors_are_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "minillm.tools.evaluate", str(tmp_path / "missing.ckpt")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "missing.ckpt" in out.stderr
    assert out.stderr.startswith("minillm-eval: error: config error: ")  # as the other tools print errors


def declared_distributions() -> set[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *(s for extra in project["optional-dependencies"].values() for s in extra)]
    return {normalize(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]) for spec in specs}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(*folders: str) -> dict[str, str]:
    """Top-level module -> the first file importing it, for every absolute import under the folders."""
    import ast

    found: dict[str, str] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                    node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def test_every_import_of_minillm_and_experiments_is_a_declared_dependency():
    """What minillm/ and experiments/ import is in pyproject.toml (dependencies or an extra), not only installed
    because another package needs it."""
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    declared = declared_distributions()
    missing = []
    for module, where in imported_modules("minillm", "experiments").items():
        if module in sys.stdlib_module_names or module in ("minillm", "experiments"):
            continue
        dists = {normalize(d) for d in owners.get(module, [module])}
        if not dists & declared:
            missing.append(f"{module} ({where})")
    assert not missing, missing


def fake_wheel(folder: Path, name: str, version: str, *requires: str) -> Path:
    """A wheel holding only its METADATA (what scripts/wheel_check.py reads)."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\n"
                   f"Version: {version}\n{meta}")
    return path


def test_wheel_check_reads_versions_not_names(tmp_path):
    """The wheelhouse check (before leaving) and the offline install's check (on the node): a requirement is met by
    a wheel or an image package at a version its specifier allows; an image package of unknown version is
    reported as unchecked, never as met; markers for other Pythons and --no-deps wheels are skipped."""
    fake_wheel(tmp_path, "datasets", "5.2.0", "pyarrow>=24", "fsspec[http]<=2026.9.0,>=2023.1.0", "dill",
               "multiprocess>=0.70; python_version < '3.8'", "xxhash>=3", "tqdm>=4.66")
    fake_wheel(tmp_path, "xxhash", "3.5.0")
    fake_wheel(tmp_path, "liger_kernel", "0.8.5", "torch>=99")  # installed with --no-deps
    script = [sys.executable, str(ROOT / "scripts" / "wheel_check.py"), str(tmp_path), "--python-version", "3.12",
              "--no-deps", "liger-kernel"]
    out = subprocess.run([*script, "--image", "pyarrow==19.0.1 fsspec==2026.10.0 dill tqdm"], capture_output=True,
                         text=True)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "  unchecked: datasets 5.2.0 needs tqdm>=4.66: the image has tqdm, version unknown",
        "  UNMET: datasets 5.2.0 needs pyarrow>=24, the image has pyarrow 19.0.1",
        "  UNMET: datasets 5.2.0 needs fsspec[http]<=2026.9.0,>=2023.1.0, the image has fsspec 2026.10.0",
        "3 wheels: 2 unmet, 1 unchecked requirements"]
    ok = subprocess.run([*script, "--image", "pyarrow==24.0.0 fsspec==2026.9.0 dill tqdm==4.67.1"],
                        capture_output=True, text=True)
    assert (ok.returncode, ok.stdout.strip()) == (0, "3 wheels: 0 unmet, 0 unchecked requirements")
    (tmp_path / "datasets-5.2.0-py3-none-any.whl").unlink()  # its requirements: whatever this venv holds
    fake_wheel(tmp_path, "needs_pytest", "1.0", "pytest>=999", "pluggy>=0.1")  # what this Python has
    installed = subprocess.run([*script, "--installed"], capture_output=True, text=True)
    lines = installed.stdout.splitlines()
    assert installed.returncode == 1 and len(lines) == 2, installed.stdout
    assert lines[0].startswith("  UNMET: needs-pytest 1.0 needs pytest>=999, this Python has pytest ")
    assert lines[1] == "3 wheels: 1 unmet, 0 unchecked requirements"  # pluggy>=0.1 met by the installed one
