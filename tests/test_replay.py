"""Stability forensics as a user runs it: `python train.py` (W&B on, as by default), then `python -m
minillm.tools.replay`.
A replay without override is bit-identical to the original steps; a planted spike (one step's update of one layer
made 300 times larger) leaves a spike file, its ring-buffer checkpoint and a lead-lag that names the planted layer
first; a counterfactual replay on the same batches changes the norm."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import ROOT, read_wandb_run
from processes import cli, ok

from minillm.analysis.runs import find_runs, read_curves
from minillm.training.checkpointing import read_checkpoint_header

TRAIN = str(ROOT / "train.py")
CORPUS_CHARS = 20_000
SMALL = ["model=tiny", "data=files", "data.batch_size=4", "data.val_windows=4", "trainer.log_every_n_steps=1",
         "callbacks.text_sample.max_new_tokens=8", "test=false", "name=forensics"]
NEW_LAYER = ("attn_entropy_min", "attn_entropy_mean", "weight_norm")  # the signals this work added, per layer
NEW_SITE = ("outlier_ratio", "kurtosis")  # and per norm site


def train(tmp_path: Path, cache: Path, corpus: Path, run_id: str, *overrides: str) -> Path:
    ok(cli([TRAIN, *SMALL, f"data.files=[{corpus}]", f"run_id={run_id}", *overrides], tmp_path, cache))
    return tmp_path / "logs" / "forensics" / "runs" / run_id


def losses(folder: Path) -> dict[int, float]:
    return dict(read_curves(folder / "csv" / "metrics.csv")["train/loss"])


def replay(tmp_path: Path, cache: Path, *args: str) -> str:
    return ok(cli(["-m", "minillm.tools.replay", *args], tmp_path, cache))


def test_a_replay_without_override_is_bit_identical_and_a_counterfactual_changes_the_norm(tmp_path, shared_cache,
                                                                                            corpus):
    """Steps 4..11 of a 12-step run replayed from its step-4 checkpoint: the same losses bit for bit, the probes on
    every step (the new signals in the CSV and the W&B run, in the run's group, tagged replay); the same stretch with
    norm=layernorm on the same batches: LayerNorm's biases start at their init (recorded), the losses differ; and
    --plot puts the curves in one plot."""
    run = train(tmp_path, shared_cache, corpus, "r", "trainer.max_steps=12", "trainer.val_check_interval=6",
                "callbacks.step_checkpoints.every_n_train_steps=4")
    out = replay(tmp_path, shared_cache, str(run / "checkpoints"), "--steps", "4:12")
    assert "bit-identical to the original's (8 steps compared)" in out, out[-2000:]
    (folder,) = (run / "replays").iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    record = summary["replay"]
    assert record["identical_to_original"] is True and record["compared_steps"] == 8
    assert record["checkpoint"].endswith("step-4.ckpt") and record["from_step"] == 4 and record["overrides"] == []
    assert record["carried_over"]["initialized"] == [] and summary["failed"] is False
    original, replayed = losses(run), losses(folder)
    assert sorted(replayed) == list(range(4, 12))
    assert all(replayed[s] == original[s] for s in replayed)  # exactly, not approximately
    curves = read_curves(folder / "csv" / "metrics.csv")
    for i in range(2):
        for name in NEW_LAYER:
            assert [s for s, _ in curves[f"layer/{i}/{name}"]] == list(range(4, 12)), name  # every step
        for name in NEW_SITE:
            assert len(curves[f"norm/layers.{i}.attn_norm/{name}"]) == 8
    (wandb_run,) = (folder / "wandb").glob("offline-run-*")
    logged = read_wandb_run(wandb_run)
    assert logged["group"] == "forensics" and "replay" in logged["tags"]
    keys = {k for row in logged["history"] for k in row}  # a replay logs every probe's curve (per_layer_scalars)
    assert {"train/loss", "layer/1/attn_entropy_min", "layer/1/weight_norm", "norm/layers.1.ffn_norm/kurtosis"} <= keys
    assert [r.dir for r in find_runs(run.parent)] == [run]  # a replay is not a run of the sweep

    out = replay(tmp_path, shared_cache, str(run / "checkpoints" / "step-4.ckpt"), "--steps", "4:12", "norm=layernorm",
                 "--out", str(tmp_path / "ln"))
    record = json.loads((tmp_path / "ln" / "summary.json").read_text())["replay"]
    assert record["overrides"] == ["norm=layernorm"] and record["identical_to_original"] is False
    assert sorted(record["carried_over"]["initialized"]) == sorted(
        [f"layers.{i}.{s}.bias" for i in range(2) for s in ("attn_norm", "ffn_norm")] + ["norm.bias"])
    assert json.loads((tmp_path / "ln" / "summary.json").read_text())["norm"] == "layernorm"
    assert sorted(losses(tmp_path / "ln")) == list(range(4, 12)) and losses(tmp_path / "ln")[4] != original[4]
    ok(cli(["-m", "minillm.tools.replay", "--plot", str(run / "replays"), str(tmp_path / "ln"), "--out",
            str(tmp_path / "both.png")], tmp_path, shared_cache))
    assert (tmp_path / "both.png").stat().st_size > 10_000


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_a_replay_is_bit_identical_from_every_kind_of_checkpoint(tmp_path, shared_cache, corpus):
    """The checkpoints a user has: last.ckpt and best.ckpt written at the end of a fit (a 6-step run, later continued
    to 12 steps), a step-N checkpoint and a preempted.ckpt. Replayed, each gives the original's losses step by step
    (from a checkpoint written at the end of a fit, each loss was logged one step early: not identical)."""
    common = ["trainer.val_check_interval=6", "scheduler.total_steps=12",
              "callbacks.step_checkpoints.every_n_train_steps=3"]
    run = train(tmp_path, shared_cache, corpus, "r", *common, "trainer.max_steps=6")
    for name in ("last", "best"):  # what the 6-step run left at its end
        shutil.copy(run / "checkpoints" / f"{name}.ckpt", run / "checkpoints" / f"end6-{name}.ckpt")
    stop = ["+callbacks.signal._target_=helpers.SignalAt", "+callbacks.signal.signum=15", "+callbacks.signal.step=9"]
    out = cli([TRAIN, *SMALL, f"data.files=[{corpus}]", "run_id=r", *common, "trainer.max_steps=12", "ckpt_path=auto",
               *stop], tmp_path, shared_cache)
    assert out.returncode == 143, out.output[-3000:]
    train(tmp_path, shared_cache, corpus, "r", *common, "trainer.max_steps=12", "ckpt_path=auto")
    original = losses(run)
    assert sorted(original) == list(range(12))
    for ckpt, steps in (("end6-last", "6:12"), ("end6-best", "6:12"), ("step-6", "6:12"), ("preempted", "9:12")):
        out = replay(tmp_path, shared_cache, str(run / "checkpoints" / f"{ckpt}.ckpt"), "--steps", steps, "--out",
                     str(run / "replays" / ckpt))
        first = int(steps.split(":")[0])
        record = json.loads((run / "replays" / ckpt / "summary.json").read_text())["replay"]
        assert record["identical_to_original"] is True and record["compared_steps"] == 12 - first, (ckpt, out[-2000:])
        assert losses(run / "replays" / ckpt) == {s: original[s] for s in range(first, 12)}, ckpt


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_a_planted_spike_leaves_its_file_checkpoint_and_a_lead_lag_with_the_planted_layer_first(tmp_path,
                                                                                                  shared_cache, corpus):
    """At step 40 the update of layer 1 is made 300 times larger (helpers.LrJump); the loss spikes at step 41.
    callbacks.spike.steps=16 (ring on disk) writes spikes/step_41.json with the batch, the 16 steps before it and a
    lead-lag ranking whose first signal is layer 1's update ratio at step 40; step_41.ckpt is the ring's oldest
    checkpoint (at most 16 + 5 steps back), and replaying from the spike file gives the original losses bit for bit."""
    run = train(tmp_path, shared_cache, corpus, "spiky", "trainer.max_steps=46", "trainer.val_check_interval=46",
                "scheduler.warmup_steps=5", "optimizer.lr=1e-2", "callbacks.stability.spike_window=12",
                "callbacks.spike.steps=16", "callbacks.spike.store=disk", "+callbacks.jump._target_=helpers.LrJump",
                "+callbacks.jump.step=40", "+callbacks.jump.layer=1", "+callbacks.jump.factor=300")
    spikes = run / "spikes"
    assert sorted(p.name for p in spikes.iterdir()) == [f"step_41.{e}" for e in ("ckpt", "json", "md", "png")]
    record = json.loads((spikes / "step_41.json").read_text())
    assert record["kind"] == "loss_spike" and record["step"] == 41 and record["loss_z"] > 4
    assert record["loss"] == losses(run)[41]
    assert record["batch"]["samples"] == [41 * 4, 42 * 4] and len(record["batch"]["window_starts"]) == 4
    assert record["steps"] == list(range(25, 42))  # the 16 steps before the spike, and its own
    first = record["lead_lag"][0]
    assert (first["signal"], first["layer"], first["onset_step"], first["lead"]) == ("layer/1/update_ratio", 1, 40, 1)
    assert all(e["layer"] != 0 for e in record["lead_lag"] if e["onset_step"] is not None and e["onset_step"] < 41)
    history = {row["step"]: row for row in record["history"]}
    assert {"layer/0/attn_entropy_min", "norm/layers.1.attn_norm/kurtosis", "stab/grad_norm"} <= set(history[30])
    start = record["checkpoint"]["step"]
    assert 41 - 16 - 5 <= start <= 41 - 16 and read_checkpoint_header(spikes / "step_41.ckpt")["global_step"] == start
    assert "layer/1/update_ratio" in (spikes / "step_41.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["spike_count"] >= 1 and summary["spike_files"] == [str(spikes / "step_41.json")]
    run = run.rename(run.with_name("moved"))  # a run folder moved (or copied elsewhere) still replays
    out = replay(tmp_path, shared_cache, str(run / "spikes" / "step_41.json"), "--steps", f"{start}:42")
    assert "bit-identical" in out, out[-2000:]
    (folder,) = (run / "replays").iterdir()
    replayed = losses(folder)
    assert sorted(replayed) == list(range(start, 42)) and all(replayed[s] == losses(run)[s] for s in replayed)
    leadlag = json.loads((folder / "leadlag.json").read_text())  # the replay's own lead-lag, probes on every step
    assert leadlag["step"] == 41 and leadlag["lead_lag"][0]["signal"] == "layer/1/update_ratio"


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_qk_norm_replayed_on_the_batches_of_an_attention_logit_blow_up_survives_where_the_run_diverged(
        tmp_path, shared_cache, corpus):
    """Before step 25 layer 1's query and key weights are scaled by 1e19 (helpers.AttentionBlowUp, planted): its
    attention logits overflow fp32, the loss is NaN and the run diverges at step 25, leaving spikes/step_25.json.
    Replayed from there as it was, it diverges at the same step; replayed with model.qk_norm=rmsnorm (the new QK-norm
    gains at their init, recorded) on the same batches, with the same blow-up, it trains through step 39."""
    run = train(tmp_path, shared_cache, corpus, "blowup", "trainer.max_steps=40", "trainer.val_check_interval=40",
                "scheduler.warmup_steps=5", "optimizer.lr=1e-2", "callbacks.spike.steps=10",
                "+callbacks.blow._target_=helpers.AttentionBlowUp", "+callbacks.blow.step=25",
                "+callbacks.blow.layer=1")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["diverged"] is True and summary["diverged_step"] == 25
    spike = json.loads((run / "spikes" / "step_25.json").read_text())
    assert spike["kind"] == "divergence" and spike["checkpoint"]["step"] <= 15
    moved = [e for e in spike["lead_lag"] if e["onset_step"] is not None]  # layer 1 only: its logits, its weights
    assert moved and {e["layer"] for e in moved} == {1} and moved[0]["signal"] == "layer/1/attn_logit_max"
    as_it_was = tmp_path / "as_it_was"
    replay(tmp_path, shared_cache, str(run / "spikes" / "step_25.json"), "--steps", "20:40", "--out", str(as_it_was))
    again = json.loads((as_it_was / "summary.json").read_text())
    assert again["diverged"] is True and again["diverged_step"] == 25
    assert all(losses(as_it_was)[s] == losses(run)[s] for s in range(20, 25))
    qk = tmp_path / "qk"
    out = replay(tmp_path, shared_cache, str(run / "spikes" / "step_25.json"), "--steps", "20:40",
                 "model.qk_norm=rmsnorm", "--out", str(qk))
    assert "no divergence" in out, out[-2000:]
    survived = json.loads((qk / "summary.json").read_text())
    assert survived["diverged"] is False and survived["steps"] == 40 and survived["qk_norm"] == "rmsnorm"
    assert sorted(survived["replay"]["carried_over"]["initialized"]) == [
        f"layers.{i}.attn.{n}_norm.weight" for i in range(2) for n in ("k", "q")]
    replayed = losses(qk)  # steps 15 (the checkpoint's) to 39
    assert sorted(replayed) == list(range(15, 40)) and max(replayed.values()) < 3.0  # finite, and still learning
    assert survived["max_attn_logit"] < 100  # the normalized queries and keys keep the logits small


def test_a_muon_replay_that_changes_the_norm_gives_each_parameter_its_own_state():
    """A Muon run (hidden matrices in a group of their own) with decayed gains, replayed with LayerNorm: every
    parameter the two models share keeps its own optimizer state; LayerNorm's biases start without."""
    import dataclasses
    import functools

    import torch
    from helpers import tiny

    from minillm.model import Transformer
    from minillm.training.lit_module import LitLM
    from minillm.training.optim import MuonWithAdamW, param_groups
    from minillm.training.run.replay_start import _remap_optimizer

    torch.manual_seed(0)
    old_cfg = tiny(norm="rmsnorm")
    old = Transformer(old_cfg)
    opt = MuonWithAdamW(param_groups(old, decay_norms=True, split_hidden=True), lr=0.02, adamw_lr=1e-3)
    for p in old.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    state, names = opt.state_dict(), {id(p): n for n, p in old.named_parameters()}
    by_name = {names[id(p)]: state["state"][i] for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    module = LitLM(dataclasses.replace(old_cfg, norm="layernorm"), decay_norms=True,
                   optimizer=functools.partial(MuonWithAdamW, lr=0.02, adamw_lr=1e-3))
    remapped = _remap_optimizer(state, {"decay_norms": True, "decay_embeddings": False},
                                dataclasses.asdict(old_cfg), module)
    new_names = {id(p): n for n, p in module.model.named_parameters()}
    new_order = [new_names[id(p)] for g in module.param_groups() for p in g["params"]]
    for i, name in enumerate(new_order):
        if name in by_name:
            assert i in remapped["state"], name
            for key, value in by_name[name].items():
                assert torch.equal(remapped["state"][i][key], value), (name, key)
        else:
            assert i not in remapped["state"] and name.endswith(".bias"), name


def test_the_lead_lag_reads_the_first_spike_among_the_replayed_steps():
    """A spike in the steps that only lead up to A is not the replay's spike; one at A is."""
    from omegaconf import OmegaConf

    from minillm.tools.replay import _first_spike

    cfg = OmegaConf.create({"callbacks": {"stability": {"spike_k": 4.0}}})
    curves = {"stab/loss_spike_score": [(17, 9.0), (20, 1.0), (25, 9.0), (41, 9.0)]}
    assert _first_spike(curves, cfg, (20, 40)) == 25
    assert _first_spike({"stab/loss_spike_score": [(20, 9.0)]}, cfg, (20, 40)) == 20
    assert _first_spike(curves, cfg, (26, 40)) is None


@pytest.mark.parametrize("override", ["++optimizer.lr=1e-3", "+optimizer.lr=1e-3", "~optimizer.lr"])
def test_an_override_that_adds_or_deletes_is_refused(override):
    from minillm.tools.replay import ReplayError, parse_overrides

    with pytest.raises(ReplayError, match="cannot be replayed"):
        parse_overrides([override])


@pytest.mark.slow  # tokenizes Shakespeare, 60 steps with every probe on every step
def test_the_forensics_pages_planted_spike_gives_the_answer_it_quotes(tmp_path, shared_cache):
    """docs/forensics.md's first command, with the overrides it gives for its figures (Shakespeare, the tiny model, the
    planted jump of layer 1's update at step 40): the log line and the report's first row are the page's. (Layer 0's
    gradient norm wanders past z = 5 at step 33 and back; counted as an onset, it came first.)"""
    import re

    page = (ROOT / "docs" / "forensics.md").read_text()
    command = re.search(r"^python train\.py (name=demo [^#\n]*)", page, re.M).group(1).split()
    figures = re.search(r"on the tiny model\s*\(`([^`]*)`\)", page).group(1).split()
    planted = re.search(r"\(`(\+callbacks\.jump\.[^`]*)`", page).group(1).split()
    out = ok(cli([TRAIN, *command, *figures, *planted], tmp_path, shared_cache))
    quoted = re.search(r"first to move: (\S+: at step \d+, \d+ steps? before the spike)", page).group(1)
    assert f"first to move: {quoted}" in out, out[-3000:]
    row = re.search(r"^\| 1 \| (`\S+`) \| (\S+) \| (\d+) \| (\d+) \|", page, re.M).groups()
    report = (tmp_path / "logs" / "demo" / "runs" / "spiky" / "spikes" / "step_41.md").read_text()
    assert re.search(r"^\| 1 \| " + r" \| ".join(map(re.escape, row)) + r" \|", report, re.M), report
