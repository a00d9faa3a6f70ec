"""The stability probes on held-out text, for any checkpoint: a depth profile of where activations grow.

    minillm-inspect CKPT --text FILE [--out DIR] [--windows 64] [--no-wandb]
    python -m minillm.tools.inspection run/checkpoints/last.ckpt --text book.txt

Runs the model (eval mode) over evenly spaced windows of the text with the probes train.py's StabilityMonitor uses
(minillm.training.callbacks.probe.ActivationProbe) and writes, in DIR (default: <checkpoint>.inspect/):
``depth_profile.json`` (a row per layer: residual RMS and max |h|, their ratio (outlier ratio), max attention logit;
a row per norm site: input RMS, max |x|, outlier ratio, kurtosis, fp16 headroom, gain mean and std; log Z; the
attention entropy per layer), ``depth_profile.png`` (each against depth) and an offline W&B run with the
``depth/layers`` and ``depth/norm_sites`` tables (upload it with ``wandb sync``). Any minillm checkpoint works,
every norm and placement, an imported Hugging Face model too.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minillm.errors import ArgumentParser
from minillm.metrics import LOG_Z_MAX, LOG_Z_MEAN, layer_metric, norm_metric, parse_metric
from minillm.tools.hub import load_checkpoint
from minillm.training.callbacks.probe import FP16_MAX, ActivationProbe, is_max_metric
from minillm.training.loggers import depth_profile

OUTLIER = "outlier_ratio"  # max |h| / RMS(h): how far the largest activation stands out


def windows(ids: np.ndarray, length: int, count: int) -> torch.Tensor:
    """(count, length) windows evenly spaced over ids (fewer when the text is short)."""
    if len(ids) < length:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one window of {length}")
    starts = np.unique(np.linspace(0, len(ids) - length, num=count).astype(np.int64))
    return torch.as_tensor(np.stack([ids[s:s + length] for s in starts]), dtype=torch.long)


@torch.no_grad()
def probe(model: torch.nn.Module, x: torch.Tensor, batch_size: int = 8) -> dict[str, float]:
    """The probes' values over every window (maxima over windows, means of the rest), plus each layer's outlier
    ratio and each norm site's max |x|."""
    model.eval()
    hooks = ActivationProbe(model, probe_batch=batch_size)
    hooks.attach(attention=True)
    runs = []
    try:
        for b in range(0, len(x), batch_size):
            model(x[b:b + batch_size])
            runs.append(hooks.collect())
    finally:
        hooks.detach()
    values = {k: (max if is_max_metric(k) else np.mean)([r[k] for r in runs if k in r])
              for k in runs[0]}
    out = {k: float(v) for k, v in values.items()}
    for key, value in list(out.items()):
        kind, name, metric = parse_metric(key) or (None, None, None)
        if kind == "layer" and metric == "resid_max":
            out[layer_metric(int(name), OUTLIER)] = value / max(out[layer_metric(int(name), "resid_rms")], 1e-30)
        elif kind == "norm" and metric == "in_max_fp16":
            out[norm_metric(name, "in_max")] = value * FP16_MAX  # the probe gives its outlier ratio and kurtosis
    return out


def inspect(ckpt: str | Path, text: str | Path, out: str | Path | None = None, count: int = 64,
            batch_size: int = 8, wandb: bool = True) -> Path:
    """Write the depth profile of a checkpoint on a text; returns the JSON file."""
    model, tok, meta = load_checkpoint(ckpt)
    text = Path(text)
    if not text.is_file():
        what = "is a folder, not a file" if text.is_dir() else "does not exist"
        raise ValueError(f"--text {str(text)!r} {what}; allowed: a UTF-8 text file")
    ids = np.asarray(tok.encode(text.read_text(encoding="utf-8", errors="replace")), dtype=np.int64)
    x = windows(ids, model.cfg.max_seq_len, count)
    values = probe(model, x, batch_size)
    layers, sites = depth_profile(values)
    out = Path(out) if out else Path(str(ckpt) + ".inspect")
    out.mkdir(parents=True, exist_ok=True)
    profile = {"checkpoint": str(ckpt), "text": str(text), "windows": len(x), "tokens": int(x.numel()),
               "model": {k: meta["model"].get(k) for k in ("norm", "placement", "n_layers", "dim", "qk_norm")},
               "step": meta.get("global_step"), "log_z_mean": values.get(LOG_Z_MEAN),
               "log_z_max": values.get(LOG_Z_MAX),
               "layers": layers, "norm_sites": sites}
    path = out / "depth_profile.json"
    path.write_text(json.dumps(profile, indent=1, allow_nan=False, default=lambda v: None) + "\n")
    plot(profile, out / "depth_profile.png")
    if wandb:
        log_tables(profile, out)
    return path


def plot(profile: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    layers = profile["layers"]
    depth = [r["layer"] for r in layers]
    for metric in ("resid_rms", "resid_max"):
        a.plot(depth, [r.get(metric) for r in layers], marker="o", label=metric)
    a.set(xlabel="layer", ylabel="residual stream", yscale="log", title="residual RMS and max |h| by depth")
    sites = profile["norm_sites"]
    position = list(range(len(sites)))
    for metric in ("in_rms", OUTLIER):
        b.plot(position, [r.get(metric) for r in sites], marker=".", label=metric)
    b.set(xlabel="norm site (in depth order)", yscale="log", title="norm inputs: RMS and max |x| / RMS")
    for ax in (a, b):
        ax.legend(fontsize=7)
    fig.suptitle(f"{Path(profile['checkpoint']).name}: {profile['model']['norm']}, {profile['model']['placement']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_tables(profile: dict[str, Any], out: Path) -> None:
    """An offline W&B run (job_type inspect) with the two depth tables; a W&B failure is a warning."""
    import logging

    try:
        import wandb

        run = wandb.init(project="minillm", job_type="inspect", dir=str(out), mode="offline",
                         name=f"inspect-{Path(profile['checkpoint']).stem}", config=profile["model"], reinit=True)
        for key in ("layers", "norm_sites"):
            rows = profile[key]
            if rows:
                run.log({f"depth/{key}": wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])})
        run.finish()
    except Exception as err:  # the JSON and the PNG are written: W&B is a view
        logging.getLogger("minillm").warning(f"W&B tables not written: {type(err).__name__}: {err}")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="minillm-inspect", description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", help="a minillm checkpoint (train.py's, or minillm-import's)")
    parser.add_argument("--text", required=True, help="held-out text (UTF-8) to run the model on")
    parser.add_argument("--out", default=None, help="output folder (default: <checkpoint>.inspect)")
    parser.add_argument("--windows", type=int, default=64, help="windows of max_seq_len tokens, evenly spaced")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--no-wandb", action="store_true", help="no W&B run (JSON and PNG only)")
    args = parser.parse_args(argv)
    if args.windows < 1 or args.batch_size < 1:
        parser.exit(2, f"{parser.prog}: error: --windows and --batch-size must be >= 1\n")
    try:
        path = inspect(args.ckpt, args.text, args.out, args.windows, args.batch_size, not args.no_wandb)
    except (ValueError, OSError) as err:  # CheckpointError is a ValueError
        print(f"{parser.prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    profile = json.loads(path.read_text())
    worst = max(profile["layers"], key=lambda r: r.get("resid_rms") or -math.inf, default=None)
    print(f"wrote {path}, {path.with_suffix('.png').name}" + (f"; largest residual RMS {worst['resid_rms']:.4g} at "
                                                              f"layer {worst['layer']}" if worst else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
