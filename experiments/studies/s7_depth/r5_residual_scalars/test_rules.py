"""S7 round 5's pre-registered rules on made-up runs: the arms read from the runs, the verdict words as the rules
say for runs made to confirm and to contradict each claim, and the gates."""

from __future__ import annotations

from experiments.common.study import Runs


def _runs(fails: dict[str, int]) -> Runs:
    """10 runs per arm, the first ``fails[arm]`` stalled at the unigram loss, the others trained at 2.1."""
    from experiments.studies.s7_depth.r5_residual_scalars import analyze as r5

    out = []
    for a in r5.ARMS:
        base, _, scalar = a.partition("+")
        for i, s in enumerate(r5.SEEDS):
            out.append({"norm": "none" if base == "none" else "layernorm",
                        "placement": "pre" if base == "none" else "post", "n_layers": r5.DEPTH, "seed": s,
                        "settings": {"model": {"branch_scale": scalar or "none"}},
                        "final_val_loss": 3.26 if i < fails[a] else 2.1, "unigram_loss": 3.26, "loss_init": 4.48,
                        "diverged": False, "status": "completed"})
    return Runs(out)


def test_s7_r5_rules():
    from experiments.studies.s7_depth.r5_residual_scalars import analyze as r5

    res, md = r5.analyze(_runs({"post": 6, "post+rezero": 0, "post+layerscale": 1,
                                "none": 10, "none+rezero": 0, "none+layerscale": 6}))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words == {"Z-rezero": "confirmed", "Z-layerscale": "confirmed", "N-rezero": "confirmed",
                     "N-layerscale": "unresolved"}, md
    res, md = r5.analyze(_runs({"post": 3, "post+rezero": 3, "post+layerscale": 5,
                                "none": 1, "none+rezero": 0, "none+layerscale": 0}))
    words = {k: w for k, (w, _) in res["verdicts"].items()}
    assert words == {"Z-rezero": "not at this scale", "Z-layerscale": "not at this scale",
                     "N-rezero": "premise absent at this scale", "N-layerscale": "premise absent at this scale"}, md
    assert res["failed"]["none"] == [1, 10]
