"""S11 round 1's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import pytest

from experiments.common.study import Runs


def _gain_runs(decay_cost: float, zc_cost: float, shrink: float = 0.7) -> tuple[Runs, dict]:
    """S11 r1 runs: decay costs ``decay_cost`` with standard gains and ``zc_cost`` with zero-centered ones; decay
    leaves the standard gains at ``shrink`` of their RMS."""
    from experiments.studies.s11_gain_decay.r1_prereg import analyze as r1

    out, gains = [], {}
    for lr in r1.LRS:
        for zc in (False, True):
            for dec in (False, True):
                for s in r1.SEEDS:
                    cost = (zc_cost if zc else decay_cost) if dec else 0.0
                    run = {"lr": lr, "seed": s, "tags": ["gains", *(["decay"] if dec else [])], "max_steps": r1.STEPS,
                           "norm_options": {"zero_centered": zc}, "final_val_loss": 1.8 + cost + 0.003 * ((3 * s) % 5),
                           "diverged": False, "status": "completed", "unigram_loss": 3.26, "loss_init": 4.48}
                    out.append(run)
                    gains[r1.key(run)] = 1.2 * (shrink if dec and not zc else 1.0)
    return Runs(out), gains


def test_s11_r1_gain_decay_rules():
    from experiments.studies.s11_gain_decay.r1_prereg import analyze as r1
    from minillm.model import ModelConfig, Transformer

    words = lambda res: {k: w for k, (w, _) in res["verdicts"].items()}  # noqa: E731
    res, md = r1.analyze(*_gain_runs(0.05, 0.0))
    assert set(words(res).values()) == {"confirmed"}, md
    res, md = r1.analyze(*_gain_runs(0.0, 0.05))
    assert set(words(res).values()) == {"not at this scale"}, md
    res, md = r1.analyze(*_gain_runs(0.05, 0.0, shrink=0.98))
    assert set(words(res).values()) == {"premise absent at this scale"}, md
    with pytest.raises(SystemExit, match="gain RMS"):
        r1.analyze(_gain_runs(0.05, 0.0)[0], {})
    model = Transformer(ModelConfig(vocab_size=20, dim=16, n_layers=1, n_heads=2, norm_options={"zero_centered": True}))
    assert r1.gain_rms(model) == pytest.approx(1.0)  # stored 0, effective 1
