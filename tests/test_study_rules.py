"""The rules the studies share (experiments/common: the precondition gate, the tanh saturation premise, the
provenance line). Each round's own pre-registered rules are tested on made-up runs in its folder
(experiments/studies/sNN_name/rK_name/test_rules.py); the committed runs are re-analyzed by
tests/test_experiments.py."""

from __future__ import annotations

import math

import pytest


def test_precondition_gate_rule():
    """experiments.common.precondition: a premise's status counts seeds (present: every seed meets the threshold,
    absent: none, mixed: some), an absent premise turns a verdict word into PREMISE_ABSENT, and a multi-part
    verdict is counted with Holm's adjustment across its parts."""
    from experiments.common import precondition as pre

    assert set(pre.PREMISES) == {"idle_deep_layers", "stream_growth", "massive_activations", "tanh_saturation"}
    idle = pre.measure("idle_deep_layers", {"L=12": [0.1, 0.2], "L=24": [0.3, 0.5], "L=48": [0.2, 0.4]}, "made up")
    assert [c["status"] for c in idle["cells"].values()] == ["present", "absent", "mixed"]
    assert idle["status"] == "mixed" and idle["rule"] == "at most 0.25"
    assert pre.measure("stream_growth", {"L=6": [0.6, 0.7]}, "x")["status"] == "absent"
    assert pre.measure("tanh_saturation", {"a": [0.05, 0.02]}, "x")["status"] == "present"
    absent = pre.measure("stream_growth", {"L=6": [0.6, 0.7], "L=12": []}, "x")
    assert absent["status"] == "absent" and absent["cells"]["L=12"]["status"] == "not recorded"
    assert pre.gate("not at this scale", absent) == pre.PREMISE_ABSENT == "premise absent at this scale"
    assert pre.gate("confirmed", idle) == "confirmed"  # mixed: the rule's word stands
    assert pre.gate("partly", pre.cell(idle, "L=24")) == pre.PREMISE_ABSENT
    assert pre.gate("partly", pre.cell(idle, "L=12"), pre.none("x")) == "partly"
    missing = pre.not_recorded("massive_activations", "median not logged", {"L=6": 7.3}, "max / RMS")
    assert missing["status"] == "not recorded" and pre.gate("reversed", missing) == "reversed"
    assert "not recorded" in pre.line(missing) and "deciding nothing" in pre.line(missing)
    assert "none beyond the setting" in pre.line(pre.none("a cost"))
    with pytest.raises(ValueError, match="status"):
        pre.reported("p", "q", "at least 1", {"a": 1}, "maybe", "s")

    # a seed mean against a threshold, read with its interval
    assert pre.against([0.079, 0.080, 0.081], 0.10, "at most")["reading"] == "holds"
    assert pre.against([0.105, 0.061, 0.071], 0.10, "at most")["reading"] == "unresolved"
    assert pre.against([0.2, 0.21, 0.19], 0.10, "at most")["reading"] == "fails"
    ratio = pre.against([4.0, 4.4], 2.0, "at least", log=True)
    assert ratio["mean"] == pytest.approx(math.sqrt(4.0 * 4.4)) and ratio["ci_low"] > 0
    # Holm across parts: three parts hold on the seed means; only the clear one survives the adjustment
    parts = pre.parts({"a": ([3.0, 3.01, 2.99, 3.0], 2.0, "at least"), "b": ([2.1, 1.95, 2.3], 2.0, "at least"),
                       "c": ([2.5, 1.6], 2.0, "at least"), "d": ([1.0, 1.1], 2.0, "at least")})
    assert (parts["on_means"], parts["holm"], parts["n"]) == (3, 1, 4)
    assert parts["text"] == "1 of 4 parts, Holm-adjusted (3 of 4 on the seed means)"
    assert pre.count(parts, "a") == "1 of 1 parts, Holm-adjusted (1 on the seed means)"
    assert parts["parts"]["a"]["p_holm"] >= parts["parts"]["a"]["p"]


def test_tanh_saturation_and_provenance():
    """The DyT premise's quantity on a real model: with tiny inputs (GPT-2's N(0, 0.02) embeddings) tanh stays
    linear; with unit-scale ones and alpha0 0.5 about 5% of the first site's inputs reach |alpha x| >= 1. And the
    provenance line names each arm's commit, kernels and torch."""
    import torch

    from experiments.common.machine import provenance
    from experiments.common.precondition import tanh_saturation
    from minillm.model import ModelConfig, Transformer

    cfg = dict(vocab_size=50, dim=64, n_layers=1, n_heads=4, max_seq_len=16, norm="dyt")
    torch.manual_seed(0)
    idx = torch.randint(0, 50, (8, 16))
    small = Transformer(ModelConfig(**cfg, norm_options={"alpha0": 2.0}))
    assert tanh_saturation(small, idx) == 0.0
    unit = Transformer(ModelConfig(**cfg, init="xavier", norm_options={"alpha0": 0.5}))
    assert 0.01 < tanh_saturation(unit, idx) < 0.1
    runs = [{"arm": "a", "git_commit": "0123456789", "git_dirty": True}, {"arm": "b", "git_commit": "abcdef0123",
                                                                         "cpu_capability": "AVX2",
                                                                         "torch_version": "2.13.0+cpu"}]
    line = provenance(runs, lambda r: r["arm"])
    assert "the arms differ" in line and "0123456+dirty, unrecorded kernels" in line and "abcdef0, AVX2" in line
    assert "the same for every arm" in provenance(runs[:1] * 2, lambda r: r["arm"])
