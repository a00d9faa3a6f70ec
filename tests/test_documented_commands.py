"""Every `python -m minillm...` command README.md and docs/*.md show is run as a process, as a reader would: each
module answers --help (exit 0, its usage printed: a module without a __main__ guard exits 0 and prints nothing), and
the comparison commands run with their documented arguments on a tiny sweep."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import ROOT
from processes import cli

DOCUMENTED = sorted({m for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
                     for m in re.findall(r"python -m (minillm(?:\.\w+)+)", doc.read_text())})


def test_the_documented_modules_are_found():
    assert {"minillm.analysis.report", "minillm.analysis.plans", "minillm.schema", "minillm.tools.prepare"} <= set(
        DOCUMENTED)


@pytest.mark.parametrize("module", DOCUMENTED)
def test_every_documented_module_runs_as_a_command(module, tmp_path, shared_cache, corpus):
    if module == "minillm.tools.harness":
        pytest.importorskip("lm_eval.api.registry")
    # prepare takes Hydra overrides, not flags: its documented data=files line on a small corpus
    args = (["data=files", f"data.files=[{corpus}]", f"data.cache_dir={tmp_path / 'cache'}"]
            if module == "minillm.tools.prepare" else ["--help"])
    out = cli(["-m", module, *args], tmp_path, shared_cache)
    assert out.returncode == 0 and "Traceback" not in out.output, out.output[-2000:]
    if module == "minillm.schema":  # takes no option: prints the field table
        assert out.output.startswith("| field | type | meaning |")
    elif module == "minillm.tools.prepare":
        assert any((tmp_path / "cache").rglob("*")), out.output[-2000:]
    else:
        assert re.search(r"usage|== Config ==|Powered by Hydra", out.output, re.I), (module, out.output[-2000:])


def _sweep(root: Path) -> Path:
    from test_verdicts import run, write_sweep

    return write_sweep(root, [run(n, lr, s, 2.0 + 0.01 * s + 0.003 * (n == "rmsnorm") + 100 * (lr - 3e-3) ** 2)
                              for n in ("layernorm", "rmsnorm") for lr in (1e-3, 3e-3) for s in range(4)])


def test_the_documented_report_command_writes_verdicts(tmp_path, shared_cache):
    """docs/comparing.md: python -m minillm.analysis.report logs/<name>/multiruns/<id> --compare norm --baseline
    layernorm [--stability]"""
    sweep = _sweep(tmp_path / "logs" / "s" / "multiruns" / "1")
    out = cli(["-m", "minillm.analysis.report", str(sweep), "--compare", "norm", "--baseline", "layernorm",
               "--stability"], tmp_path, shared_cache)
    assert out.returncode == 0, out.output[-2000:]
    result = json.loads((sweep / "report" / "verdicts.json").read_text())
    assert [c["arm"] for c in result["comparisons"]] == ["rmsnorm"] and "stability_verdict" in result


def test_the_documented_plan_command_records_a_plan(tmp_path, shared_cache):
    """docs/comparing.md: python -m minillm.analysis.plans plan.yaml --sweep <name>, then the sweep, then
    python -m minillm.analysis.report logs/<name>/multiruns/<id> --plan"""
    (tmp_path / "plan.yaml").write_text("design: single-stage\nfactor: norm\nbaseline: layernorm\nseeds: [0, 1, 2, 3]\n"
                                        "expected: {rmsnorm: equivalent}\n")
    out = cli(["-m", "minillm.analysis.plans", "plan.yaml", "--sweep", "s"], tmp_path, shared_cache)
    assert out.returncode == 0 and (tmp_path / "logs" / "s" / "plan.json").is_file(), out.output[-2000:]
    sweep = _sweep(tmp_path / "logs" / "s" / "multiruns" / "1")
    out = cli(["-m", "minillm.analysis.report", str(sweep), "--plan"], tmp_path, shared_cache)
    assert out.returncode == 0, out.output[-2000:]
    assert json.loads((sweep / "report" / "verdicts.json").read_text())["plan"]
