"""Lead-lag (minillm/forensics.py): which signal moved first before a spike, on series whose answer is known."""

from __future__ import annotations

import math
import random

import pytest

from minillm.forensics import describe, layer_of, lead_lag, normalized, plot, report, series_of


def noisy(n: int, level: float, seed: int, jump_at: int | None = None, factor: float = 1.0) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    return [(s, level * (factor if jump_at is not None and s >= jump_at else 1.0) * math.exp(rng.gauss(0, 0.05)))
            for s in range(n)]


def test_the_signal_that_moved_first_ranks_first_and_noise_does_not_move():
    """Layer 2's update ratio jumps x50 at step 17, layer 0's gradient norm x10 at step 19, the loss x4 at step 20
    (the spike); layer 1's resid RMS only wobbles. Ranked by onset: update ratio, then gradient norm; the wobble has no
    onset."""
    series = {"layer/2/update_ratio": noisy(21, 1e-3, 1, jump_at=17, factor=50),
              "layer/0/grad_norm": noisy(21, 0.5, 2, jump_at=19, factor=10),
              "train/loss": noisy(21, 2.0, 3, jump_at=20, factor=4),
              "layer/1/resid_rms": noisy(21, 1.0, 4),
              "train/lr": noisy(21, 1e-3, 5, jump_at=3, factor=100)}  # not a signal: left out
    entries = lead_lag(series, spike_step=20)
    assert [e["signal"] for e in entries] == ["layer/2/update_ratio", "layer/0/grad_norm", "train/loss",
                                              "layer/1/resid_rms"]
    first = entries[0]
    assert (first["layer"], first["onset_step"], first["lead"]) == (2, 17, 3)
    assert first["peak_ratio"] == pytest.approx(50, rel=0.3) and first["z_onset"] > 5
    assert entries[1]["lead"] == 1 and entries[2]["lead"] == 0 and entries[3]["onset_step"] is None
    assert "layer/2/update_ratio: at step 17, 3 steps before the spike" in describe(first)
    assert "| 1 | `layer/2/update_ratio` | 2 | 17 | 3 |" in report({"kind": "loss_spike", "step": 20, "loss": 4.0,
                                                                      "loss_z": 9.0, "lead_lag": entries})


def test_a_fall_counts_as_a_move_and_steps_after_the_spike_are_ignored():
    series = {"layer/0/attn_entropy_min": noisy(30, 1.5, 6, jump_at=15, factor=0.05),  # entropy collapse at 15
              "layer/1/grad_norm": noisy(30, 1.0, 7, jump_at=25, factor=100)}  # after the spike at 20
    entries = lead_lag(series, spike_step=20)
    assert entries[0]["signal"] == "layer/0/attn_entropy_min" and entries[0]["z_onset"] < -5
    assert entries[1]["onset_step"] is None
    z = normalized(series, 20, "layer/0/attn_entropy_min")
    assert [s for s, _ in z] == list(range(21)) and abs(z[0][1]) < 3 and z[-1][1] < -5


def test_signals_attribute_to_their_layer_and_series_keep_finite_values(tmp_path):
    assert layer_of("layer/3/grad_norm") == 3 and layer_of("norm/layers.1.attn.q_norm/kurtosis") == 1
    assert layer_of("norm/norm/in_rms") == "final" and layer_of("stab/log_z_max") is None
    rows = [(s, {"train/loss": 2.0 if s != 2 else float("nan"), "layer/0/weight_norm": 3.0, "val/loss": 1.0})
            for s in range(5)]
    series = series_of(rows)
    assert sorted(series) == ["layer/0/weight_norm", "train/loss"] and len(series["train/loss"]) == 4
    plot(series, 4, lead_lag(series, 4), tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 5_000


def test_an_overflow_is_the_largest_move_and_nan_is_left_out():
    """At a divergence the step's statistics may be infinite (an fp32 overflow) or NaN: +inf is a move of z = inf at
    its step, NaN is no value."""
    series = {"layer/1/attn_logit_max": noisy(20, 4.0, 8) + [(20, math.inf)],
              "layer/0/resid_rms": noisy(20, 1.0, 9) + [(20, math.nan)]}
    entries = lead_lag(series, spike_step=20)
    assert entries[0]["signal"] == "layer/1/attn_logit_max" and entries[0]["onset_step"] == 20
    assert entries[0]["z_onset"] == math.inf and entries[1]["onset_step"] is None
    assert "z = inf" in describe(entries[0]) and "| inf |" in report({"kind": "divergence", "step": 20, "loss": None,
                                                                        "lead_lag": entries})


def test_the_spike_ring_starts_at_the_first_step_of_a_fit_a_resumed_one_too(tmp_path, monkeypatch):
    """A run resumed at step 23 (checkpoints every 5 steps) snapshots step 23 at once: a spike at step 24 has a ring
    checkpoint to replay from (before, the ring stayed empty until step 25 and such a spike was not written)."""
    from types import SimpleNamespace

    from minillm.training.callbacks import SpikeCapture

    capture = SpikeCapture(str(tmp_path), steps=16, checkpoint_every_n_steps=5)
    capture._on = True
    snapped = []
    monkeypatch.setattr(capture, "_check", lambda trainer: None)
    monkeypatch.setattr(capture, "_snapshot", lambda trainer, step: (snapped.append(step),
                                                                     capture.ring.append((step, {}))))
    for step in (23, 24, 25, 26):
        capture.on_train_batch_start(SimpleNamespace(global_step=step), None, None, 0)
    assert snapped == [23, 25]


def test_a_move_that_faded_before_the_spike_is_not_its_onset():
    """Layer 0's gradient norm triples for two steps (12, 13) and comes back; layer 2's update ratio jumps at step
    18 and stays; the spike is at 20. The early excursion is not part of the spike: the update ratio ranks first
    (before, any crossing counted, so the gradient norm's noise, six steps early, came first)."""
    wobble = [(s, v * (3.5 if s in (12, 13) else 1.0)) for s, v in noisy(21, 0.5, 11)]
    series = {"layer/0/grad_norm": wobble, "layer/2/update_ratio": noisy(21, 1e-3, 12, jump_at=18, factor=40)}
    entries = lead_lag(series, spike_step=20)
    assert [(e["signal"], e["onset_step"]) for e in entries] == [("layer/2/update_ratio", 18),
                                                                ("layer/0/grad_norm", None)]
    kick = {"layer/1/update_ratio": [(s, 1e-3 * (100 if s == 19 else 1)) for s in range(21)]}  # one step, the one
    assert lead_lag(kick, spike_step=20)[0]["onset_step"] == 19  # before the spike: a move into it
