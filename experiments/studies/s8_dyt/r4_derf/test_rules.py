"""S8 round 4's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs


def _derf_runs(derf_gap: float, scale_gain: float, saturated: float = 0.05) -> tuple[Runs, dict]:
    """S8 r4 runs: RMSNorm at 1.62, DyT 0.08 above it, Derf ``derf_gap`` above it; the embedding scale lowers DyT and
    Derf by ``scale_gain``; the premise ``saturated`` for every point-wise arm and seed."""
    from experiments.studies.s8_dyt.r4_derf import analyze as r4

    offsets = {"rmsnorm": 0.0, "dyt": 0.08, "derf": derf_gap, "dyt+scale": 0.08 - scale_gain,
               "derf+scale": derf_gap - scale_gain}
    out = []
    for a, offset in offsets.items():
        norm, scaled = a.split("+")[0], a.endswith("+scale")
        for s in r4.SEEDS:
            out.append({"norm": norm, "tags": ["derf", *(["embscale"] if scaled else [])], "seed": s, "lr": 3e-3,
                        "max_steps": r4.STEPS, "final_val_loss": 1.62 + offset + 0.002 * ((s * 3) % 5 - 2),
                        "diverged": False, "status": "completed", "unigram_loss": 3.26, "loss_init": 4.48})
    return Runs(out), {a: [saturated] * len(r4.SEEDS) for a in r4.POINTWISE}


def test_s8_r4_derf_rules():
    from experiments.studies.s8_dyt.r4_derf import analyze as r4

    res, md = r4.analyze(*_derf_runs(0.0, 0.05))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words == {"E1": "confirmed", "E2": "confirmed", "E3a": "confirmed", "E3b": "confirmed"}, md
    res, md = r4.analyze(*_derf_runs(0.09, -0.05))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert set(words.values()) == {"not at this scale"}, md
    res, md = r4.analyze(*_derf_runs(0.0, 0.05, saturated=0.001))
    assert all(w == "premise absent at this scale" for w, _ in res["verdicts"].values()), md
    runs, _ = _derf_runs(0.0, 0.05)
    with pytest.raises(SystemExit, match="premise"):
        r4.analyze(runs, {})
    verdicts = r4.engine(runs)
    assert {c["arm"] for c in verdicts["comparisons"]} == set(r4.POINTWISE)
