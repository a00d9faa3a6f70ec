"""PerfMonitor (minillm/training/callbacks/perf.py): the model it counts FLOPs on, the device peak MFU divides by."""


from __future__ import annotations

import warnings

import pytest
import torch

from minillm.model import ModelConfig


def test_the_model_the_perf_monitor_counts_on_gives_no_second_warning():
    """The pooled-BatchNorm warning comes from the run's model (its norms: one location, so Python shows it
    once); the meta-device copy PerfMonitor counts FLOPs on must not repeat it."""
    from minillm.training.callbacks.perf import meta_model

    cfg = ModelConfig(vocab_size=11, dim=16, n_layers=2, n_heads=2, norm="batchnorm",
                      norm_options={"stats": "pooled"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        meta_model(cfg)
    assert caught == []


@pytest.mark.parametrize(("name", "peak"), [("NVIDIA H200", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                            ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA GeForce GTX 1080", None)])
def test_the_device_peak_covers_cards_lightnings_table_lacks(monkeypatch, name, peak):
    import minillm.training.callbacks.perf as P

    monkeypatch.setattr(P, "get_available_flops", lambda device, dtype: None)  # as for a card Lightning lacks
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert P.device_peak_flops(torch.device("cuda"), torch.bfloat16) == peak
    assert P.device_peak_flops(torch.device("cuda"), torch.float32) is None  # the table is dense bf16 / fp16
    assert P.device_peak_flops(torch.device("cpu"), torch.bfloat16) is None
