"""The GPU and kernel write-ups: generated from the raw results, every row naming its run, ratios judged only within
one run and over repeats, and the merge of two runs of different kernel code saying which row is whose."""

import json
import statistics
from pathlib import Path

import pytest

from experiments.benchmarks.gpu import merge, summary
from experiments.benchmarks.kernels import report as R
from experiments.benchmarks.kernels.record import kernel_code, run_record
from experiments.benchmarks.kernels.timing import with_repeat

PHASES = [p for p, _ in R.PHASES + R.GRAPH_PHASES]


def run(run_id: str, code: str = "abc123abc123") -> dict:
    return {"id": run_id, "date": f"2026-12-01 10:00:0{run_id[-1]}", "device": "NVIDIA H100 80GB HBM3",
            "commit": "1234567", "kernel_code": code, "command": "python -m experiments.benchmarks.kernels.bench"}


def row(provider: str, fwd: float, fwdbwd: float, at: dict, m: int = 16384, n: int = 4096, **kw) -> dict:
    return dict(provider=provider, M=m, hidden=n, fwd_ms=fwd, fwdbwd_ms=fwdbwd, fwd_frac=kw.pop("frac", 0.5),
                fwd_gbps=1000.0, copy_gbps=2000.0, run=at, **kw)


def test_the_write_ups_are_the_ones_generated_from_the_raw_results():
    """Both finding.json files, the READMEs' results sections (kernels, GPU, docs/kernels.md, S6) and the results
    reports are what summary.py writes from the raw JSON: a typed number there fails this test."""
    assert summary.main(["--check"]) == 0


def test_a_typed_number_in_a_generated_section_is_caught(tmp_path, monkeypatch):
    readme = summary.KERNELS / "README.md"
    edited = readme.read_text().replace("| forward, % of copy |", "| forward, % of copy | 99% |", 1)
    original = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: edited if self == readme else original(self, *a, **k))
    assert summary.main(["--check"]) == 1


def test_the_summary_reads_each_number_from_the_rows():
    """The verdict's figures change with the rows: the fused add's forward ratio is the rows' median."""
    merged, rounds = summary.sources("NVIDIA-H200")
    fig = summary.figures(merged, rounds)
    k = merged["kernel"]
    pairs = [(summary._by(k, "add_kernels", "fused_add", m, n), summary._by(k, "add_kernels", "add+fused", m, n))
             for m, n in summary.JUDGED]
    expected = sorted(o["graph_fwd_ms"] / f["graph_fwd_ms"] for f, o in pairs)
    assert sorted(fig["add"]["fwd"]) == pytest.approx(expected)
    assert f"{min(expected):.2f}-{max(expected):.2f}x forward" in summary.kernels_verdict(
        "NVIDIA H200", "NVIDIA-H200", merged, rounds)


def test_a_ratio_between_rows_of_two_runs_is_not_judged():
    report = {"kernels": [row("fused", 1.0, 2.0, run("r1"), frac=0.95), row("F.rms_norm", 1.5, 3.0, run("r2"))]}
    got = {c["target"]: c for c in R.judge(report)}
    assert got["fwd >= F.rms_norm"]["result"] == "n/a"
    assert got["fwd >= F.rms_norm"]["value"] == "not comparable: rows of runs R1 and R2"
    assert got["fwd >= 90% of copy"]["result"] == "PASS" and got["fwd >= 90% of copy"]["runs"] == "R1"
    report["kernels"][1]["run"] = run("r1")  # the same run: judged
    got = {c["target"]: c for c in R.judge(report)}
    assert got["fwd >= F.rms_norm"]["result"] == "PASS" and got["fwd >= F.rms_norm"]["margin"] == "+50.0%"


def test_ratios_over_repeats_are_judged_on_their_median_with_their_spread():
    fused = baseline = None
    for fused_ms, base_ms in ((1.0, 1.3), (1.0, 1.1), (1.1, 1.32)):  # per-repeat ratios 1.3, 1.1, 1.2
        fused = with_repeat(fused, row("fused", fused_ms, 2.0, run("r1"), frac=0.9), PHASES)
        baseline = with_repeat(baseline, row("F.rms_norm", base_ms, 3.0, run("r1")), PHASES)
    assert fused["fwd_repeats"] == [1.0, 1.0, 1.1] and fused["fwd_ms"] == 1.0
    got = {c["target"]: c for c in R.judge({"kernels": [fused, baseline]})}
    check = got["fwd >= F.rms_norm"]
    assert check["margin"] == "+20.0%" and check["result"] == "PASS"
    assert "1.200x; [1.100x, 1.300x], 3 repeats" in check["value"]


def test_a_failed_repeat_keeps_its_error():
    first = with_repeat(None, row("fused", 1.0, 2.0, run("r1")), PHASES)
    failed = {k: v for k, v in row("fused", 1.0, 2.0, run("r1")).items() if k != "fwd_ms"}
    got = with_repeat(first, {**failed, "fwd_error": "OutOfMemoryError: x"}, PHASES)
    assert got["fwd_error"] == "OutOfMemoryError: x" and "fwd_ms" not in got and got["fwdbwd_repeats"] == [2.0, 2.0]


def test_the_fused_add_is_judged_against_its_byte_bound():
    at = run("r1")
    report = {"add_kernels": [row("fused_add", 1.0, 2.0, at), row("add+fused", 1.2, 2.5, at)]}
    got = {c["target"]: c for c in R.judge(report)}
    fwd = got["fused add + norm fwd >= 1.1875x add, then fused norm (95% of the 1.25x byte bound)"]
    fb = got["fused add + norm fwd+bwd >= 1.3x add, then fused norm"]
    assert (fwd["result"], fwd["margin"], fb["result"], fb["margin"]) == ("PASS", "+0.01x", "FAIL", "-0.05x")


def _kernel_step(folder: Path, code: str, run_id: str, fwd: float) -> Path:
    folder.mkdir(parents=True)
    at = run(run_id, code)
    report = {"meta": {"device": at["device"], "date": at["date"], "copy_gbps": 2000.0, "run": at},
              "kernels": [row("fused", fwd, 2.0, at, frac=0.95), row("F.rms_norm", 1.5, 3.0, at, n=2048)]}
    (folder / "NVIDIA-H100-80GB-HBM3.json").write_text(json.dumps(report))
    return folder


def test_rows_of_two_kernel_versions_are_named_by_their_run_in_every_table(tmp_path):
    """Two runs of two versions of the kernels merged by key: the runs table names both codes and commands, every
    table row and every judged target names its run, and no ratio mixes the two."""
    a = _kernel_step(tmp_path / "a", "aaaaaaaaaaaa", "r1", 1.0)
    b = _kernel_step(tmp_path / "b", "bbbbbbbbbbbb", "r2", 0.9)
    (b / "NVIDIA-H100-80GB-HBM3.json").write_text(json.dumps({**json.loads(
        (b / "NVIDIA-H100-80GB-HBM3.json").read_text()), "kernels": [row("fused", 0.9, 2.0, run("r2", "bbbbbbbbbbbb"),
                                                                           frac=0.95)]}))
    path = merge.main([str(a), str(b), "--results", str(tmp_path / "results")])
    text = path.with_suffix(".md").read_text()
    assert "| R1 | r1 | 2026-12-01 10:00:01 | NVIDIA H100 80GB HBM3 | 1234567 | aaaaaaaaaaaa |" in text
    assert "| R2 | r2 | 2026-12-01 10:00:02 | NVIDIA H100 80GB HBM3 | 1234567 | bbbbbbbbbbbb |" in text
    assert "| 16384 | 4096 | fused | R2 |" in text and "| 16384 | 2048 | F.rms_norm | R1 |" in text
    merged = json.loads(path.read_text())
    assert all(r["run"]["kernel_code"] for r in merged["kernel"]["kernels"])
    assert all(c["runs"] for c in merged["targets"])


def test_merging_again_from_the_committed_json_keeps_the_rows(tmp_path):
    """--render judges a merged report's rows again and rewrites its targets and page, rows untouched."""
    a = _kernel_step(tmp_path / "a", "aaaaaaaaaaaa", "r1", 1.0)
    path = merge.main([str(a), "--results", str(tmp_path / "results")])
    before = json.loads(path.read_text())
    path.with_suffix(".md").write_text("stale")
    merge.main(["--render", str(path)])
    after = json.loads(path.read_text())
    assert after["kernel"]["kernels"] == before["kernel"]["kernels"] and after["targets"] == before["targets"]
    assert path.with_suffix(".md").read_text() == merge.page(after)


def test_a_run_record_names_the_kernel_code_and_the_command():
    rec = run_record("cpu", "python -m experiments.benchmarks.kernels.bench --smoke")
    assert rec["kernel_code"] == kernel_code() and len(rec["kernel_code"]) == 12
    assert rec["command"].endswith("--smoke") and rec["commit"] and rec["device"] == "cpu"


def test_train_rows_of_interleaved_windows_give_the_per_window_ratio():
    a = {"norm": "fused_rmsnorm", "step_ms": 10.0, "window_ms": [10.0, 11.0, 9.0], "interleaved": True}
    b = {"norm": "rmsnorm", "step_ms": 12.0, "window_ms": [12.0, 11.0, 9.9], "interleaved": True}
    assert R.train_ratio(a, b) == pytest.approx([1.2, 1.0, 1.1])
    assert statistics.median(R.train_ratio({**a, "interleaved": False}, b)) == pytest.approx(1.2)
