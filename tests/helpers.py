"""Helpers shared by the tests (each defined once): generated text, composed real configs, CSV rows, tiny
models and random tensors, the norms of the registry the registry-driven tests run over, and the callbacks
and short runs the tests inject (a signal at a step, a poisoned gradient, a crash, an in-memory logger)."""

from __future__ import annotations

import csv
import errno
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers.logger import Logger
from omegaconf import DictConfig, open_dict
from torch import nn

from minillm.model import ModelConfig
from minillm.norms import NORMS

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

WORDS = ("the king and queen of love shall come to night with fair sweet words my lord "
         "thou art what is this now good sir I will not be so").split()


def call_main(main: Callable[[list[str]], object], args: list, capsys) -> tuple[int, str, str]:
    """A console script's main() in this process: (exit code, stdout, stderr)."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def write_corpus(path: Path, n_chars: int = 30_000, seed: int = 0) -> Path:
    """Generate a small English-like text file (no network, nothing committed)."""
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))).capitalize() + "."
        lines.append(line)
        size += len(line) + 1
    path.write_text("\n".join(lines) + "\n")
    return path


TINY = [
    "model=tiny",
    "data=files",
    "data.batch_size=8",
    "data.val_windows=8",
    "trainer=cpu",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.log_every_n_steps=1",
    "scheduler.warmup_steps=1",
    "++callbacks.text_sample.max_new_tokens=8",
    "logger=csv",
]


def compose_cfg(tmp_path: Path, corpus: Path, *overrides: str) -> DictConfig:
    """Compose configs/train.yaml as train.py would, with outputs under tmp_path."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[*TINY, f"data.files=[{corpus}]", *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
        cfg.paths.log_dir = str(tmp_path / "logs")
        cfg.paths.cache_dir = str(tmp_path / "cache")
        del cfg["hydra"]  # as in a real run, where @hydra.main hands over the job config without it
    return cfg


def read_rows(run_dir: Path) -> list[dict]:
    """The rows of a run's csv/metrics.csv (Lightning's CSVLogger: sparse, one row per log call)."""
    with open(Path(run_dir) / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def logged(rows: list[dict], key: str) -> dict[int, float]:
    """step -> value of one metric."""
    return {int(r["step"]): float(r[key]) for r in rows if r.get(key)}


# --- tiny models and tensors ---------------------------------------------------------------------------------

V = 37  # vocabulary of the tiny models
# every registered norm that runs in plain PyTorch (a norm with a kernel, fused_rmsnorm, runs under the Triton
# interpreter in tests/test_kernels.py); the registry-driven tests run over these without a hand-kept list
EAGER_NORMS = [name for name, cls in NORMS.items() if not getattr(cls, "kernel", None)]


def randn(*shape, scale: float = 1.0, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Seeded normal values with a non-zero mean (0.3), so centring and scaling both matter."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + 0.3).to(dtype)


def randomize(norm: nn.Module, seed: int = 1) -> nn.Module:
    """Non-trivial gains (about 1) and biases (about 0), so parity tests exercise them; scalars such as DyT's
    alpha and ScaleNorm's g keep their initial values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in norm.named_parameters():
            if name in ("weight", "bias") and p.ndim:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if name == "weight" else 0.0))
    return norm


def norm_kwargs(name: str, max_seq_len: int = 8) -> dict:
    """What build_norm needs besides dim: max_seq_len for the norms with per-position statistics."""
    return {"max_seq_len": max_seq_len} if getattr(NORMS[name], "uses_positions", False) else {}


def tiny(**kw) -> ModelConfig:
    """A 2-layer model; mix_fraction 0.5 makes placement="mix" a real mix (layer 0 Post-LN, layer 1 Pre-LN)."""
    base = dict(vocab_size=V, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16, mix_fraction=0.5)
    return ModelConfig(**{**base, **kw})


def tokens(B: int = 3, T: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# --- W&B offline runs, read back ----------------------------------------------------------------------------


def wandb_records(path: Path) -> list:
    """The protobuf Records of a .wandb file. Its format is LevelDB's log: a 7-byte header (":W&B", magic,
    version), then 32 KiB blocks of chunks, each with a 7-byte header (crc32, length, type: 1 full, 2 first,
    3 middle, 4 last). wandb no longer ships a reader for it, so the tests walk it here."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block, pos = Path(path).read_bytes(), 32768, 7
    assert data[:4] == b":W&B", path
    payloads, pending = [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            payloads.append(chunk)
        elif kind in (2, 3):
            pending = chunk if kind == 2 else pending + chunk
        elif kind == 4:
            payloads.append(pending + chunk)
        else:  # zero padding at the end of a block
            pos += block - pos % block
    records = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def read_wandb_run(folder: Path) -> dict:
    """id, group, tags, history rows, summary and the summary-kind of each defined metric of an offline run
    folder."""
    import json as _json
    import time

    (path,) = Path(folder).glob("*.wandb")
    deadline = time.monotonic() + 30  # W&B's service writes the file; its last records (summary, exit) come last
    while True:
        try:
            records = wandb_records(path)
        except Exception:  # a chunk still being written
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    run_id, group, tags, history, summary, defined = None, None, [], [], {}, {}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id, group, tags = record.run.run_id, record.run.run_group, list(record.run.tags)
        elif kind == "history":
            history.append({"/".join([i.key, *i.nested_key] if i.key else list(i.nested_key)):
                            _json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                key = item.key or "/".join(item.nested_key)
                summary[key] = _json.loads(item.value_json)
        elif kind == "metric" and record.metric.name:
            defined[record.metric.name] = record.metric.summary
    return {"id": run_id, "group": group, "tags": tags, "history": history, "summary": summary, "defined": defined,
            "folder": Path(folder)}


# --- data layer (tests/test_data*.py) -------------------------------------------------------------------------


def mixed_text(n: int = 6000, seed: int = 0) -> str:
    """Deterministic pseudo-text of n words with a few non-ASCII characters (é, ï, —)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    words = ["the", "king", "queen", "café", "naïve", "to", "be", "or", "not", "—", "\n"]
    return " ".join(rng.choice(words, size=n).tolist())


def make_dm(corpus: Path, tmp_path: Path, **kw):
    """A prepared and set-up TextDataModule over local files, its token store under tmp_path / "cache"."""
    from minillm.training.data import TextDataModule

    args = dict(source="files", files=[str(corpus)], seq_len=16, batch_size=4, cache_dir=str(tmp_path / "cache"))
    dm = TextDataModule(**{**args, **kw})
    dm.prepare_data()
    dm.setup("fit")
    return dm


def batches(loader, n: int | None = None) -> list:
    import itertools

    return list(itertools.islice(loader, n))


def legacy_char_stream(docs: list[str], val_fraction: float = 0.1):
    """The char data of minillm before the token store, by its formulas: documents stripped and joined with blank
    lines into one string, CharTokenizer.from_text of it, encoded whole, split at int(N * (1 - val_fraction)).
    Returns (tokenizer, train ids, val ids)."""
    from minillm.training.data import CharTokenizer, token_dtype

    text = "\n\n".join(t.strip() for t in docs if t and t.strip())
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text).astype(token_dtype(tok.vocab_size))
    n_train = int(len(ids) * (1.0 - val_fraction))
    return tok, ids[:n_train], ids[n_train:]


# --- callbacks and runs the tests inject (Hydra targets: helpers.<Class>) ---------------------------------------

FAST = ["callbacks=preemption", "test=false", "trainer.max_steps=6", "trainer.val_check_interval=3",
        "scheduler.total_steps=6", "+trainer.enable_progress_bar=false",
        "+trainer.enable_checkpointing=false"]


RESUMABLE = ["callbacks=default", "++trainer.enable_checkpointing=true", "++trainer.enable_progress_bar=true",
             "logger=csv"]  # callbacks and logs as a user's run has them


MARKER = "reliability-test: waiting for a signal at step"


class SignalAt(L.Callback):
    """Sends `signum` to this process after a training step, during a validation, or (``during_validation="end"``)
    as the validation ends, after PreemptionCheckpoint's own hook (in-process preemption); under DDP only in the
    process of rank `rank` (the others must follow it)."""

    def __init__(self, signum: int, step: int, during_validation: bool | str = False, rank: int = 0):
        self.signum, self.step, self.during_validation, self.rank = signum, step, during_validation, rank

    def on_train_batch_end(self, trainer, *args) -> None:
        if not self.during_validation and trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), self.signum)

    def on_validation_end(self, trainer, pl_module) -> None:
        if (self.during_validation == "end" and trainer.global_step == self.step and not trainer.sanity_checking
                and trainer.global_rank == self.rank):
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        if (self.during_validation is True and trainer.global_step == self.step and batch_idx == 0
                and trainer.global_rank == self.rank):
            os.kill(os.getpid(), self.signum)


class SignalIn(L.Callback):
    """Sends `signum` to this process in a phase of the run outside the training steps: ``setup`` (when the callbacks
    are built, while the run is set up), ``test`` (after the held-out test's first batch) or ``train_end`` (as
    training ends, after the final sample). ``SignalAt`` covers the steps and validations, ``SignalingLogger`` the
    final writes."""

    def __init__(self, signum: int, phase: str):
        self.signum, self.phase = signum, phase
        if phase == "setup":
            os.kill(os.getpid(), signum)

    def on_test_batch_end(self, trainer, *args) -> None:
        if self.phase == "test" and trainer.is_global_zero:
            os.kill(os.getpid(), self.signum)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.phase == "train_end" and trainer.is_global_zero:
            os.kill(os.getpid(), self.signum)


class SignalingLogger(Logger):
    """A logger that sends `signum` to this process when the run finishes its loggers: the final writes."""

    def __init__(self, signum: int):
        super().__init__()
        self.signum = signum

    @property
    def name(self) -> str:
        return "signaling"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None) -> None:
        pass

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def finish(self) -> None:
        os.kill(os.getpid(), self.signum)


class WaitForSignalAt(L.Callback):
    """After training step `step`, prints MARKER and waits (at most 60 s) for a signal sent from outside."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            print(f"{MARKER} {self.step}", flush=True)
            deadline = time.time() + 60
            while not trainer.received_sigterm and time.time() < deadline:
                time.sleep(0.02)


class LossRecorder(L.Callback):
    def __init__(self):
        self.losses: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses[trainer.global_step] = float(outputs["loss"])


def run_fast(tmp_path: Path, corpus: Path, *overrides: str) -> Path:
    """A 6-step run with validations after steps 3 and 6 and only the preemption callback (FAST)."""
    cfg = compose_cfg(tmp_path, corpus, *FAST, *overrides)
    import minillm.training.train as train_script

    train_script.train(cfg)
    return Path(cfg.paths.output_dir)


class MemoryLogger(Logger):
    """Keeps log_metrics calls in memory."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def series(self, key: str) -> dict[int, float]:
        return {step: m[key] for step, m in self.rows if key in m}


class PoisonGrad(L.Callback):
    """Sets a gradient to ``value`` after the backward of step ``at_step`` (a forced NaN / overflow)."""

    def __init__(self, at_step: int, value: float = float("nan")):
        self.at_step, self.value = at_step, value

    def on_after_backward(self, trainer, pl_module) -> None:
        if trainer.global_step == self.at_step:
            pl_module.model.layers[0].ffn.w1.weight.grad[0, 0] = self.value


class CrashAt(L.Callback):
    """Raises at the start of step ``at_step``: a crash (OOM, a bug), not a divergence."""

    def __init__(self, at_step: int):
        self.at_step = at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.at_step:
            raise RuntimeError("simulated crash")


class FullDiskAt(L.Callback):
    """Raises a full disk's write error (ENOSPC, no file named) at the start of step ``at_step``."""

    def __init__(self, at_step: int):
        self.at_step = at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.at_step:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class LrJump(L.Callback):
    """A planted spike: at step ``step`` the update of model.layers[layer] is ``factor`` times what the optimizer
    computed (its lr times factor for that one step: W = W_before + factor * (W_after - W_before)), applied inside
    the optimizer step, before any callback sees the step's end."""

    def __init__(self, step: int, layer: int, factor: float = 300.0):
        self.step, self.layer, self.factor = step, layer, factor
        self._before: list[torch.Tensor] | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        params = list(pl_module.model.layers[self.layer].parameters())

        def pre(optimizer, args, kwargs) -> None:
            if trainer.global_step == self.step:
                self._before = [p.detach().clone() for p in params]

        def post(optimizer, args, kwargs) -> None:
            if self._before is not None:
                with torch.no_grad():
                    for p, b in zip(params, self._before, strict=True):
                        p.copy_(b + self.factor * (p - b))
                self._before = None

        for optimizer in trainer.optimizers:
            optimizer.register_step_pre_hook(pre)
            optimizer.register_step_post_hook(post)


class AttentionBlowUp(L.Callback):
    """A planted attention-logit blow-up: before step ``step`` the query and key projections of
    model.layers[layer] are scaled by ``factor`` (the attention logits by factor^2), as a runaway growth of
    those weights would leave them."""

    def __init__(self, step: int, layer: int, factor: float = 1e19):
        self.step, self.layer, self.factor = step, layer, factor

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and batch_idx % max(trainer.accumulate_grad_batches, 1) == 0:
            attn = pl_module.model.layers[self.layer].attn
            with torch.no_grad():
                attn.wq.weight.mul_(self.factor)
                attn.wk.weight.mul_(self.factor)


def check_derived_files(run_dir: Path) -> dict:
    """summary.json, csv/metrics.csv and the W&B run summary (its last segment's) agree on the run's final numbers:
    the final and best val loss at their steps, the test loss, the step count. Returns the summary."""
    import json as _json

    run_dir = Path(run_dir)
    summary = _json.loads((run_dir / "summary.json").read_text())
    rows = read_rows(run_dir)
    val, test, train = logged(rows, "val/loss"), logged(rows, "test/loss"), logged(rows, "train/loss")
    assert max(train) == summary["steps"] - 1, (sorted(train)[-3:], summary["steps"])
    if val:
        assert (max(val), val[max(val)]) == (summary["steps"] - 1, summary["final_val_loss"]), (val, summary)
        assert (summary["best_val_step"], summary["best_val_loss"]) == min(val.items(), key=lambda kv: kv[1])
    else:
        assert summary["final_val_loss"] is None and summary["best_val_loss"] is None
    assert list(test.values()) == ([summary["test_loss"]] if summary.get("test_weights") else []), (test, summary)
    segments = sorted((run_dir / "wandb").glob("offline-run-*"))
    if segments:
        shown = read_wandb_run(segments[-1])["summary"]
        for key in ("status", "steps", "final_val_loss", "best_val_loss", "test_loss", "tokens"):
            assert shown.get(key) == summary[key], (key, shown.get(key), summary[key])
    return summary
