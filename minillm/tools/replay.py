"""Replay any stretch of a run exactly, or counterfactually: the same batches from a checkpoint, probes on every step.

    minillm-replay CKPT --steps A:B [--out DIR] [overrides...]
    python -m minillm.tools.replay logs/x/runs/r/spikes --steps 20:60 model.qk_norm=rmsnorm
    minillm-replay --plot logs/x/runs/r/replays [--out compare.png]

CKPT is a checkpoint saved at or before step A (a file, a spike file ``step_<N>.json``, or a folder: its newest
checkpoint at or before A, e.g. ``<run>/spikes`` or ``<run>/checkpoints``). The run is composed again from its own
command (``<run>/.hydra/overrides.yaml``) and resumed from CKPT as a new run that trains steps A to B - 1 (and any
between the checkpoint's step and A) on exactly the batches the run saw: training windows are a pure function of
(seed, sample index), and resuming is bit-exact. Without overrides its losses equal the original's bit for bit (on the
same machine). Overrides that change the training and keep the batches: ``norm=``, ``placement=``,
``model.qk_norm=``, ``model.attn_logit_softcap=``, ``model.final_logit_softcap=``, ``trainer.precision=``,
``optimizer.lr=``, ``trainer.gradient_clip_val=``, ``module.z_loss=`` (minillm.training.run.replay_start: the
checkpoint's weights
and optimizer state carried over by name, a parameter the checkpoint lacks at its init, recorded).

It writes a replay folder (``--out``; default ``<run>/replays/<A>-<B>[-<overrides>]``): summary.json (with a
``replay`` record: the run, checkpoint, steps, overrides, what was carried over, whether the losses equal the
original's), csv/metrics.csv (every metric at every step, at the original steps' numbers), replay.png (its train loss
and the original's), a lead-lag report of its first spike (leadlag.md, .png, .json) and a W&B run in the original's
group tagged ``replay``. ``--plot`` plots the train loss of replays (and of their original) in one figure.
Every error is one line, ``minillm-replay: error: ...``, exit 2, with nothing written.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from minillm import forensics, schema
from minillm.analysis.runs import find_runs, read_curves
from minillm.errors import ArgumentParser, ConfigError, disk_error
from minillm.files import json_safe, write_json
from minillm.metrics import DIVERGED, TRAIN_LOSS
from minillm.training.checkpointing import read_checkpoint_header
from minillm.training.run.replay_start import MODEL_OVERRIDES, OVERRIDES, ReplayStart, carry_over
from minillm.training.run.resume import TransformedCheckpointIO
from minillm.training.run.signals import StopSignals, signal_of

PROG = "minillm-replay"
log = logging.getLogger("minillm")
LEFT_OUT = ("model_checkpoint", "step_checkpoints", "text_sample", "histograms", "spike", "preemption", "perf")
NOT_REPLAYED = ("ckpt_path", "decay_from", "run_id", "train", "test", "test_weights", "print_config")


class ReplayError(ConfigError):
    """What cannot be replayed: one line naming the option and what is allowed."""


def parse_steps(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text or "")
    if not match or int(match[1]) >= int(match[2]):
        raise ReplayError(f"--steps {text!r} is invalid; allowed: A:B with 0 <= A < B, the optimizer steps A to B - 1 "
                          "(the step column of metrics.csv), e.g. --steps 20:60")
    return int(match[1]), int(match[2])


def find_checkpoint(path: Path, start: int) -> tuple[Path, dict]:
    """CKPT as given (a file, a spike file, a folder) -> the checkpoint file and its header."""
    if path.suffix == ".json" and path.is_file():
        try:  # the checkpoint's path is relative to the spike file's folder (absolute in older spike files)
            path = path.parent / json.loads(path.read_text())["checkpoint"]["path"]
        except (ValueError, KeyError, TypeError):
            raise ReplayError(f"CKPT {str(path)!r} is not a spike file (no checkpoint in it); allowed: a checkpoint, "
                              "a spikes/step_<N>.json, or a folder of checkpoints") from None
    if path.is_dir():
        found = sorted(p for folder in (path, path / "spikes", path / "checkpoints") if folder.is_dir()
                       for p in folder.glob("*.ckpt"))
        steps = {p: int(read_checkpoint_header(p).get("global_step", 0)) for p in found}
        usable = [p for p in found if steps[p] <= start]
        if not usable:
            have = ", ".join(f"{p.name} (step {s})" for p, s in steps.items()) or "none"
            raise ReplayError(f"CKPT {str(path)!r} holds no checkpoint at or before step {start} (--steps); it holds: "
                              f"{have}")
        path = max(usable, key=lambda p: (steps[p], p.name))
    if not path.exists():
        raise ReplayError(f"CKPT {str(path)!r} does not exist; allowed: a checkpoint, a spikes/step_<N>.json, or a "
                          "folder of checkpoints")
    header = read_checkpoint_header(path)
    if not (header.get("hyper_parameters") or {}).get("run_settings"):
        raise ReplayError(f"CKPT {str(path)!r} records no training settings (an imported or foreign checkpoint); "
                          "allowed: a checkpoint train.py wrote")
    return path, header


def run_folder(ckpt: Path) -> Path:
    folder = ckpt.parent.parent if ckpt.parent.name in ("checkpoints", "spikes") else ckpt.parent
    if not (folder / ".hydra" / "overrides.yaml").is_file():
        raise ReplayError(f"CKPT {str(ckpt)!r} is not in a run folder with the command that trained it "
                          f"({folder}/.hydra/overrides.yaml); allowed: a checkpoint in <run>/checkpoints or "
                          "<run>/spikes")
    return folder


def parse_overrides(overrides: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as err:
        raise ReplayError(f"an override cannot be parsed ({' '.join(str(err).split())[:200]}); write key=value") \
            from None
    for o in parsed:
        if o.key_or_group not in OVERRIDES or o.is_delete() or o.is_add() or o.is_force_add():
            raise ReplayError(f"the override {o.input_line} cannot be replayed (it would change the batches or is not "
                              f"a stability knob); allowed: {', '.join(k + '=' for k in OVERRIDES)}")
    return parsed


def compose(run: Path, ckpt: Path, header: dict, steps: tuple[int, int], out: Path,
            overrides: list[str]) -> DictConfig:
    """The run's config from its own command plus the replay's overrides, set up to replay the steps into out."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from minillm.training.run.hydra import config_dir, one_line

    replaced = {o.key_or_group for o in parse_overrides(overrides)}
    original = [o for o in parse_overrides_loosely(OmegaConf.load(run / ".hydra" / "overrides.yaml"))
                if o.key_or_group not in replaced and o.key_or_group.split(".")[0] not in NOT_REPLAYED
                and not o.key_or_group.startswith("hydra")]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            cfg = hydra_compose("train", overrides=[o.input_line for o in original] + list(overrides))
    except Exception as err:
        line = one_line(err)
        if line is None:
            raise
        raise ReplayError(line.removeprefix("config error: ")) from None
    finally:
        GlobalHydra.instance().clear()
    saved = (header.get("hyper_parameters") or {}).get("run_settings") or {}
    if int(saved.get("world_size") or 1) > 1:
        raise ReplayError(f"CKPT is of a run of {saved['world_size']} processes; allowed: a checkpoint of a "
                          "single-process run (a replay runs in one process)")
    ran = _original_config(run)
    last = int(OmegaConf.select(ran, "trainer.max_steps", default=None) or cfg.trainer.max_steps)
    k = int(header.get("global_step", 0))
    if steps[0] < k:
        raise ReplayError(f"--steps {steps[0]}:{steps[1]} starts before the checkpoint's step {k}; allowed: A >= {k} "
                          "(or a checkpoint saved at or before step A)")
    if steps[1] > last:
        raise ReplayError(f"--steps {steps[0]}:{steps[1]} goes past the run's last step (trainer.max_steps={last}); "
                          f"allowed: B <= {last}")
    wandb_cfg = OmegaConf.select(ran, "logger.wandb", default=None) or {}
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
        for key, value in (saved.get("scheduler") or {}).items():  # the run's schedule (its length, a branch's start)
            if cfg.get("scheduler") is not None:
                cfg.scheduler[key] = value
        cfg.trainer.update(max_steps=steps[1], log_every_n_steps=1, val_check_interval=steps[1],
                           enable_checkpointing=False, limit_val_batches=0, num_sanity_val_steps=0)
        cfg.update(train=True, test=False, ckpt_path=None, decay_from=None, print_config=False)
        for name in LEFT_OUT:
            cfg.callbacks.pop(name, None)
        if cfg.callbacks.get("stability") is not None:
            cfg.callbacks.stability.update(every_n_steps=1, probe_every_n_steps=1)
        record = {"of": str(run), "checkpoint": str(ckpt), "from_step": k, "steps": list(steps),
                  "overrides": list(overrides)}
        if cfg.callbacks.get("summary") is not None:
            cfg.callbacks.summary.config = {**OmegaConf.to_container(cfg.callbacks.summary.get("config") or {}),
                                            "replay": record}
        if (cfg.get("logger") or {}).get("wandb") is not None:
            name = wandb_cfg.get("name") or run.name
            cfg.logger.wandb.update(group=wandb_cfg.get("group") or cfg.name, job_type="replay", id=None,
                                    name=f"{name}-replay{steps[0]}-{steps[1]}" + "".join(f"-{o}" for o in overrides),
                                    tags=[*(cfg.get("tags") or []), "replay"])
            cfg.logger.wandb.per_layer_scalars = True  # every probe's curve over the replayed steps
    return cfg


def parse_overrides_loosely(lines: Any) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides([str(line) for line in lines or []])


def _original_config(run: Path) -> DictConfig:
    """The run's resolved config as its loggers recorded it (csv/hparams.yaml), else an empty one."""
    path = run / "csv" / "hparams.yaml"
    return OmegaConf.load(path) if path.is_file() else OmegaConf.create({})


def default_out(run: Path, steps: tuple[int, int], overrides: list[str]) -> Path:
    slug = "".join("-" + re.sub(r"[^A-Za-z0-9_.=]+", "_", o) for o in overrides)
    base = run / "replays" / f"{steps[0]}-{steps[1]}{slug}"
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def replay(ckpt: str | Path, steps: tuple[int, int], out: str | Path | None = None,
           overrides: list[str] | None = None) -> Path:
    """Replay the steps (see the module docstring); returns the replay folder."""
    from minillm.training.run.job import prepare
    from minillm.training.run.job import run as run_job

    overrides = list(overrides or [])
    path, header = find_checkpoint(Path(ckpt), steps[0])
    run = run_folder(path)
    out = Path(out) if out else default_out(run, steps, overrides)
    if out.exists() and any(out.iterdir()):
        raise ReplayError(f"--out {str(out)!r} is not empty; allowed: a new or empty folder")
    cfg = compose(run, path, header, steps, out, overrides)
    start = ReplayStart(str(path), header, overridden=[o.key_or_group for o in parse_overrides(overrides)])
    created = [p for p in (out.parent, out) if not p.exists()]
    try:
        job = prepare(cfg, start)
        lr_factor = _lr_factor(cfg, start, overrides)
        keep = {getattr(c, "state_key", type(c).__qualname__) for c in job.trainer.callbacks}
        carried: dict[str, Any] = {}

        def transform(checkpoint: dict) -> dict:
            carried.update(carry_over(checkpoint, job.module, keep, lr_factor))
            return checkpoint

        job.trainer.strategy.checkpoint_io = TransformedCheckpointIO(transform)
        summary = next((c for c in job.trainer.callbacks if type(c).__name__ == "RunSummary"), None)
        if summary is not None and "replay" in summary.config:
            summary.config["replay"]["carried_over"] = carried  # filled when the checkpoint loads
    except (ConfigError, OSError):
        for p in reversed(created):
            shutil.rmtree(p, ignore_errors=True)
        raise
    with StopSignals() as signals:  # a stop signal (the run's own command may send one) ends it as stopped
        run_job(job, signals)
    finish(out, run, steps, overrides, cfg)
    return out


def _lr_factor(cfg: DictConfig, start: ReplayStart, overrides: list[str]) -> float:
    if not any(o.key_or_group == "optimizer.lr" for o in parse_overrides(overrides)):
        return 1.0
    if str(cfg.optimizer.get("_target_", "")).endswith("MuonWithAdamW"):
        raise ReplayError("optimizer.lr= cannot be replayed with optimizer=muon (two learning rates); allowed: the "
                          "other overrides")
    return float(cfg.optimizer.lr) / float(start.saved_settings["optimizer"]["lr"])


def finish(out: Path, run: Path, steps: tuple[int, int], overrides: list[str], cfg: DictConfig) -> dict:
    """Compare the replayed losses with the original's, plot both, lead-lag the replay's first spike; the results go
    into summary.json's replay record."""
    mine, theirs = read_curves(out / "csv" / "metrics.csv"), read_curves(run / "csv" / "metrics.csv")
    replayed = {s: v for s, v in mine.get(TRAIN_LOSS, []) if steps[0] <= s < steps[1]}
    original = {s: v for s, v in theirs.get(TRAIN_LOSS, []) if steps[0] <= s < steps[1]}
    both = sorted(set(replayed) & set(original))
    result: dict[str, Any] = {
        "compared_steps": len(both),
        "identical_to_original": all(replayed[s] == original[s] for s in both) if both else None,
        "final_train_loss": replayed[max(replayed)] if replayed else None,
        "max_train_loss": max((v for v in replayed.values() if math.isfinite(v)), default=None),
    }
    spike = _first_spike(mine, cfg, steps)
    if spike is not None:
        series = {k: v for k, v in mine.items() if forensics.is_signal(k)}
        entries = forensics.lead_lag(series, spike)
        record = {"kind": "replay_spike", "step": spike, "lead_lag": entries, "loss": dict(mine[TRAIN_LOSS]).get(spike)}
        (out / "leadlag.json").write_text(json.dumps(json_safe(record), indent=1) + "\n")
        (out / "leadlag.md").write_text(forensics.report(json_safe(record)))
        forensics.plot(series, spike, entries, out / "leadlag.png", title=f"replay: the steps before step {spike}")
        result["spike_step"] = spike
    plot_losses([(f"original ({run.name})", sorted(original.items()), None),
                 ("replay" + (": " + " ".join(overrides) if overrides else ""), sorted(replayed.items()),
                  _diverged_step(out))], out / "replay.png", title=f"steps {steps[0]}-{steps[1] - 1}, same batches")
    path = out / "summary.json"
    if path.is_file():
        summary = json.loads(path.read_text())
        summary.setdefault("replay", {}).update(json_safe(result))
        write_json(path, summary)
    return result


def _first_spike(curves: dict, cfg: DictConfig, steps: tuple[int, int]) -> int | None:
    """The first loss spike (a score above spike_k) or divergence among the replayed steps A..B-1, if any (the
    steps from the checkpoint up to A run only to reach A)."""
    k = OmegaConf.select(cfg, "callbacks.stability.spike_k", default=4.0)
    spikes = [s for s, v in curves.get("stab/loss_spike_score", []) if v > k]
    diverged = [s for s, _ in curves.get(DIVERGED, [])]
    found = sorted(s for s in spikes + diverged if steps[0] <= s < steps[1])
    return found[0] if found else None


def _diverged_step(out: Path) -> int | None:
    path = out / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    return summary.get(schema.DIVERGED_STEP) if summary.get("diverged") else None


def plot_losses(lines: list[tuple[str, list[tuple[int, float]], int | None]], path: Path, title: str) -> None:
    """Train loss against the step, one line per (label, points, diverged step or None); a cross where one
    diverged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    for label, points, diverged in lines:
        finite = [(s, v) for s, v in points if math.isfinite(v)]
        if not finite:
            continue
        style = {"color": "black", "linewidth": 2.5, "alpha": 0.5} if label.startswith("original") else {}
        (line,) = ax.plot([s for s, _ in finite], [v for _, v in finite], label=label, **style)
        if diverged is not None:
            ax.plot([finite[-1][0]], [finite[-1][1]], "x", color=line.get_color(), markersize=10)
    ax.set(xlabel="step", ylabel=TRAIN_LOSS, title=title)
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(folders: list[str | Path], out: str | Path | None = None) -> Path:
    """One plot of the train loss of every replay under the folders, with their original runs' (same steps)."""
    replays = [r for f in folders for r in find_runs(f, replays=True) if "replay" in r.summary]
    if not replays:
        raise ReplayError(f"--plot {' '.join(map(str, folders))}: no replay there (a summary.json with a replay "
                          "record); allowed: replay folders, or a folder of them (<run>/replays)")
    lo = min(r.summary["replay"]["steps"][0] for r in replays)
    hi = max(r.summary["replay"]["steps"][1] for r in replays)
    lines = []
    for of in sorted({r.summary["replay"]["of"] for r in replays}):
        curve = read_curves(Path(of) / "csv" / "metrics.csv").get(TRAIN_LOSS, [])
        lines.append((f"original ({Path(of).name})", [(s, v) for s, v in curve if lo <= s < hi], None))
    for r in replays:
        label = " ".join(r.summary["replay"].get("overrides") or []) or "replay, no override"
        lines.append((label, [(s, v) for s, v in r.curves.get(TRAIN_LOSS, []) if lo <= s < hi],
                      r.summary.get(schema.DIVERGED_STEP) if r.summary.get("diverged") else None))
    path = Path(out) if out else Path(folders[0]) / "compare.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_losses(lines, path, title=f"train loss on the same batches, steps {lo}-{hi - 1}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", nargs="?", help="a checkpoint at or before step A, a spike file, or a folder of them")
    parser.add_argument("overrides", nargs="*", help=f"key=value, of: {', '.join(OVERRIDES)}")
    parser.add_argument("--steps", help="A:B, the steps A to B - 1 (the step column of metrics.csv)")
    parser.add_argument("--out", help="the replay folder (default <run>/replays/<A>-<B>...); with --plot the PNG")
    parser.add_argument("--plot", nargs="+", metavar="DIR", help="plot the replays under these folders")
    args = parser.parse_intermixed_args(argv)
    try:
        if args.plot:
            if args.ckpt or args.steps:
                raise ReplayError("--plot plots replays; it takes no CKPT or --steps")
            print(f"wrote {plot(args.plot, args.out)}")
            return 0
        if not args.ckpt or args.steps is None:
            raise ReplayError("CKPT and --steps A:B are required (or --plot DIR...)")
        out = replay(args.ckpt, parse_steps(args.steps), args.out, args.overrides)
    except SystemExit as stopped:
        signum = signal_of(stopped.code)
        if signum is None:
            raise
        print(f"{PROG}: stopped by {signal.Signals(signum).name}; the replay is incomplete (summary.json says "
              "preempted): replay again", file=sys.stderr)
        return stopped.code
    except (ReplayError, ConfigError, OSError) as err:
        line = disk_error(err) if isinstance(err, OSError) and not isinstance(err, ReplayError) else None
        print(f"{PROG}: error: {line or ' '.join(str(err).split())}", file=sys.stderr)
        return 2
    summary = json.loads((out / "summary.json").read_text())
    record = summary.get("replay") or {}
    same = {True: "bit-identical to the original's", False: "different from the original's", None: "not compared"}
    ended = f"diverged at step {summary.get(schema.DIVERGED_STEP)}" if summary.get("diverged") else "no divergence"
    print(f"replayed steps {record.get('steps')} from step {record.get('from_step')} into {out}: {ended}"
          f"; train losses {same[record.get('identical_to_original')]} ({record.get('compared_steps')} steps compared)")
    return 0


__all__ = ["MODEL_OVERRIDES", "main", "parse_steps", "plot", "replay"]

if __name__ == "__main__":
    sys.exit(main())
