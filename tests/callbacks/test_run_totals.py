"""RunTotals (minillm/training/callbacks/run_totals.py): the run-level maxima and counts of summary.json, in one
state."""

from __future__ import annotations

import torch

from minillm.training.callbacks import RunTotals


def test_maxima_counts_and_last_values_with_tensors_kept_on_their_device():
    totals = RunTotals()
    for value in (torch.tensor(2.0), torch.tensor(float("inf")), torch.tensor(float("nan")), torch.tensor(3.0)):
        totals.record_max("max_grad_norm", value)  # non-finite values are not a maximum
    totals.record_max("max_abs_h", 5.0)
    totals.record_max("max_abs_h", float("nan"))
    totals.record_max("max_log_z", torch.tensor(float("inf")))  # nothing finite yet
    totals.add("skipped_steps", torch.tensor(1))
    totals.add("skipped_steps", 0)
    totals.add("spike_count")
    totals.set("amp_scale", 512.0)
    assert isinstance(totals._maxima["max_grad_norm"], torch.Tensor)  # no host sync until read
    assert totals.values() == {"max_grad_norm": 3.0, "max_abs_h": 5.0, "max_log_z": None, "skipped_steps": 1,
                               "spike_count": 1, "amp_scale": 512.0}
    assert totals.get("amp_scale") == 512.0 and totals.get("absent", 7) == 7


def test_a_resumed_run_continues_every_total():
    first = RunTotals()
    first.record_max("max_grad_norm", torch.tensor(4.0))
    first.add("nonfinite_grad_steps", torch.tensor(2))
    first.set("stopped_early", True)
    resumed = RunTotals()
    resumed.load_state_dict(first.state_dict())
    resumed.record_max("max_grad_norm", torch.tensor(3.0))
    resumed.add("nonfinite_grad_steps", torch.tensor(1))
    assert resumed.values() == {"max_grad_norm": 4.0, "nonfinite_grad_steps": 3, "stopped_early": True}


def test_a_trainer_without_a_configured_run_totals_gets_one_of_its_own():
    class Trainer:
        def __init__(self, callbacks):
            self.callbacks = callbacks

    configured = RunTotals()
    assert RunTotals.of(Trainer([configured])) is configured
    bare = Trainer([])
    assert RunTotals.of(bare) is RunTotals.of(bare) is not configured
