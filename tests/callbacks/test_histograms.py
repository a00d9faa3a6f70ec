"""NormHistograms (minillm/training/callbacks/histograms.py): histograms of constant and non-finite values."""


from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("values", [
    torch.ones(64),  # a gain that has not moved yet
    1.0 + torch.arange(64) * 1e-8,  # a gain moved by a tiny lr: a float32 step or two apart
    torch.tensor([1.0, float("inf"), -float("inf"), float("nan"), 2.0]),  # a diverging run
])
def test_histograms_of_constant_or_non_finite_values(values):
    import wandb

    from minillm.training.callbacks.histograms import histogram

    counts, edges = histogram(values)
    finite = values[values.isfinite()]
    assert counts.sum() == finite.numel() and edges[0] <= finite.min() <= finite.max() <= edges[-1]
    assert wandb.Histogram(np_histogram=(counts, edges)).histogram == counts.tolist()


def test_a_histogram_of_nothing_finite_is_none():
    from minillm.training.callbacks.histograms import histogram

    assert histogram(torch.tensor([float("nan"), float("inf")])) is None
