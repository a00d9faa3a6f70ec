"""S6 round 1's pre-registered rules on made-up runs: the verdict words come out as the rules say, for runs
made to confirm and to contradict each claim (the committed runs are re-analysed by tests/test_experiments.py)."""

from __future__ import annotations

import json

from experiments.common.layout import STUDIES


def test_s6_quality_rules():
    """Both rounds' committed numbers come back from their runs; round 2's paired interval decides as written."""
    from experiments.studies.s6_cost.r1_cost import quality

    results = sorted(STUDIES.glob("s6_cost/r*/quality.json"))  # round 1's and round 2's
    assert results
    for path in results:
        committed = json.loads(path.read_text())
        again = quality.analyze(committed["runs"], committed["seeds"])
        assert again == {k: committed[k] for k in again}, path
        assert quality.verdicts(committed)["comparisons"][0]["verdict"] == committed["engine_verdict"]

    def verdict(diffs):
        runs = [dict(norm=n, seed=s, final_val_loss=2.0 + 0.01 * (s % 3) + (d if n == "rmsnorm" else 0.0))
                for s, d in enumerate(diffs) for n in quality.NORMS]
        return quality.analyze(runs, list(range(len(diffs))))["verdict"]

    assert verdict([0.001, -0.002, 0.003, -0.001, 0.0]) == "parity"
    assert verdict([-0.05, -0.06, -0.04, -0.05]) == "difference: rmsnorm better"
    assert verdict([0.004, 0.006, 0.005, 0.005]) == "parity (a difference inside the margin: layernorm better)"
    assert verdict([0.05, -0.06, 0.04, -0.03]) == "inconclusive"
