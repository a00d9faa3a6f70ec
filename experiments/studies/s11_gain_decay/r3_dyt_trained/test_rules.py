"""S11 round 3's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs


def _decay3_runs(cost: float, shrink: float = 0.7, val: float = 2.2) -> tuple[Runs, dict]:
    """S11 r3 runs (DyT): decay costs ``cost`` nats, alpha ``shrink`` x its value, no-decay val loss ``val``."""
    from experiments.studies.s11_gain_decay.r3_dyt_trained import analyze as r3

    out, params = [], {}
    for lr in r3.LRS:
        for dec in (False, True):
            for s in r3.SEEDS:
                run = {"tags": [r3.TAG, "dyt", *(["decay"] if dec else [])], "lr": lr, "seed": s,
                       "max_steps": r3.STEPS, "diverged": False, "status": "completed", "loss_init": 4.48,
                       "unigram_loss": 3.26,
                       "final_val_loss": val + (cost if dec else 0.0) + 0.003 * ((s * 3) % 5 - 2) * (1 + dec)}
                out.append(run)
                params[r3.key(run)] = (shrink if dec else 1.0) * 0.5
    return Runs(out), params


def test_s11_r3_dyt_trained_rules():
    from experiments.studies.s11_gain_decay.r3_dyt_trained import analyze as r3

    res, md = r3.analyze(*_decay3_runs(0.05))
    assert [g["status"] for g in res["precondition"]] == ["present", "present"], md
    assert {w for w, _ in res["verdicts"].values()} == {"confirmed"} and len(res["verdicts"]) == 2, md
    res, md = r3.analyze(*_decay3_runs(-0.01))  # decay helps a little: not at this scale
    assert {w for w, _ in res["verdicts"].values()} == {"not at this scale"}, md
    for absent in (dict(shrink=0.97), dict(val=3.1)):  # alpha unmoved; DyT stuck near the unigram loss
        res, md = r3.analyze(*_decay3_runs(0.05, **absent))
        assert "absent" in [g["status"] for g in res["precondition"]], md
        assert {w for w, _ in res["verdicts"].values()} == {"premise absent at this scale"}, md
    runs, params = _decay3_runs(0.05)
    del params[r3.key(runs[0])]
    with pytest.raises(SystemExit, match="mean alpha"):
        r3.analyze(runs, params)
