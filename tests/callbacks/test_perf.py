"""PerfMonitor (minillm/callbacks/perf.py): the model it counts FLOPs on."""


from __future__ import annotations

import warnings

from minillm.model import ModelConfig


def test_the_model_the_perf_monitor_counts_on_gives_no_second_warning():
    """The pooled-BatchNorm warning comes from the run's model (its norms: one location, so Python shows it
    once); the meta-device copy PerfMonitor counts FLOPs on must not repeat it."""
    from minillm.callbacks.perf import meta_model

    cfg = ModelConfig(vocab_size=11, dim=16, n_layers=2, n_heads=2, norm="batchnorm",
                      norm_options={"stats": "pooled"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        meta_model(cfg)
    assert caught == []
