"""A round that runs in pieces (experiments/common/study.py): each piece's runs saved with ``--collect``, the
analysis reading the saved pieces among its sweep folders exactly as it reads the sweeps themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.studies.s7_depth.r6_scalars_budget import analyze as s7r6

TRAIN = "train/loss"


def sweep(root: Path, lr: float, seeds: range) -> Path:
    """A made-up sweep of S7 round 6's four arms: summary.json and csv/metrics.csv per run, as train.py leaves them."""
    arms = [("post", "none"), ("post", "rezero"), ("post", "layerscale"), ("deepnorm", "none")]
    for i, ((placement, scalar), seed) in enumerate((a, s) for a in arms for s in seeds):
        run = root / str(i)
        (run / "csv").mkdir(parents=True)
        final = 2.1 + 0.01 * i + (0.05 if scalar != "none" else 0)
        (run / "summary.json").write_text(json.dumps({
            "norm": "layernorm", "placement": placement, "lr": lr, "seed": seed,
            "n_layers": 48, "max_steps": 900, "final_val_loss": final, "best_val_loss": final, "diverged": False,
            "loss_init": 4.17, "run_dir": str(run), "settings": {"model": {"branch_scale": scalar}}}))
        (run / "csv" / "metrics.csv").write_text(f"step,{TRAIN},val/loss\n0,4.1,\n899,{final},\n899,,{final}\n")
    return root


def test_pieces_saved_apart_analyse_as_the_whole_sweep(tmp_path):
    """Two pieces collected into their own folders give the analysis the same results and saved runs as the sweeps
    read together; nothing but the saved runs is written by ``--collect``."""
    sweeps = [sweep(tmp_path / "a", 3e-3, range(30, 33)), sweep(tmp_path / "b", 3e-3, range(33, 36))]
    s7r6.main([*map(str, sweeps), "--out", str(tmp_path / "whole")])
    for s in sweeps:
        s7r6.main([str(s), "--collect", "--out", str(tmp_path / "parts" / s.name)])
        assert sorted(p.name for p in (tmp_path / "parts" / s.name).iterdir()) == ["curves.json", "runs.jsonl"]
    s7r6.main([str(tmp_path / "parts" / "a"), str(tmp_path / "parts" / "b"), "--out", str(tmp_path / "pieces")])
    for name in ("runs.jsonl", "curves.json", "results.json", "results.md"):
        assert (tmp_path / "pieces" / name).read_text() == (tmp_path / "whole" / name).read_text(), name
    results = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert results["failed"]["deepnorm@0.003"] == [0, 6] and len(results["trained_loss"]["post+rezero@0.003"]) == 6


def test_a_piece_given_twice_or_collect_without_a_folder_stops_with_one_line(tmp_path, capsys):
    s = sweep(tmp_path / "a", 1e-2, range(30, 32))
    s7r6.main([str(s), "--collect", "--out", str(tmp_path / "part")])
    with pytest.raises(SystemExit, match=r"a run is given twice .*: .*a/0$"):
        s7r6.main([str(tmp_path / "part"), str(s), "--out", str(tmp_path / "both")])
    assert not (tmp_path / "both").exists()
    with pytest.raises(SystemExit):
        s7r6.main([str(s), "--collect"])
    assert "--collect needs sweep folder(s) and --out DIR" in capsys.readouterr().err
