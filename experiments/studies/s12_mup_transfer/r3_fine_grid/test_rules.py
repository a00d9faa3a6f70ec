"""S12 round 3's pre-registered rule on made-up runs: T1's word for muP slopes made to transfer, to drift and to sit
between, with the standard drift absent, with S3's runs not reproduced at width 32, and the analysis stopping on
runs it cannot read; S3's committed standard runs as its premise; run.sh's grid, widths and seeds are the rules'."""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

import pytest

from experiments.common.reference import compose
from experiments.common.study import Runs
from experiments.studies.s12_mup_transfer.r3_fine_grid import analyze as s12


def parabolas(arm: str, slope: float, seeds: tuple[int, ...], scatter: float = 0.01, kink: float = 0.0
              ) -> list[dict]:
    """One arm's runs on its grid: loss-vs-lr parabolas on log10(lr) whose vertex moves from 1e-2 at width 32 by
    ``slope`` plus ``scatter`` x (the seed's distance from the seeds' middle) per doubling; at width 32 both arms are
    the same model (the same losses); ``kink`` moves width 256's vertex by that many decades more."""
    lrs = s12.LRS if arm == "mup" else s12.STANDARD_LRS
    out = []
    for w in s12.WIDTHS:
        for s in seeds:
            moved = (slope + scatter * (s - sum(seeds) / len(seeds))) * math.log2(w / s12.BASE) + kink * (w == 256)
            for lr in lrs:
                loss = 2.0 + 0.3 * (1 + 0.05 * s) * (math.log10(lr) + 2 - moved) ** 2 - 0.01 * math.log2(w)
                out.append({"name": s12.TAG, "parametrization": None if arm == "standard" else "mup",
                            "norm": "rmsnorm", "qk_norm": "none", "z_loss": 0, "dim": w, "seed": s, "lr": lr,
                            "final_val_loss": loss, "diverged": False, "status": "completed", "loss_init": 4.48,
                            "unigram_loss": 3.3, "max_attn_logit": 10.0, "steps": 400, "max_steps": 400,
                            "run_dir": f"{arm}/{w}/{lr:g}/{s}"})
    return out


def judge(mup_slope: float, std_slope: float = -0.42, scatter: float = 0.01, mup: Runs | None = None,
          kink: float = 0.0) -> tuple[dict, dict, str]:
    mup = mup if mup is not None else Runs(parabolas("mup", mup_slope, s12.SEEDS, scatter, kink))
    res, md = s12.analyze(mup, Runs(parabolas("standard", std_slope, s12.STANDARD_SEEDS)))
    return {k: w for k, (w, _) in res["verdicts"].items()}, res, md


def test_s12_r3_t1_confirmed_not_at_this_scale_and_unresolved():
    words, res, md = judge(0.0)
    assert [g["status"] for g in res["precondition"]] == ["present", "present", "present"], md
    assert words == {"T1": "confirmed"} and res["slopes"][0] == pytest.approx(-0.055, abs=1e-6), md
    assert "90% CI" in md
    assert judge(-0.4)[0] == {"T1": "not at this scale"}
    assert judge(+0.3)[0] == {"T1": "not at this scale"}  # drifting up is no transfer either
    words, res, md = judge(-0.08, scatter=0.03)  # its interval crosses -0.1
    low = res["t1"]["at least"]
    assert low["ci_low"] < -0.1 < low["ci_high"] and words == {"T1": "unresolved"}, md
    from experiments.common import precondition as pre
    assert low == pre.against(list(res["slopes"].values()), -0.1, "at least", 0.1)  # the 90% interval
    _, res, md = judge(0.0, kink=0.3)  # width 256 off the line: the 32-128 slope is read on its own widths
    assert res["slope_32_128"]["mean"] == pytest.approx(0.0, abs=1e-9) and res["slopes"][5] > 0.05, md
    assert "muP slope over widths 32-256" in md
    assert re.search(r"over widths 32-128 \(round 2's span\), [+-]0\.000 \[-0\.0", md), md


def test_s12_r3_without_the_standard_drift_or_its_reproduction_t1_is_not_read():
    words, res, _ = judge(0.0, std_slope=0.0)
    assert res["precondition"][1]["status"] == "absent" and words == {"T1": "premise absent at this scale"}
    mup = Runs(parabolas("mup", 0.0, s12.SEEDS))
    next(r for r in mup if r["dim"] == 32 and r["seed"] == 1 and r["lr"] == 1e-2)["final_val_loss"] += 2e-6
    words, res, md = judge(0.0, mup=mup)
    assert res["precondition"][0]["status"] == "absent" and words == {"T1": "not run: the standard runs do not "
                                                                            "reproduce"}, md


def test_s12_r3_a_cell_at_the_grids_edge_keeps_t1_from_confirmed():
    """An edge cell truncates its seed's slope towards 0 (towards "confirmed"): with one, T1 is at most unresolved."""
    mup = Runs(parabolas("mup", 0.0, s12.SEEDS))
    for r in mup:  # width 256, seed 3: the loss falls to the grid's top lr
        if r["dim"] == 256 and r["seed"] == 3:
            r["final_val_loss"] = 3.0 - r["lr"]
    words, res, md = judge(0.0, mup=mup)
    assert res["precondition"][2]["status"] == "mixed" and "47/48" in md, md
    assert res["t1"]["at least"]["reading"] == res["t1"]["at most"]["reading"] == "holds"
    assert words == {"T1": "unresolved"}, md


def test_s12_r3_a_crashed_run_counts_at_ln_v_not_at_its_last_validation():
    mup = Runs(parabolas("mup", 0.0, s12.SEEDS))
    r = next(r for r in mup if r["dim"] == 128 and r["seed"] == 4 and r["lr"] == 1e-2)
    r.update(status="failed", steps=120, final_val_loss=1.5)  # crashed after a validation better than any
    _, res, md = judge(0.0, mup=mup)
    assert s12.cell(mup, 128, 4, s12.LRS)[1e-2] == 4.48 and res["best_log10_lr"]["128/4"] != -2.0, md


def test_s12_r3_runs_it_cannot_read_stop_the_analysis():
    def stops(change, match: str) -> None:
        mup = Runs(parabolas("mup", 0.0, s12.SEEDS))
        change(mup, next(r for r in mup if r["dim"] == 64 and r["seed"] == 2 and r["lr"] == 1e-2))
        with pytest.raises(SystemExit, match=match):
            judge(0.0, mup=mup)
    stops(lambda _, r: r.pop("max_attn_logit"), "attention logit")
    stops(lambda _, r: r.update(lr=3e-3), "an lr of the grid")
    stops(lambda _, r: r.update(seed=15), "a seed and width of this round")
    stops(lambda _, r: r.update(status="preempted"), "have not ended")
    stops(lambda rs, r: rs.append(dict(r)), "more than one run .*width 64 lr 0.01 seed 2")
    stops(lambda rs, r: rs.remove(r), r"1 of the round's 336 runs are missing: width 64 lr 0.01 seed 2")
    stops(lambda rs, _: [rs.remove(x) for x in [x for x in rs if x["seed"] >= 4]],
          "224 of the round's 336 runs are missing")  # one piece alone


def test_s12_r3_reads_s3s_committed_standard_runs_as_its_premise():
    """S3 rounds 4-5's RMSNorm runs at widths 32-256: 3 seeds x 6 lrs x 4 widths, their slope wholly below -0.1;
    this round's width-32 runs at lr 1e-2 reproduce them when the training has not changed."""
    standard = s12.standard_runs()
    assert len(standard) == 72 and {r["dim"] for r in standard} == set(s12.WIDTHS)
    mup = Runs(r for r in parabolas("mup", 0.0, s12.SEEDS) if not (r["dim"] == 32 and r["lr"] == 1e-2))
    mup += Runs({**r, "parametrization": "mup", "name": s12.TAG} for r in standard
                if r["dim"] == 32 and r["lr"] == 1e-2)
    mup += Runs(r for r in parabolas("mup", 0.0, s12.SEEDS) if r["dim"] == 32 and r["lr"] == 1e-2 and r["seed"] > 2)
    res, md = s12.analyze(mup)
    assert res["precondition"][0]["status"] == "present" and res["precondition"][1]["status"] == "present", md
    assert res["precondition"][1]["interval"] == pytest.approx([-0.481, -0.358], abs=5e-4), md  # S3 round 5's
    assert res["precondition"][1]["cells"]["standard"]["values"] == [pytest.approx(-0.420, abs=5e-4)]


def test_s12_r3_run_sh_runs_the_rules_arm_grid_widths_and_seeds(tmp_path):
    """run.sh's overrides composed as train.py composes them: the arm the analysis reads, S3's setting, a checkpoint
    on a signal and ckpt_path=auto, each run's folder named by its lr and seed; the seeds it accepts."""
    text = (Path(s12.__file__).parent / "run.sh").read_text()
    arm = shlex.split(re.search(r"\nARM=\((.*?)\)\n", text, re.S).group(1).replace("$SEEDS", "0"))
    values = dict(o.split("=", 1) for o in arm if "=" in o)
    assert [float(v) for v in values["optimizer.lr"].split(",")] == list(s12.LRS)
    assert [int(v) for v in re.search(r"for width in ([0-9 ]+); do", text).group(1).split()] == list(s12.WIDTHS)
    assert re.search(r"case \$s in ([0-9|]+)\)", text).group(1).split("|") == [str(s) for s in s12.SEEDS]
    cfg = compose(*(o.split(",")[0] if o.startswith("optimizer.lr") else o for o in arm), "model.dim=64",
                  f"paths.log_dir={tmp_path}", hydra=True)
    run = {"name": cfg.name, "norm": cfg.model.norm, "qk_norm": cfg.model.qk_norm, "z_loss": cfg.module.z_loss,
           "parametrization": cfg.model.parametrization}
    assert s12.arm_of(run) == "mup" and run["name"] == s12.TAG and cfg.model.mup_base_width == s12.BASE
    assert cfg.trainer.max_steps == 400 and cfg.callbacks.stability.probe_every_n_steps == 10  # S3's setting
    assert cfg.ckpt_path == "auto" and cfg.callbacks.preemption._target_.endswith("PreemptionCheckpoint")
    assert cfg.hydra.sweep.subdir == "lr0.00178_seed0"
    assert all(abs(math.log10(b / a) - 0.25) < 0.003 for a, b in zip(s12.LRS[:-1], s12.LRS[1:], strict=True))


def test_s12_r3_plot_runs_on_the_made_up_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(s12, "standard_runs", lambda: Runs(parabolas("standard", -0.42, s12.STANDARD_SEEDS)))
    s12.plot(Runs(parabolas("mup", 0.0, s12.SEEDS)), tmp_path)
    assert (tmp_path / "transfer.png").stat().st_size > 10_000
