"""The sweep report (minillm/report.py) on a generated sweep, and the W&B sweep config."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, compose_cfg, write_corpus

from minillm.report import PLOTS, find_runs, lr_sensitivity, summarize, write_report

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
    assert "| layernorm | pre | 0.001 | 2 | 2.0500 ± 0.0707 | 2.0500 ± 0.0707 | 0.00 | 0.00 |" in text
    # diverged runs leave the loss columns (their summaries still carry a pre-divergence best of 2.8)
    assert "| rmsnorm | post | 0.01 | 2 | 2.7000 | 2.7000 | 0.50 |" in text
    assert "| layernorm | post | 0.01 | 2 | - | - | 1.00 |" in text
    rows = json.loads((path.parent / "report.json").read_text())["rows"]
    rows = {(r["norm"], r["placement"], r["lr"]): r for r in rows}
    assert rows[("layernorm", "post", 0.01)]["diverged_fraction"] == 1.0
    assert rows[("rmsnorm", "post", 0.01)]["diverged_fraction"] == 0.5
    assert rows[("rmsnorm", "pre", 0.01)]["diverged_fraction"] == 0.0
    for name in PLOTS:
        png = path.parent / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, name


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
    out = subprocess.run([sys.executable, "-m", "minillm.report", str(sweep), "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r" / "report.md").exists() and (tmp_path / "r" / "lr_sensitivity.png").exists()
    missing = subprocess.run([sys.executable, "-m", "minillm.report", str(tmp_path / "empty")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert missing.returncode != 0 and "no summary.json" in missing.stderr


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
