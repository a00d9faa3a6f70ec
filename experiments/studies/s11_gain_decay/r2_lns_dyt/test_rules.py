"""S11 round 2's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs


def _decay2_runs(cost: float, shrink: float = 0.7) -> tuple[Runs, dict]:
    """S11 r2 runs: LNS and DyT arms, decay costs ``cost`` nats; the decayed parameter ``shrink`` x its value."""
    from experiments.studies.s11_gain_decay.r2_lns_dyt import analyze as r2

    out, params = [], {}
    for a in r2.ARMS:
        for lr in r2.LRS:
            for dec in (False, True):
                for s in r2.SEEDS:
                    run = {"tags": ["decay2", a, *(["decay"] if dec else [])], "lr": lr, "seed": s,
                           "max_steps": r2.STEPS, "diverged": False, "status": "completed", "loss_init": 4.48,
                           "final_val_loss": 1.9 + (cost if dec else 0.0) + 0.003 * ((s * 3) % 5 - 2) * (1 + dec)}
                    out.append(run)
                    params[r2.key(run)] = (shrink if dec else 1.0) * (0.5 if a == "dyt" else 1.0)
    return Runs(out), params


def test_s11_r2_lns_dyt_rules():
    from experiments.studies.s11_gain_decay.r2_lns_dyt import analyze as r2

    res, md = r2.analyze(*_decay2_runs(0.05))
    assert res["precondition"][0]["status"] == "present", md
    assert {w for w, _ in res["verdicts"].values()} == {"confirmed"} and len(res["verdicts"]) == 4, md
    res, md = r2.analyze(*_decay2_runs(-0.01))  # decay helps a little: not at this scale
    assert {w for w, _ in res["verdicts"].values()} == {"not at this scale"}, md
    res, md = r2.analyze(*_decay2_runs(0.05, shrink=0.97))  # decay does not move the parameters: the gate
    assert res["precondition"][0]["status"] == "absent"
    assert {w for w, _ in res["verdicts"].values()} == {"premise absent at this scale"}, md
    runs, params = _decay2_runs(0.05)
    del params[r2.key(runs[0])]
    with pytest.raises(SystemExit, match="decayed parameter"):
        r2.analyze(runs, params)
