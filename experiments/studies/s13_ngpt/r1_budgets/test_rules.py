"""S13 round 1's pre-registered rules on made-up runs: the lr chosen on the pilot seeds, the verdict words as the
rules say for runs made to confirm and to contradict each claim, and the gate when a pilot's best lr is at the grid's
edge."""

from __future__ import annotations

import math

import pytest

from experiments.common.study import Runs


def _run(a: str, lr: float, seed: int, steps: int, loss: float | None) -> dict:
    from experiments.studies.s13_ngpt.r1_budgets import analyze as r1

    failed = loss is None
    curve = [] if failed else [[49, loss + 0.4], [steps - 1, loss]]
    return {"norm": "none" if a == "ngpt" else "rmsnorm", "settings": {"model": {"ngpt": a == "ngpt"}},
            "tags": [r1.TAG], "lr": lr, "seed": seed, "max_steps": steps, "final_val_loss": None if failed else loss,
            "diverged": failed, "status": "completed", "unigram_loss": 3.26, "loss_init": 4.48,
            "curves": {"val/loss": curve}}


def _runs(gains: dict[int, float], best: dict[str, float]) -> Runs:
    """Pilot bowls centered on ``best`` (an arm -> lr); judged baseline at 1.70; nGPT at budget b 1.70 + gains[b]."""
    from experiments.studies.s13_ngpt.r1_budgets import analyze as r1

    out = []
    for a in r1.ARMS:
        for lr in r1.LRS:
            for s in r1.PILOT_SEEDS:
                out.append(_run(a, lr, s, r1.STEPS, 1.7 + 0.1 * abs(math.log10(lr / best[a]))))
    for s in r1.SEEDS:
        noise = 0.002 * ((s * 3) % 5 - 2)
        out.append(_run("baseline", best["baseline"], s, r1.STEPS, 1.70 + noise))
        for b in r1.BUDGETS:
            out.append(_run("ngpt", best["ngpt"], s, b, 1.70 + gains[b] + noise + 0.001 * ((s * 2) % 3 - 1)))
    return Runs(out)


def test_s13_r1_rules():
    from experiments.studies.s13_ngpt.r1_budgets import analyze as r1

    tuned = {"baseline": 1e-2, "ngpt": 3e-2}
    res, md = r1.analyze(_runs({100: 0.0, 200: -0.02, 400: -0.05}, tuned))
    assert res["lr_choice"]["baseline"]["lr"] == 1e-2 and res["lr_choice"]["ngpt"]["lr"] == 3e-2
    assert {k: w for k, (w, _) in res["verdicts"].items()} == {"F4": "confirmed", "F2": "confirmed",
                                                                 "F1": "confirmed"}, md
    assert res["steps_to_target"] == {2: 400, 3: 400, 4: 400, 5: 400, 6: 400}
    res, md = r1.analyze(_runs({100: 0.3, 200: 0.2, 400: 0.05}, tuned))
    assert {w for w, _ in res["verdicts"].values()} == {"not at this scale"}, md
    res, md = r1.analyze(_runs({100: 0.0, 200: 0.0, 400: -0.05}, {"baseline": 1e-3, "ngpt": 3e-2}))
    assert all(w == "premise absent at this scale" for w, _ in res["verdicts"].values()), md
    verdicts = r1.engine(_runs({100: 0.0, 200: 0.0, 400: -0.05}, tuned))
    assert {c["arm"] for c in verdicts["comparisons"]} == {"ngpt@100", "ngpt@200", "ngpt@400"}


def test_s13_r1_judged_runs_must_use_the_chosen_lr():
    from experiments.studies.s13_ngpt.r1_budgets import analyze as r1

    runs = _runs({100: 0.0, 200: 0.0, 400: 0.0}, {"baseline": 1e-2, "ngpt": 3e-2})
    next(r for r in runs if r["seed"] in r1.SEEDS and r1.arm(r) == "ngpt")["lr"] = 1e-1
    with pytest.raises(SystemExit, match="chosen lr"):
        r1.analyze(runs)


def test_s13_r1_a_failed_pilot_run_counts_at_ln_v():
    from experiments.studies.s13_ngpt.r1_budgets import analyze as r1

    runs = _runs({100: 0.0, 200: 0.0, 400: 0.0}, {"baseline": 1e-2, "ngpt": 3e-2})
    for r in runs:  # nGPT's best pilot lr fails in one seed: the mean at ln V moves the choice to a neighbour
        if r1.arm(r) == "ngpt" and r["seed"] == 0 and r["lr"] == 3e-2:
            r.update(final_val_loss=None, diverged=True)
    assert r1.choose_lr(runs)["ngpt"]["lr"] in (1e-2, 1e-1)


def test_s13_r1_choose_lr_reads_the_pilot_folders_and_prints_the_two_lrs(tmp_path, monkeypatch, capsys):
    """`--choose-lr SWEEP...` (what run.sh reads its lrs from): the pilot runs' summary.json files in, lr_choice.json
    and "<baseline lr> <nGPT lr>" out."""
    import json

    from experiments.studies.s13_ngpt.r1_budgets import analyze as r1

    pilot = [r for r in _runs({100: 0.0, 200: 0.0, 400: 0.0}, {"baseline": 3e-3, "ngpt": 1e-2})
             if r["seed"] in r1.PILOT_SEEDS]
    for i, r in enumerate(pilot):
        folder = tmp_path / ("pilot_ngpt" if r1.arm(r) == "ngpt" else "pilot_baseline") / str(i)
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({k: v for k, v in r.items() if k != "curves"}))
    monkeypatch.setattr(r1, "LR_FILE", tmp_path / "lr_choice.json")
    r1.main(["--choose-lr", str(tmp_path / "pilot_baseline"), str(tmp_path / "pilot_ngpt")])
    assert capsys.readouterr().out.split() == ["0.003", "0.01"]
    chosen = json.loads((tmp_path / "lr_choice.json").read_text())
    assert (chosen["baseline"]["lr"], chosen["ngpt"]["lr"]) == (3e-3, 1e-2)
