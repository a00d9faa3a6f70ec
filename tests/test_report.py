"""The sweep report (minillm/analysis/report.py) on a generated sweep, and the W&B sweep config."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, call_main, compose_cfg, write_corpus

from minillm.analysis.report import lr_sensitivity, summarize, write_report
from minillm.analysis.runs import find_runs
from minillm.analysis.sweep_plots import PLOTS

V = 65
LOSS_INIT = math.log(V)


def make_run(root: Path, i: int, norm: str, placement: str, lr: float, seed: int, final: float | None,
             diverged: bool = False, warmup: int = 100, steps: int = 20, n_layers: int = 2, **extra) -> Path:
    """A run folder as train.py leaves it: summary.json and csv/metrics.csv (sparse rows)."""
    run = root / str(i)
    (run / "csv").mkdir(parents=True)
    summary = {"norm": norm, "placement": placement, "lr": lr, "seed": seed, "warmup_steps": warmup,
               "precision": "32-true", "n_layers": n_layers, "dim": 32, "vocab_size": V,
               "loss_init": LOSS_INIT,
               "final_val_loss": None if diverged else final, "best_val_loss": final, "diverged": diverged,
               "max_attn_logit": 10.0 * lr * (100 if diverged else 1), "max_abs_h": 5.0, "max_grad_norm": 2.0,
               "spike_count": 1, "skipped_steps": 0, "tokens_per_s": 1000.0, **extra}
    (run / "summary.json").write_text(json.dumps(summary))
    keys = ["step", "train/loss", "stab/grad_norm", "stab/max_abs_h",
            *(f"layer/{j}/resid_rms" for j in range(n_layers)), "val/loss"]
    with open(run / "csv" / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for s in range(steps):
            loss = LOSS_INIT - (LOSS_INIT - (final or 2)) * s / steps
            if diverged and s > steps // 2:
                loss = float("nan")
            w.writerow({"step": s, "train/loss": loss})
            w.writerow({"step": s, "stab/grad_norm": 1 + s, "stab/max_abs_h": 1 + 0.1 * s,
                        **{f"layer/{j}/resid_rms": 1 + j + 0.01 * s for j in range(n_layers)}})
        w.writerow({"step": steps - 1, "val/loss": "nan" if diverged else final})
    return run


@pytest.fixture
def sweep(tmp_path) -> Path:
    root = tmp_path / "sweep"
    i = 0
    for norm in ("layernorm", "rmsnorm"):
        for placement in ("pre", "post"):
            for lr in (1e-3, 1e-2):
                for seed in (0, 1):
                    diverged = placement == "post" and lr == 1e-2 and (norm == "layernorm" or seed == 1)
                    final = 2.0 + 0.1 * seed + 0.5 * (lr == 1e-2) + 0.2 * (placement == "post")
                    make_run(root, i, norm, placement, lr, seed, final, diverged)
                    i += 1
    (root / "multirun.yaml").write_text("not a run\n")
    return root


def test_report_rows_statistics_and_plots(sweep):
    path = write_report(sweep)
    text = path.read_text()
    assert len(find_runs(sweep)) == 16
    table = [line for line in text.splitlines() if line.startswith(("| layernorm", "| rmsnorm"))]
    assert len(table) == 8 + 4  # 2 norms x 2 placements x 2 lrs, then 2 x 2 sensitivity rows
    # two seeds of (layernorm, pre, 1e-3): best val 2.0 and 2.1
    # (these summaries have no test loss: its column says -)
    assert "| layernorm | pre | 0.001 | 2 | 2.0500 ± 0.0707 | 2.0500 ± 0.0707 | - | 0.00 | 0.00 |" in text
    # diverged runs leave the loss columns (their summaries still carry a pre-divergence best of 2.8)
    assert "| rmsnorm | post | 0.01 | 2 | 2.7000 | 2.7000 | - | 0.50 |" in text
    assert "| layernorm | post | 0.01 | 2 | - | - | - | 1.00 |" in text
    rows = json.loads((path.parent / "report.json").read_text())["rows"]
    rows = {(r["norm"], r["placement"], r["lr"]): r for r in rows}
    assert rows[("layernorm", "post", 0.01)]["diverged_fraction"] == 1.0
    assert rows[("rmsnorm", "post", 0.01)]["diverged_fraction"] == 0.5
    assert rows[("rmsnorm", "pre", 0.01)]["diverged_fraction"] == 0.0
    assert json.loads((path.parent / "report.json").read_text())["plots"] == list(PLOTS)
    for name in PLOTS:
        png = path.parent / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, name


def test_plots_compare_arms_on_zoomed_axes_and_a_one_lr_sweep_has_no_lr_plot(tmp_path):
    """Norms overlaid in one panel per placement with the seeds' range; the y axis shows the curves, not ln V; a
    sweep of one lr draws no lr plot and report.md links only the plots it drew."""
    from minillm.analysis.sweep_plots import zoomed

    root = tmp_path / "one_lr"
    for i, (norm, seed) in enumerate((n, s) for n in ("layernorm", "rmsnorm") for s in range(3)):
        make_run(root, i, norm, "pre", 3e-3, seed, 2.0 + 0.01 * seed)
    path = write_report(root)
    drawn = json.loads((path.parent / "report.json").read_text())["plots"]
    assert "lr_sensitivity.png" not in drawn and not (path.parent / "lr_sensitivity.png").exists()
    assert "loss_by_placement.png" in drawn and "loss_by_norm.png" not in drawn  # one line per norm panel
    assert "lr_sensitivity" not in path.read_text().split("## Plots")[1]
    curve = [4.2, 3.1] + [2.1 - 0.005 * i for i in range(18)]  # the fall from ln V, then a 0.085-nat slope
    assert zoomed([curve]) == pytest.approx((2.015 - 0.00425, 2.1 + 0.00425))


def test_lr_sensitivity_follows_the_definition(sweep):
    data = summarize(find_runs(sweep))
    sens = {(r["norm"], r["placement"]): r for r in data["sensitivity"]}
    # (layernorm, pre): loss(1e-3) = mean(2.0, 2.1) = 2.05, loss(1e-2) = 2.55 -> mean(0, 0.5) = 0.25
    assert sens[("layernorm", "pre")]["lr_sensitivity"] == pytest.approx(0.25)
    # (layernorm, post): 1e-3 -> 2.25; 1e-2 diverged in both seeds -> clipped to ln V
    assert sens[("layernorm", "post")]["lr_sensitivity"] == pytest.approx((LOSS_INIT - 2.25) / 2)
    # (rmsnorm, post): 1e-2 -> mean(2.7, ln V) (seed 1 diverged)
    assert sens[("rmsnorm", "post")]["lr_sensitivity"] == pytest.approx(((2.7 + LOSS_INIT) / 2 - 2.25) / 2)
    assert sens[("layernorm", "post")]["highest_stable_lr"] == 1e-3
    assert sens[("layernorm", "post")]["max_attn_logit_diverged"] == pytest.approx(10.0)
    assert lr_sensitivity({1e-3: 3.0, 1e-2: 2.0, 1e-1: 2.5}) == pytest.approx(0.5)


def test_a_varying_config_key_splits_rows(tmp_path):
    root = tmp_path / "sweep"
    for i, warmup in enumerate((0, 100)):
        make_run(root, i, "layernorm", "post", 1e-3, 0, 2.0 + i, warmup=warmup)
    data = summarize(find_runs(root))
    assert data["extra_keys"] == ["warmup_steps"]
    assert [r["warmup_steps"] for r in data["rows"]] == [0, 100]
    assert "| norm | placement | lr | warmup_steps | runs |" in write_report(root).read_text()


def test_a_sweep_over_norms_with_their_option_dicts_reports(tmp_path):
    """Regression: each norm's summary carries its own norm_options dict, which used to crash the grouping."""
    root = tmp_path / "sweep"
    make_run(root, 0, "layernorm", "pre", 1e-3, 0, 2.0, norm_options={"eps_mode": "inside", "bias": True})
    make_run(root, 1, "rmsnorm", "pre", 1e-3, 0, 2.1, norm_options={"eps_mode": "inside", "cast": "llama"})
    data = summarize(find_runs(root))
    assert data["extra_keys"] == [] and len(data["rows"]) == 2  # the options follow the norm: no extra column
    make_run(root, 2, "layernorm", "pre", 1e-3, 0, 2.2, norm_options={"eps_mode": "outside", "bias": True})
    data = summarize(find_runs(root))  # an option that varies for the same norm splits its rows
    assert data["extra_keys"] == ["norm_options"] and len(data["rows"]) == 3
    assert '"eps_mode": "outside"' in write_report(root).read_text()


def test_cli_writes_the_report(sweep, tmp_path):
    out = subprocess.run([sys.executable, "-m", "minillm.analysis.report", str(sweep), "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r" / "report.md").exists() and (tmp_path / "r" / "lr_sensitivity.png").exists()
    missing = subprocess.run([sys.executable, "-m", "minillm.analysis.report", str(tmp_path / "empty")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert missing.returncode == 2 and "empty does not exist; allowed: a folder holding run folders" in missing.stderr


@pytest.mark.slow  # long (end to end); `-m slow` runs it
@pytest.mark.parametrize("sweep_file", ["wandb_sweep.yaml", "wandb_sweep_bayes.yaml"])
def test_wandb_sweep_config_drives_train_py_with_hydra_overrides(sweep_file, tmp_path):
    spec = yaml.safe_load((ROOT / "experiments" / sweep_file).read_text())
    assert spec["program"] == "train.py" and (ROOT / spec["program"]).exists()
    assert spec["command"] == ["${env}", "${interpreter}", "${program}", "${args_no_hyphens}"]
    assert spec["metric"]["name"] == "val/loss" and spec["method"] in ("grid", "bayes")
    corpus = write_corpus(tmp_path / "c.txt", n_chars=2000)
    for key, param in spec["parameters"].items():  # each is a valid Hydra override of the real config
        value = param["values"][-1] if "values" in param else param.get("value", param.get("max"))
        extra = ["logger=wandb"] if key.startswith("logger") else []
        cfg = compose_cfg(tmp_path, corpus, f"{key}={value}", *extra)
        node = cfg
        for part in ("model.norm" if key == "norm" else key).split("."):
            node = node[part]
        assert node == value, (key, value)


def test_a_run_stopped_by_a_signal_and_not_resumed_is_left_out_and_named(sweep):
    """status preempted (SIGTERM, not resumed yet) is no outcome: not counted as failed, but listed."""
    stopped = make_run(sweep, 99, "rmsnorm", "pre", 1e-3, 2, None, status="preempted", failed=None)
    data = json.loads((write_report(sweep).parent / "report.json").read_text())
    assert data["n_runs"] == 16 and data["incomplete"] == [str(stopped)]
    row = next(r for r in data["rows"] if (r["norm"], r["placement"], r["lr"]) == ("rmsnorm", "pre", 1e-3))
    assert row["runs"] == 2 and row["failed_fraction"] == 0
    assert f"left out: {stopped}" in (sweep / "report" / "report.md").read_text()


@pytest.mark.slow  # its preset composes in test_train
def test_optuna_sweeper_preset_minimizes_the_optimized_metric(tmp_path):
    """hparams_search=optuna_lr: Optuna's TPE over lr and warmup (hydra-optuna-sweeper), 3 tiny trials."""
    corpus = write_corpus(tmp_path / "c.txt", n_chars=4000)
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "hparams_search=optuna_lr", "hydra.sweeper.n_trials=3",
           "model=tiny", "data=files", f"data.files=[{corpus}]", "trainer.max_steps=4", "data.batch_size=4",
           "data.val_windows=4", "test=false", "logger=csv", "callbacks=stability", f"paths.cache_dir={tmp_path}/c"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (result,) = (tmp_path / "logs" / "optuna_lr" / "multiruns").rglob("optimization_results.yaml")
    best = yaml.safe_load(result.read_text())
    losses = [json.loads(p.read_text())["final_val_loss"] for p in result.parent.rglob("summary.json")]
    assert len(losses) == 3 and best["best_value"] == pytest.approx(min(losses))
    assert 1e-4 <= best["best_params"]["optimizer.lr"] <= 3e-2


# --- verdicts: minillm-report ... --compare FACTOR --baseline VALUE -------------------------------------------------


def report_main(args: list[str], capsys) -> tuple[int, str, str]:
    """minillm-report in this process: (exit code, stdout, stderr)."""
    from minillm.analysis.report import main

    return call_main(main, args, capsys)


def test_compare_writes_verdicts_next_to_the_report(tmp_path, capsys):
    from test_verdicts import planted_runs, write_sweep

    from minillm.analysis.compare import VERDICTS_FIELDS

    sweep = write_sweep(tmp_path / "planted", planted_runs())
    code, out, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm"], capsys)
    assert code == 0, err
    folder = sweep / "report"
    assert {"report.md", "report.json", *PLOTS, "verdicts.json", "verdicts.md", "verdicts.png"} <= {
        p.name for p in folder.iterdir()}
    assert "2 equivalent, 2 inconclusive" in out
    assert "  dyt: inconclusive (+0.8938; failed 3/8 vs 0/8)\n" in out
    data = json.loads((folder / "verdicts.json").read_text())
    assert {k: data[k] for k in ("factor", "baseline", "metric", "margin", "alpha", "lr_rule")} == {
        "factor": "norm", "baseline": "layernorm", "metric": "final_val_loss", "margin": 0.02, "alpha": 0.05,
        "lr_rule": "tuned"}
    assert all(list(c)[:len(VERDICTS_FIELDS)] == list(VERDICTS_FIELDS) for c in data["comparisons"])
    verdicts = {c["arm"]: c["verdict"] for c in data["comparisons"]}
    # dyt failed in 3 of 8 seeds, each counted at ln V: a mean +0.89 nats worse, but too spread to decide among 4
    assert verdicts == {"dyt": "inconclusive", "powernorm": "inconclusive", "rmsnorm": "equivalent",
                        "scalenorm": "equivalent"}
    md = (folder / "verdicts.md").read_text()
    assert "| scalenorm | - | 0.01 / 0.003 | same data (final_val_loss) | 8 |" in md and "**inconclusive**" in md
    assert "- **dyt against layernorm: inconclusive**: final_val_loss +0.8" in md
    assert ("failures: no difference shown (3 of 8 runs against 0 of 8, Boschloo p 0.082, adjusted 0.33, each "
            "counted at ln V)") in md
    assert "## What the verdicts mean" in md
    png = (folder / "verdicts.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # the same sweep with other rules: a common lr, and a larger margin for best_val_loss
    code, _, err = report_main([sweep, "--compare", "norm", "--baseline", "layernorm", "--lr", "common", "--margin",
                                "0.3", "--metric", "best_val_loss", "--out", tmp_path / "r2"], capsys)
    data = json.loads((tmp_path / "r2" / "verdicts.json").read_text())
    assert code == 0 and data["lr_rule"] == "common" and data["metric"] == "best_val_loss"
    assert {c["arm"]: c["verdict"] for c in data["comparisons"]}["scalenorm"] == "equivalent"  # +0.2 < 0.3


def test_several_sweep_folders_are_pooled(tmp_path, capsys):
    from test_verdicts import run, write_sweep

    first = write_sweep(tmp_path / "a", [run(n, 1e-3, s, 2.0 + 0.01 * s + (0.1 + 0.001 * s) * (n == "rmsnorm"))
                                         for n in ("layernorm", "rmsnorm") for s in (0, 1)])
    second = write_sweep(tmp_path / "b", [run(n, 1e-3, s, 2.0 + 0.01 * s + (0.1 + 0.001 * s) * (n == "rmsnorm"))
                                          for n in ("layernorm", "rmsnorm") for s in (2, 3)])
    code, _, err = report_main([first, second, "--compare", "norm", "--baseline", "layernorm"], capsys)
    assert code == 0, err
    (c,) = json.loads((first / "report" / "verdicts.json").read_text())["comparisons"]
    assert c["n_pairs"] == 4 and c["seeds"] == [0, 1, 2, 3] and c["verdict"] == "worse"
    assert "| layernorm | pre | 0.001 | 4 |" in (first / "report" / "report.md").read_text()


@pytest.mark.parametrize(("args", "error"), [
    (["--compare", "nrm", "--baseline", "layernorm"], "--compare: unknown factor 'nrm'"),
    (["--compare", "placement", "--baseline", "pre"], "--compare: placement does not vary (every run has pre); "
                                                      "allowed: norm"),
    (["--compare", "norm", "--baseline", "batchnorm"], "--baseline: 'batchnorm' is not a value of norm; allowed: "
                                                       "dyt, layernorm, powernorm, rmsnorm, scalenorm"),
    (["--compare", "norm", "--baseline", "layernorm", "--metric", "val_bpb"], "--metric: 'val_bpb' has no value"),
    (["--compare", "norm", "--baseline", "layernorm", "--margin", "-0.1"], "--margin: -0.1 is invalid; allowed: "
                                                                          "a number > 0"),
    (["--compare", "norm", "--baseline", "layernorm", "--alpha", "1.5"], "--alpha: 1.5 is invalid; allowed: a "
                                                                        "number in (0, 1)"),
    (["--compare", "norm", "--baseline", "layernorm", "--lr", "fast"], "--lr: fast is invalid; allowed: tuned, "
                                                                      "common or a learning rate"),
    (["--compare", "norm", "--baseline", "layernorm", "--lr", "0.005"], "--lr: 0.005: dyt has no run at that lr"),
    (["--compare", "norm"], "--baseline missing"),
    (["--wandb"], "--wandb: logs the verdicts; it needs --compare"),
    (["--plan"], "--plan: no plan.json in the sweep folder"),
])
def test_bad_comparison_options_are_one_error_line_and_write_nothing(args, error, tmp_path, capsys):
    from test_verdicts import planted_runs, write_sweep

    sweep = write_sweep(tmp_path / "planted", planted_runs())
    code, _, err = report_main([sweep, *args], capsys)
    assert code == 2 and err.splitlines()[-1].startswith(f"minillm-report: error: {error}"), err
    assert not (sweep / "report").exists()


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_compare_on_a_real_cpu_study_sweep_logs_its_verdicts_to_wandb(tmp_path):
    """train.py's cpu_study sweep with W&B and CSV loggers (tiny overrides), then the comparison with --wandb:
    all three files, and an offline W&B run of job_type report in the sweep's group whose table holds the
    verdicts."""
    from helpers import read_wandb_run, wandb_records
    from test_journey import cli, ok

    corpus = write_corpus(tmp_path / "c.txt", n_chars=30_000)
    ok(cli([str(ROOT / "train.py"), "-m", "experiment=cpu_study", "norm=layernorm,rmsnorm", "seed=0,1,2",
            "optimizer.lr=3e-3,1e-2", "model=tiny", "trainer.max_steps=30", "trainer.val_check_interval=15",
            "scheduler.warmup_steps=5", "data.batch_size=8", "data.val_windows=4", "data=files",
            f"data.files=[{corpus}]", "logger=wandb", "name=cmp"], tmp_path, tmp_path / "cache"))
    (sweep,) = (tmp_path / "logs" / "cmp" / "multiruns").iterdir()
    out = ok(cli(["-m", "minillm.analysis.report", str(sweep), "--compare", "norm", "--baseline", "layernorm",
                  "--wandb"],
                 tmp_path, tmp_path / "cache"))
    folder = sweep / "report"
    assert all((folder / f).is_file() for f in ("report.md", "verdicts.json", "verdicts.md", "verdicts.png"))
    data = json.loads((folder / "verdicts.json").read_text())
    (c,) = data["comparisons"]
    assert c["arm"] == "rmsnorm" and c["n_pairs"] == 3 and c["n_arm"] == c["n_baseline"] == 3
    assert c["arm_lr"] in (3e-3, 1e-2) and c["ci_method"] == "paired t" and c["ci_low"] <= c["diff"] <= c["ci_high"]
    (report_run,) = (folder / "wandb").glob("offline-run-*")
    assert f"W&B: offline run {report_run.name.rsplit('-', 1)[-1]} in" in out

    def run_record(run_folder: Path):
        return next(r.run for r in wandb_records(next(run_folder.glob("*.wandb")))
                    if r.WhichOneof("record_type") == "run")

    trained = run_record(next((sweep / "0" / "wandb").glob("offline-run-*")))
    record = run_record(report_run)
    assert record.job_type == "report" and record.run_group == trained.run_group == f"cmp-{sweep.name}"
    assert record.project == trained.project == "minillm"
    run = read_wandb_run(report_run)
    (row,) = [r for r in run["history"] if "verdicts/path" in r]
    table = json.loads((report_run / "files" / row["verdicts/path"]).read_text())
    (logged,) = table["data"]
    got = dict(zip(table["columns"], logged, strict=True))
    assert {k: got[k] for k in ("arm", "baseline", "verdict", "n_pairs", "arm_lr", "baseline_lr")} == {
        "arm": "rmsnorm", "baseline": "layernorm", "verdict": c["verdict"], "n_pairs": 3, "arm_lr": c["arm_lr"],
        "baseline_lr": c["baseline_lr"]}
    assert got["diff"] == pytest.approx(c["diff"]) and got["ci_low"] == pytest.approx(c["ci_low"])
    assert row["verdicts_forest_plot/_type"] == "image-file" and run["summary"]["verdict/rmsnorm"] == c["verdict"]


def test_a_sweep_over_a_model_option_splits_rows_and_reports_the_test_loss(tmp_path):
    """train.py's sweep over settings stored only under settings.model (branch_scale) and over v_norm, 2 seeds each,
    then minillm-report as a user runs it: one row per model (seeds pooled), never one row of all runs, and a
    test-loss column filled from each run's held-out test."""
    from processes import cli, ok

    corpus = write_corpus(tmp_path / "c.txt", n_chars=20_000)
    ok(cli([str(ROOT / "train.py"), "-m", "model=tiny", "model.branch_scale=none,layerscale", "model.v_norm=false,true",
            "seed=0,1", "trainer=cpu", "trainer.max_steps=2", "trainer.val_check_interval=2",
            "scheduler.warmup_steps=1", "data=files", f"data.files=[{corpus}]", "data.batch_size=4",
            "data.val_windows=2", "++callbacks.text_sample.max_new_tokens=4", "logger=csv", "name=bs"],
           tmp_path, tmp_path / "cache"))
    (sweep,) = (tmp_path / "logs" / "bs" / "multiruns").iterdir()
    out = ok(cli(["-m", "minillm.analysis.report", str(sweep)], tmp_path, tmp_path / "cache"))
    assert "wrote" in out
    data = json.loads((sweep / "report" / "report.json").read_text())
    assert data["extra_keys"] == ["settings.model.branch_scale", "settings.model.v_norm"]
    rows = {(r["settings.model.branch_scale"], r["settings.model.v_norm"]): r for r in data["rows"]}
    assert sorted(rows) == [("layerscale", False), ("layerscale", True), ("none", False), ("none", True)]
    assert all(r["runs"] == 2 and r["seeds"] == [0, 1] for r in rows.values())
    tests = [json.loads(p.read_text())["test_loss"] for p in sweep.glob("*/summary.json")]
    assert all(math.isfinite(t) for t in tests)
    assert all(" ± " in r["test_loss"] for r in rows.values())
    text = (sweep / "report" / "report.md").read_text()
    assert "| norm | placement | lr | model.branch_scale | model.v_norm | runs | best val loss (mean ± std) | " \
           "final val loss | test loss |" in text


def test_a_decay_branch_is_drawn_from_its_own_decay_start(tmp_path):
    """A stable run validated after steps 5 and 10 and a branch from its step-8 checkpoint (summary.json and
    metrics.csv as train.py writes them; the sweep moved since, so the recorded parent folder is elsewhere): the
    branch leaves the parent at step 8 (1024 tokens), at the parent's loss there, not at its validation of step 5;
    minillm-report draws loss_vs_tokens.png."""
    from minillm.analysis import branches

    root = tmp_path / "wsd"
    for name, rows, summary in (
            ("stable", [(4, 3.0), (9, 2.0)], {"steps": 10, "tokens": 1280}),
            ("b8", [(9, 1.8)], {"steps": 10, "tokens": 1280,
                                "parent": {"run_dir": "/elsewhere/wsd/stable", "step": 8}})):
        (root / name / "csv").mkdir(parents=True)
        (root / name / "summary.json").write_text(json.dumps({"norm": "rmsnorm", "placement": "pre", "lr": 3e-3,
                                                              "seed": 0, "final_val_loss": rows[-1][1], **summary}))
        with open(root / name / "csv" / "metrics.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["step", "val/loss"])
            w.writeheader()
            w.writerows({"step": s, "val/loss": v} for s, v in rows)
    runs = {r.dir.name: r for r in find_runs(root)}
    parent = branches.parent_of(runs["b8"], {branches._where(r.dir): r for r in runs.values()})
    assert parent is runs["stable"]
    assert branches.branch_start(runs["b8"], parent) == pytest.approx((1024.0, 3.0 + (2.0 - 3.0) * 3 / 5))
    out = subprocess.run([sys.executable, "-m", "minillm.analysis.report", str(root)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert (root / "report" / branches.PLOT).stat().st_size > 5000
