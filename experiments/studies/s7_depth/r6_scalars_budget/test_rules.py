"""S7 round 6's pre-registered rules on made-up runs: the words its rules say for runs made to confirm the claim
(the scalars' cost gone), to contradict it, to lack its premise (DeepNorm failing at an lr), and with too few pairs."""

from __future__ import annotations

from experiments.common.study import Runs


def _runs(cost: float, deepnorm_fails: int = 0, post_fails: int = 5) -> Runs:
    """Each scalar arm ``cost`` nats above DeepNorm on every seed; DeepNorm fails in its first ``deepnorm_fails`` seeds
    at lr 1e-2 only; Post-LN without a scalar fails in ``post_fails`` seeds (stalled at the unigram loss)."""
    from experiments.studies.s7_depth.r6_scalars_budget import analyze as r6

    out = []
    for lr in r6.LRS:
        for arm in r6.ARMS:
            for i, s in enumerate(r6.SEEDS):
                loss = 2.05 + 0.004 * i + (cost + 0.002 * (i % 3) if arm.startswith("post+") else 0.0)
                stalled = ((arm == "post" and i < post_fails)
                           or (arm == "deepnorm" and lr == 1e-2 and i < deepnorm_fails))
                scalar = arm.split("+")[1] if "+" in arm else "none"
                out.append({"norm": "layernorm", "placement": "deepnorm" if arm == "deepnorm" else "post", "lr": lr,
                            "seed": s, "n_layers": r6.DEPTH, "max_steps": r6.STEPS, "status": "completed",
                            "settings": {"model": {"branch_scale": scalar}}, "diverged": False,
                            "final_val_loss": 3.2 if stalled else loss, "unigram_loss": 3.26, "curves": {}})
    return Runs(out)


def _words(res: dict) -> dict:
    return {k: w for k, (w, _) in res["verdicts"].items()}


def test_s7_r6_scalars_budget_rules():
    from experiments.studies.s7_depth.r6_scalars_budget import analyze as r6

    res, md = r6.analyze(_runs(0.0))
    assert set(_words(res)) == {"C-rezero@0.003", "C-rezero@0.01", "C-layerscale@0.003", "C-layerscale@0.01"}, md
    assert set(_words(res).values()) == {"confirmed"}, md
    assert res["failed"]["post@0.003"] == [5, 10] and res["failed"]["deepnorm@0.003"] == [0, 10], md
    res, md = r6.analyze(_runs(0.1))
    assert set(_words(res).values()) == {"not at this scale"}, md
    res, md = r6.analyze(_runs(0.0, deepnorm_fails=2))  # the reference fails at 1e-2: that lr's parts lack it
    assert _words(res) == {"C-rezero@0.003": "confirmed", "C-layerscale@0.003": "confirmed",
                           "C-rezero@0.01": "premise absent at this scale",
                           "C-layerscale@0.01": "premise absent at this scale"}, md
    few = Runs(r for r in _runs(0.0) if not (r["placement"] == "deepnorm" and r["lr"] == 3e-3 and r["seed"] > 31))
    res, md = r6.analyze(few)
    assert _words(res)["C-rezero@0.003"] == "unresolved" and "fewer than 3" in md, md
