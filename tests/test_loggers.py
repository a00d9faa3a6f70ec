"""minillm/training/loggers.py: the CSV log that survives several writers (resumes, DDP's fork launcher), and the W&B
run as it is written to disk (its summary, depth tables, samples, resume)."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import time
import warnings
from pathlib import Path

import pytest
import wandb
from helpers import (
    FAST,
    ROOT,
    compose_cfg,
    logged,
    read_rows,
    read_wandb_run,
)

import minillm.training.train as train_script
from minillm.training.loggers import AppendingCSVLogger, SafeWandbLogger


def rows(folder) -> tuple[list[str], list[dict]]:
    with open(folder / "csv" / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_a_second_writer_appends_and_widens_the_header_instead_of_failing_or_erasing(tmp_path):
    """As a resumed run, or the test pass of a DDP run whose fit logged in other processes: a new logger on the
    same folder keeps what is there (Lightning's deletes it, or fails with 'dict contains fields not in
    fieldnames' when another writer added columns)."""
    first = AppendingCSVLogger(tmp_path, name="csv", version="")
    first.log_metrics({"train/loss": 2.0}, step=0)
    first.log_metrics({"train/loss": 1.5, "stab/grad_norm": 3.0}, step=1)
    first.save()
    second = AppendingCSVLogger(tmp_path, name="csv", version="")  # knows nothing of the first one's columns
    second.log_metrics({"test/loss": 1.4}, step=2)
    second.save()
    first.log_metrics({"val/loss": 1.6}, step=1)  # the first writer again, after the second widened the file
    first.save()
    header, got = rows(tmp_path)
    assert set(header) == {"step", "train/loss", "stab/grad_norm", "test/loss", "val/loss"}
    assert [(r["step"], r["train/loss"], r["test/loss"], r["val/loss"]) for r in got] == [
        ("0", "2.0", "", ""), ("1", "1.5", "", ""), ("2", "", "1.4", ""), ("1", "", "", "1.6")]


def test_resume_at_drops_the_rows_a_resumed_run_logs_again(tmp_path):
    logger = AppendingCSVLogger(tmp_path, name="csv", version="")
    for step in range(6):
        logger.log_metrics({"train/loss": 5.0 - step}, step=step)
    logger.save()
    AppendingCSVLogger(tmp_path, name="csv", version="").resume_at(4)  # the checkpoint was saved after 4 steps
    assert [r["step"] for r in rows(tmp_path)[1]] == ["0", "1", "2", "3"]


# --- W&B: read back from the offline run files (no network, no mocks) ------------------------------------------


def wandb_run(run_dir) -> dict:
    """The run folder's W&B run (its latest segment, for a resumed run)."""
    return read_wandb_run(sorted((Path(run_dir) / "wandb").glob("offline-run-*"))[-1])


def tables(run: dict, key: str) -> dict[int, dict]:
    """trainer/global_step -> the JSON of each table logged under key."""
    out = {}
    for row in run["history"]:
        if f"{key}/path" in row:
            out[row["trainer/global_step"]] = json.loads((run["folder"] / "files" / row[f"{key}/path"]).read_text())
    return out


def check_summary_is_copied(run_dir) -> dict:
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    run = wandb_run(run_dir)
    copied = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool))}
    assert copied and {k: run["summary"].get(k) for k in copied} == pytest.approx(copied), run["summary"]
    return run


def test_wandb_summary_depth_tables_and_samples_of_a_run(tmp_path, corpus):
    """The W&B run summary holds summary.json (the result), W&B keeps the best val/loss and the largest
    stability maxima, layer/* and norm/* come as depth tables (a row per layer) instead of scalar panels, and
    the samples table gets a row per validation."""
    cfg = compose_cfg(tmp_path, corpus, "logger=wandb", "trainer.max_steps=6", "trainer.val_check_interval=3",
                      "logger.wandb.profile_every_n_steps=2", "callbacks.stability.every_n_steps=2", "test=false",
                      "callbacks.histograms.every_n_steps=4")
    train_script.train(cfg)
    run = check_summary_is_copied(cfg.paths.output_dir)
    assert run["defined"]["val/loss"].min and run["defined"]["stab/max_abs_h"].max
    hists = {row["trainer/global_step"]: row for row in run["history"] if any(k.startswith("hist/") for k in row)}
    assert sorted(hists) == [0, 4]  # NormHistograms: the input and gain of every norm site, every 4 steps
    sites = [f"layers.{i}.{n}" for i in (0, 1) for n in ("attn_norm", "ffn_norm")] + ["norm"]
    assert all(hists[4][f"hist/{s}/{what}/_type"] == "histogram" for s in sites for what in ("input", "gain"))
    assert not any(k.startswith(("layer/", "norm/")) for row in run["history"] for k in row)
    layers = tables(run, "depth/layers")
    assert sorted(layers) == [0, 2, 4]  # the measured steps that are profile steps
    for table in layers.values():  # n_layers rows, one per layer in order, with their metrics
        assert [r[table["columns"].index("layer")] for r in table["data"]] == [0, 1]
        assert {"resid_rms", "resid_max", "grad_norm", "update_ratio", "weight_norm"} <= set(table["columns"])
    assert {"attn_logit_max", "attn_entropy_min", "attn_entropy_mean"} <= set(layers[0]["columns"])  # a probe step
    sites = tables(run, "depth/norm_sites")[4]
    assert len(sites["data"]) == 2 * 2 + 1  # attn_norm and ffn_norm per layer, the final norm
    assert {"in_rms", "outlier_ratio", "kurtosis", "gain_mean"} <= set(sites["columns"])
    samples = tables(run, "samples")
    assert sorted(samples) == [2, 5] and len(samples[5]["data"]) == 2  # a row per validation so far
    assert (Path(cfg.paths.output_dir) / "samples.txt").read_text().count("step ") == 2


def test_wandb_summary_of_a_diverged_run(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "logger=wandb", "trainer.max_steps=6", "test=false",
                      "+callbacks.poison._target_=helpers.PoisonGrad", "+callbacks.poison.at_step=2")
    train_script.train(cfg)
    run = check_summary_is_copied(cfg.paths.output_dir)
    assert run["summary"]["diverged"] is True and run["summary"]["failed"] is True


def test_per_layer_scalars_switch(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "logger=wandb", "trainer.max_steps=2", "test=false",
                      "logger.wandb.per_layer_scalars=true")
    train_script.train(cfg)
    assert any(k.startswith("layer/0/") for row in wandb_run(cfg.paths.output_dir)["history"] for k in row)


def test_a_resumed_run_continues_its_wandb_run_without_repeating_steps(tmp_path, corpus):
    signal_at = ["+callbacks.signal._target_=helpers.SignalAt",
                 f"+callbacks.signal.signum={int(signal.SIGTERM)}", "+callbacks.signal.step=3"]
    common = ["logger=wandb", "trainer.max_steps=6", "trainer.val_check_interval=3", "test=false"]
    with pytest.raises(SystemExit):
        train_script.train(compose_cfg(tmp_path, corpus, *common, *signal_at))
    cfg = compose_cfg(tmp_path, corpus, *common, "ckpt_path=auto")
    train_script.train(cfg)
    segments = sorted((Path(cfg.paths.output_dir) / "wandb").glob("offline-run-*"))
    runs = [read_wandb_run(s) for s in segments]
    assert len(runs) == 2 and runs[0]["id"] == runs[1]["id"]  # one W&B run, two offline segments
    steps = [[r["trainer/global_step"] for r in run["history"] if "train/loss" in r] for run in runs]
    assert steps[0] + steps[1] == list(range(6))  # every step once, in order
    check_summary_is_copied(cfg.paths.output_dir)  # the last segment's summary covers the whole run


# --- W&B never stops training --------------------------------------------------------------------------


@pytest.fixture
def unreachable_wandb(tmp_path, monkeypatch):
    """WANDB_MODE=online against a closed loopback port; no real key, config or netrc is read."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the socket is
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "f" * 40)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    wandb.finish()  # a run an earlier test left open (Lightning's finalize does not finish it) ...
    wandb.teardown()  # ... then a fresh setup: wandb reads the environment once per process setup
    yield
    wandb.finish()
    wandb.teardown()


def test_training_runs_to_the_end_when_wandb_server_is_unreachable(unreachable_wandb, tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, *FAST, "logger=wandb", "logger.wandb.init_timeout=2")
    start = time.time()
    with pytest.warns(UserWarning, match="W&B could not start online .*logging offline instead"):
        metrics = train_script.train(cfg)
    assert time.time() - start < 60
    assert "train/loss" in metrics
    runs = list((Path(cfg.paths.output_dir) / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


def test_wandb_without_api_key_falls_back_to_offline(unreachable_wandb, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY")
    logger = SafeWandbLogger(project="minillm", save_dir=str(tmp_path), offline=False, init_timeout=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log_metrics({"train/loss": 1.0}, step=0)
    messages = [str(w.message) for w in caught]
    assert any("could not start online (UsageError: No API key" in m for m in messages), messages
    assert logger._offline
    logger.finalize("success")
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_each_logger_in_one_process_gets_its_own_run(tmp_path, monkeypatch):
    """The jobs of an in-process Hydra sweep (plain WandbLogger logs the second into the first one's run)."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    ids = []
    for job in ("a", "b"):
        logger = SafeWandbLogger(project="minillm", name=job, save_dir=str(tmp_path / job))
        logger.log_metrics({"train/loss": 1.0}, step=0)
        ids.append(logger.experiment.id)
        assert "WANDB_MODE" not in os.environ  # WandbLogger's WANDB_MODE=dryrun does not leak to the next job
    wandb.finish()
    assert ids[0] != ids[1]
    assert list((tmp_path / "b" / "wandb").glob("offline-run-*"))


# --- logger=tensorboard, and the resolved config printed at the start ------------------------------------------


def tensorboard_scalars(folder: Path) -> dict[str, list[float]]:
    """tag -> values of every scalar in the event files under folder (TFRecord framing: length, its CRC, the
    Event protobuf, its CRC), read with tensorboard's protobuf classes."""
    import struct

    from tensorboard.compat.proto.event_pb2 import Event

    scalars: dict[str, list[float]] = {}
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append(value.simple_value)
    return scalars


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_logger_tensorboard_writes_event_files_beside_the_csv_log(tmp_path, shared_cache, corpus):
    from processes import cli, ok

    from minillm.training.run.show import HEADER

    args = [str(ROOT / "train.py"), "model=tiny", "data=files", f"data.files=[{corpus}]", "data.batch_size=4",
            "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.log_every_n_steps=1",
            "callbacks.text_sample.max_new_tokens=8", "logger=tensorboard", "run_id=tb"]
    out = ok(cli(args, tmp_path, shared_cache))
    run = tmp_path / "logs" / "default" / "runs" / "tb"
    scalars = tensorboard_scalars(run / "tensorboard")
    assert "train/loss" in scalars, (sorted(scalars), sorted(p.name for p in (run / "tensorboard").iterdir()))
    assert len(scalars["train/loss"]) == 4 and len(scalars["val/loss"]) == 2 and "test/loss" in scalars
    assert scalars["train/loss"] == pytest.approx(list(logged(read_rows(run), "train/loss").values()))
    assert out.count(HEADER) == 1 and "│   ├── lr: 0.003" in out and "│   └── tensorboard" in out  # the tree, once
    assert HEADER in (run / "train.log").read_text()
    quiet = ok(cli([*args[:-1], "run_id=quiet", "print_config=false", "logger=csv"], tmp_path, shared_cache))
    assert HEADER not in quiet
    import subprocess
    import sys

    viewer = Path(sys.executable).parent / "tensorboard"  # README: tensorboard --logdir logs (the extra installs it)
    shown = subprocess.run([str(viewer), "--inspect", "--logdir", str(tmp_path / "logs")], capture_output=True,
                           text=True, timeout=300)
    assert shown.returncode == 0 and "train/loss" in shown.stdout + shown.stderr, shown.stderr[-2000:]


def test_logger_tensorboard_without_tensorboardx_says_what_to_install(tmp_path, shared_cache, corpus):
    import sys

    from processes import cli

    def hide() -> None:  # as if neither package were installed
        sys.modules["tensorboardX"] = sys.modules["tensorboard"] = None

    args = [str(ROOT / "train.py"), "model=tiny", "data=files", f"data.files=[{corpus}]", "logger=tensorboard"]
    out = cli(args, tmp_path, shared_cache, setup=hide)
    lines = [line for line in out.output.splitlines() if "error: " in line]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.output, out.output[-3000:]
    assert lines[0].endswith("config error: logger=tensorboard needs tensorboard (or tensorboardX): pip install "
                             "'minillm[tensorboard]' (or pip install tensorboard, which also has the viewer); allowed "
                             "without it: logger=wandb, logger=csv, logger=none")
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("summary.json"))
