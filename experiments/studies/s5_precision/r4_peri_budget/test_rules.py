"""S5 round 4's pre-registered rules on made-up runs: the words its rules say for runs made to confirm each claim,
to contradict it and to lack its premise (at the pilot, so stage 2 never runs), and the design's checks: a judged
run at an lr the pilot did not choose, or a run without the median |h|, stops the analysis."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs


def _runs(pre_growth: float, peri_factor: float, peri_gap: float, judged: bool = True, judged_lr: float | None = None):
    """Pre-LN's stream grows ``pre_growth`` over its 12 blocks, Peri-LN's ``peri_factor`` times that; Peri-LN
    ``peri_gap`` nats from Pre-LN; lr 1e-2 best for Pre-LN and 3e-3 for Peri-LN on the pilot."""
    from experiments.studies.s5_precision.r4_peri_budget import analyze as r4

    best = {"pre": 1e-2, "peri": 3e-3}
    out = []
    for p in r4.PLACEMENTS:
        cells = [(lr, r4.PILOT_SEED) for lr in r4.LRS]
        if judged:
            cells += [(judged_lr or best[p], s) for s in r4.JUDGED_SEEDS]
        for lr, s in cells:
            growth = pre_growth * (peri_factor if p == "peri" else 1.0) * (1 + 0.03 * (s % 7))
            curves = {}
            for i in range(r4.DEPTH):
                rms = 1.0 + (growth - 1.0) * i / (r4.DEPTH - 1)
                curves |= {f"layer/{i}/resid_rms": [(r4.STEPS, rms)], f"layer/{i}/resid_max": [(r4.STEPS, 8 * rms)],
                           f"layer/{i}/resid_median": [(r4.STEPS, 0.6 * rms)]}
            loss = 1.6 + (peri_gap if p == "peri" else 0.0) + (0.0 if lr == best[p] else 0.05) + 0.003 * (s % 7)
            out.append({"placement": p, "lr": lr, "seed": s, "n_layers": r4.DEPTH, "tags": [r4.TAG],
                        "final_val_loss": loss, "diverged": False, "status": "completed", "curves": curves})
    return Runs(out)


def _words(res: dict) -> dict:
    return {k: w for k, (w, _) in res["verdicts"].items()}


def test_s5_r4_peri_budget_rules():
    from experiments.studies.s5_precision.r4_peri_budget import analyze as r4

    res, md = r4.analyze(_runs(6.0, 0.3, -0.03))  # 6 >= sqrt(12): the premise
    assert res["chosen_lr"] == {"pre": 1e-2, "peri": 3e-3} and res["pilot_gate"]["status"] == "present", md
    assert _words(res) == {"P1": "confirmed", "P2": "confirmed"}, md
    assert res["precondition"][2]["premise"] == "massive_activations", md  # 8 / 0.6: reported, absent
    assert res["precondition"][2]["status"] == "absent" and _words(res)["P1"] == "confirmed"
    res, md = r4.analyze(_runs(6.0, 1.0, 0.2))
    assert _words(res) == {"P1": "not at this scale", "P2": "not at this scale"}, md
    res, md = r4.analyze(_runs(2.0, 0.3, -0.03, judged=False))  # the pilot's gate absent: no stage 2
    assert set(_words(res).values()) == {"premise absent at this scale"} and r4.NOT_RUN_STAGE2 in md, md
    res, md = r4.analyze(_runs(2.0, 0.3, -0.03))  # judged anyway, both gates absent
    assert set(_words(res).values()) == {"premise absent at this scale"}, md
    res, md = r4.analyze(_runs(3.3, 0.3, -0.03))  # the pilot's gate absent (3.3 < sqrt 12), the judged one present
    assert res["pilot_gate"]["status"] == "absent" and res["precondition"][1]["status"] == "present", md
    assert set(_words(res).values()) == {"premise absent at this scale"}, md


@pytest.mark.parametrize("failed_seeds", [(10,), (10, 11, 12)])
def test_s5_r4_a_failed_judged_run_leaves_both_parts_unresolved(failed_seeds):
    from experiments.studies.s5_precision.r4_peri_budget import analyze as r4

    runs = _runs(6.0, 0.3, -0.03)
    for r in runs:
        if r["placement"] == "peri" and r["seed"] in failed_seeds:
            r.update(diverged=True, status="diverged", final_val_loss=None)
    res, md = r4.analyze(runs)
    assert _words(res) == {"P1": "unresolved", "P2": "unresolved"} and "failed" in md, md
    assert all(r4.depth_growth(r) is None for r in runs if r.get("diverged"))


def test_s5_r4_design_is_enforced():
    from experiments.studies.s5_precision.r4_peri_budget import analyze as r4

    with pytest.raises(SystemExit, match="not at the pilot's lr"):
        r4.analyze(_runs(6.0, 0.3, -0.03, judged_lr=3e-2))
    with pytest.raises(SystemExit, match="judged runs .* are missing"):
        r4.analyze(_runs(6.0, 0.3, -0.03, judged=False))
    runs = _runs(6.0, 0.3, -0.03)
    runs[0]["curves"] = {k: v for k, v in runs[0]["curves"].items() if not k.endswith("resid_median")}
    with pytest.raises(SystemExit, match="median"):
        r4.analyze(runs)
    runs = Runs(r for r in _runs(6.0, 0.3, -0.03) if not (r["seed"] == r4.PILOT_SEED and r["lr"] == 3e-2))
    with pytest.raises(SystemExit, match="the pilot lacks"):
        r4.analyze(runs)
    runs = Runs(r for r in _runs(6.0, 0.3, -0.03) if not (r["placement"] == "peri" and r["seed"] == 12))
    with pytest.raises(SystemExit, match="judged runs missing: peri seed 12"):
        r4.analyze(runs)
    runs = _runs(6.0, 0.3, -0.03)
    for r in runs:
        if r["placement"] == "pre" and r["seed"] == r4.PILOT_SEED:
            r.update(diverged=True, final_val_loss=None)
    with pytest.raises(SystemExit, match="no pilot run of pre trained"):
        r4.analyze(runs)
