"""The house by job: minillm/ is built in floors (core at the top of the package, then analysis/, training/,
tools/), each importing only the floors below it, with no import circles; analysis/ runs without torch or
Lightning (so training's sweep closing line and the tools can read finished runs with it); data/ does not import
the job that runs it (run/)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minillm"
# what each floor may import, besides itself and core
MAY_IMPORT = {"core": set(), "analysis": set(), "training": {"analysis"}, "tools": {"training", "analysis"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ("training", "analysis", "tools") else "core"


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    """The minillm modules ``path`` imports (``from minillm.x import y`` names minillm.x.y when that is a module)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("minillm")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minillm") and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").exists() or \
                    (ROOT / sub.replace(".", "/")).is_dir()
                found.add(sub if is_module else node.module)
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "configs" not in p.parts}


def test_each_floor_imports_only_the_floors_below_it():
    wrong = []
    for name, path in MODULES.items():
        for target in imports(path):
            if target in MODULES and floor(target) not in {floor(name), "core", *MAY_IMPORT[floor(name)]}:
                wrong.append(f"{name} ({floor(name)}) imports {target} ({floor(target)})")
    assert not wrong


def test_data_does_not_import_the_job_that_runs_it():
    assert not [f"{n} imports {t}" for n, p in MODULES.items() if n.startswith("minillm.training.data")
                for t in imports(p) if t.startswith("minillm.training.run")]


def test_no_import_circles():
    """Among module-level imports (a function may import lazily what imports it back, but a module never does)."""
    graph = {n: {t for t in imports(p, top_level_only=True) if t in MODULES and t != n} for n, p in MODULES.items()}
    for package in [n for n in MODULES if MODULES[n].name == "__init__.py"]:  # a package's init does not count
        for deps in graph.values():
            deps.discard(package)
    visiting, done, cycles = set(), set(), []

    def visit(node: str, path: list[str]) -> None:
        if node in done:
            return
        if node in visiting:
            cycles.append(" -> ".join([*path[path.index(node):], node]))
            return
        visiting.add(node)
        for dep in sorted(graph[node]):
            visit(dep, [*path, node])
        visiting.discard(node)
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    assert not cycles


def test_the_tree_reads_as_the_four_jobs():
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == \
        {"norms", "kernels", "training", "analysis", "tools"}
    core = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert core == {"model", "placements", "generation", "forensics", "metrics", "errors", "outcome", "schema",
                    "files", "paths", "version", "distributed", "_compat", "mup", "ngpt", "model_config", "layers"}


@pytest.mark.parametrize("floor_name", ["analysis"])
def test_analysis_runs_with_torch_and_lightning_blocked(floor_name, tmp_path):
    """Every analysis module imports, and minillm-report --help runs, in a process where importing torch,
    Lightning or Hydra fails."""
    modules = [n for n in MODULES if floor(n) == floor_name]
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'lightning', 'hydra', 'triton'):\n"
        "            raise ImportError(f'blocked: {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"import importlib\nfor m in {modules!r}: importlib.import_module(m)\n"
        "import minillm\nassert minillm.__version__\n"
        "from minillm.analysis.report import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=tmp_path)
