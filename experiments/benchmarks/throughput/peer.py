"""minillm's default training against nanoGPT-style peers on the same work: tokens/s and the loss at equal time.

    .venv/bin/python -m experiments.benchmarks.throughput.peer --nanogpt ~/src/nanoGPT           # peer.json / peer.md
    .venv/bin/python -m experiments.benchmarks.throughput.peer --nanogpt ~/src/nanoGPT --compile # both compiled
    .venv/bin/python -m experiments.benchmarks.throughput.peer --steps 40 --rounds 1 --out /tmp/p  # a quick check

Arms, one process each, run one after the other and interleaved (round r runs them in order, round r+1 in
reverse), all on ``--threads`` CPU threads:
  - minillm: ``python train.py trainer.max_steps=S threads=N`` with every other setting at its default (the
    embedded Shakespeare, char tokens, dim 128, 4 layers, context 64, batch 32, AdamW 3e-3, warmup 100 + cosine to
    0.1x, clipping 1.0, fp32, the stability callbacks and the W&B logger, offline, with its CSV log beside it);
  - loop: experiments/benchmarks/calibration/nanogpt_loop.py, the independent LLaMA-style model and
    nanoGPT-style loop that imports nothing from minillm, with the same recipe;
  - nanogpt: nanoGPT's own ``train.py`` and ``model.py`` (GPT-2 style: LayerNorm, GELU MLP 4x, learned positions,
    tied embedding) from the copy named by ``--nanogpt``, run from that folder by path (nothing of it is copied
    into this repository), on minillm's train/val token ids written as its ``data/<name>/train.bin``, same
    shape, batch, steps, lr schedule (warmup 100, cosine to 0.1x over the S steps), AdamW betas (0.9, 0.95),
    weight decay 0.1 (nanoGPT also decays the embedding), clipping 1.0, fp32.
Not given ``--nanogpt``, the nanogpt arm is left out.

Measured: the steady-state training tokens/s, the tokens of the steps after ``--skip`` over their time (minillm:
from its ``perf/tokens_per_s``, logged every 10 steps over the last 10; nanoGPT: its per-iteration times; the loop:
its whole training time, first steps included, so it is a lower bound), the process's wall time (start-up, data,
compilation, evaluation, checkpoints and logging included), and the train loss at equal training time: after
``--skip``, the time the fastest of minillm and nanoGPT needed for the remaining steps, where each arm's loss is
the mean of its logged train losses over the 50 steps before the point it had reached.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments.common.layout import ROOT
from experiments.common.machine import machine, this_checkout

HERE = Path(__file__).resolve().parent
LOOP = ROOT / "experiments" / "benchmarks" / "calibration" / "nanogpt_loop.py"
NANOGPT_ITER = re.compile(r"^iter (\d+): loss ([0-9.naninf]+), time ([0-9.]+)ms", re.M)
LOSS_WINDOW = 50  # steps of train loss averaged at a point of the curve


def env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "WANDB_MODE": "offline",
            "PYTHONUNBUFFERED": "1"}


def timed(cmd: list[str], cwd: Path, threads: int, extra_env: dict[str, str] | None = None) -> tuple[str, float]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env={**env(threads), **(extra_env or {})}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout + proc.stderr, wall


def steady(steps: list[int], seconds: list[float], tokens_per_step: int, skip: int) -> float:
    """Tokens/s over the steps after ``skip``: ``seconds[i]`` is the time of the steps up to ``steps[i]``."""
    kept = [(s, t) for s, t in zip(steps, seconds, strict=True) if s > skip]
    return tokens_per_step * (kept[-1][0] - skip) / sum(t for _, t in kept)


def clock(steps: list[int], seconds: list[float], skip: int) -> tuple[list[int], list[float]]:
    """(step, training seconds since step ``skip``) at each point after ``skip``."""
    out, total = ([], []), 0.0
    for s, t in zip(steps, seconds, strict=True):
        if s > skip:
            total += t
            out[0].append(s)
            out[1].append(total)
    return out


def loss_at(curve: list[tuple[int, float]], times: tuple[list[int], list[float]], when: float) -> tuple[int, float]:
    """The step reached ``when`` seconds after the skipped steps, and the mean train loss over the LOSS_WINDOW
    steps before it."""
    reached = max((s for s, t in zip(*times, strict=True) if t <= when + 1e-9), default=times[0][0])
    window = [v for s, v in curve if reached - LOSS_WINDOW < s <= reached]
    return reached, statistics.fmean(window)


def run_minillm(steps: int, threads: int, compile_: bool, work: Path, skip: int) -> dict:
    from minillm.analysis.runs import read_curves

    log_dir = work / "minillm"
    before = set(log_dir.glob("peer/runs/*"))
    cmd = [sys.executable, "train.py", f"trainer.max_steps={steps}", f"threads={threads}", "name=peer",
           f"paths.log_dir={log_dir}"] + (["model.compile=true"] if compile_ else [])
    _, wall = timed(cmd, ROOT, threads)
    (run_dir,) = set(log_dir.glob("peer/runs/*")) - before
    summary = json.loads((run_dir / "summary.json").read_text())
    curves = read_curves(next(run_dir.rglob("metrics.csv")))
    rate = curves["perf/tokens_per_s"]
    per_step = summary["tokens"] // summary["steps"]
    interval = [b[0] - a[0] for a, b in zip([(0, 0.0)] + rate[:-1], rate, strict=True)]
    seconds = [n * per_step / r for n, (_, r) in zip(interval, rate, strict=True)]
    ends = [s + 1 for s, _ in rate]  # logged at global_step - 1: the step count after the interval
    loss = [(s + 1, v) for s, v in curves["train/loss"]]
    return {"tokens_per_s": steady(ends, seconds, per_step, skip), "wall_s": wall, "clock": clock(ends, seconds, skip),
            "loss": loss, "n_params": summary.get("n_params"), "final_val_loss": summary.get("final_val_loss")}


def run_loop(steps: int, threads: int, text: Path, work: Path) -> dict:
    out = work / "loop.json"
    _, wall = timed([sys.executable, str(LOOP), "--text", str(text), "--steps", str(steps), "--eval-every",
                     str(steps), "--out", str(out)], ROOT, threads)
    res = json.loads(out.read_text())
    return {"tokens_per_s": res["tokens_per_s"], "wall_s": wall, "n_params": res["n_params"]}


def nanogpt_data(work: Path) -> tuple[Path, int]:
    """minillm's default train/val ids as nanoGPT's data/minillm/{train,val}.bin + meta.pkl."""
    from experiments.common.reference import compose, tokens

    train, val, vocab = tokens(compose())
    folder = work / "data" / "minillm"
    folder.mkdir(parents=True, exist_ok=True)
    train.astype(np.uint16).tofile(folder / "train.bin")
    val.astype(np.uint16).tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": vocab}, f)
    return work, len(train)


def run_nanogpt(repo: Path, steps: int, threads: int, compile_: bool, work: Path, skip: int) -> dict:
    # nanoGPT's train.py reads ./configurator.py and ./data/<dataset>/ relative to its working directory
    (work / "configurator.py").write_text((repo / "configurator.py").read_text())
    args = dict(dataset="minillm", device="cpu", dtype="float32", compile=compile_, batch_size=32, block_size=64,
                n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False, learning_rate=3e-3, max_iters=steps - 1,
                lr_decay_iters=steps, min_lr=3e-4, warmup_iters=100, beta2=0.95, weight_decay=0.1, grad_clip=1.0,
                gradient_accumulation_steps=1, eval_interval=steps, eval_iters=20, log_interval=1,
                always_save_checkpoint=False, out_dir=str(work / "out"))
    out, wall = timed([sys.executable, str(repo / "train.py"), *(f"--{k}={v}" for k, v in args.items())], work, threads)
    rows = [(int(i) + 1, float(loss), float(ms) / 1000) for i, loss, ms in NANOGPT_ITER.findall(out)]
    if len(rows) != steps:
        raise SystemExit(f"nanoGPT printed {len(rows)} iterations, expected {steps}:\n{out[-3000:]}")
    ends, seconds = [r[0] for r in rows], [r[2] for r in rows]
    n_params = re.search(r"number of parameters: ([0-9.]+)M", out)
    return {"tokens_per_s": steady(ends, seconds, 32 * 64, skip), "wall_s": wall, "clock": clock(ends, seconds, skip),
            "loss": [(r[0], r[1]) for r in rows], "n_params": float(n_params.group(1)) * 1e6 if n_params else None}


def equal_time(arms: dict[str, dict]) -> dict:
    """Where minillm and nanoGPT were when the faster one finished."""
    timed_arms = {k: v for k, v in arms.items() if "clock" in v}
    when = min(v["clock"][1][-1] for v in timed_arms.values())
    out = {"seconds": when}
    for name, arm in timed_arms.items():
        step, loss = loss_at(arm["loss"], arm["clock"], when)
        out[name] = {"step": step, "train_loss": loss}
    return out


def one_round(order: list[str], a: argparse.Namespace, work: Path, text: Path, skip: int) -> dict:
    arms = {}
    for name in order:
        if name == "minillm":
            arms[name] = run_minillm(a.steps, a.threads, a.compile, work, skip)
        elif name == "loop":
            arms[name] = run_loop(a.steps, a.threads, text, work)
        else:
            arms[name] = run_nanogpt(a.nanogpt, a.steps, a.threads, a.compile, work, skip)
        arms[name]["load_after"] = round(os.getloadavg()[0], 2)
        print(f"  {name}: {arms[name]['tokens_per_s']:,.0f} tokens/s, {arms[name]['wall_s']:.1f} s wall", flush=True)
    res = {"order": order, "equal_time": equal_time(arms) if "nanogpt" in arms else None}
    for name, arm in arms.items():
        res[name] = {k: v for k, v in arm.items() if k not in ("clock", "loss")}
    return res


def summarize(rounds: list[dict]) -> dict:
    arms = [k for k in ("minillm", "loop", "nanogpt") if k in rounds[0]]
    out = {name: {"tokens_per_s_median": statistics.median(r[name]["tokens_per_s"] for r in rounds),
                  "wall_s_median": statistics.median(r[name]["wall_s"] for r in rounds)} for name in arms}
    for peer in arms[1:]:
        ratios = [r["minillm"]["tokens_per_s"] / r[peer]["tokens_per_s"] for r in rounds]
        out[f"minillm_over_{peer}"] = {"per_round": [round(x, 3) for x in ratios], "median": statistics.median(ratios)}
    return out


def report(res: dict) -> str:
    s, mode = res["summary"], "compiled (torch.compile on both sides)" if res["compile"] else "eager"
    loads = [r[name]["load_after"] for r in res["rounds"] for name in r if isinstance(r[name], dict) and
             "load_after" in r[name]]
    lines = [f"# minillm vs nanoGPT-style peers, {mode}\n",
             f"Machine: {res['machine']}; load average before the runs {res['load_before']:.2f}, after each arm "
             f"{min(loads):.2f}-{max(loads):.2f}. Commit {res['commit']}. "
             f"{res['steps']} steps of batch 32 x 64 tokens, {res['threads']} threads, {len(res['rounds'])} "
             f"interleaved rounds, the first {res['skip']} steps not timed. Generated by "
             f"`python -m experiments.benchmarks.throughput.peer{' --compile' if res['compile'] else ''}`.\n",
             "| arm | parameters | tokens/s (median) | wall s (median) |", "|---|---|---|---|"]
    for name in ("minillm", "loop", "nanogpt"):
        if name in s:
            params = res["rounds"][0][name].get("n_params")
            lines.append(f"| {name} | {params:,.0f} | {s[name]['tokens_per_s_median']:,.0f} | "
                         f"{s[name]['wall_s_median']:.1f} |" if params else
                         f"| {name} | ? | {s[name]['tokens_per_s_median']:,.0f} | {s[name]['wall_s_median']:.1f} |")
    lines.append("")
    for key in (k for k in s if k.startswith("minillm_over_")):
        lines.append(f"- {key.replace('_', ' ')}: **{s[key]['median']:.3f}** (per round {s[key]['per_round']})")
    for i, r in enumerate(res["rounds"]):
        if r.get("equal_time"):
            e = r["equal_time"]
            lines.append(f"- round {i + 1}, after {e['seconds']:.1f} s of training past step {res['skip']}: "
                         f"minillm at step {e['minillm']['step']}, train loss {e['minillm']['train_loss']:.3f}; "
                         f"nanoGPT at step {e['nanogpt']['step']}, train loss {e['nanogpt']['train_loss']:.3f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout (its train.py, model.py, configurator.py)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--skip", type=int, default=20, help="first steps not timed (allocation, compilation)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="torch.compile in minillm and nanoGPT (not the loop)")
    ap.add_argument("--out", type=Path, default=HERE, help="folder of peer[_compiled].json/.md")
    a = ap.parse_args(argv)
    if a.steps <= a.skip + 10:
        ap.error(f"--steps ({a.steps}) must exceed --skip ({a.skip}) by more than one log interval (10)")
    if a.nanogpt and not (a.nanogpt / "train.py").is_file():
        ap.error(f"--nanogpt {a.nanogpt}: no train.py there")
    names = ["minillm", "loop"] + (["nanogpt"] if a.nanogpt else [])
    res = {"machine": machine(), "load_before": os.getloadavg()[0], "steps": a.steps, "skip": a.skip,
           "threads": a.threads, "compile": a.compile, "commit": this_checkout(), "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        from experiments.benchmarks.calibration.independent import corpus_file

        text = corpus_file(work)
        if a.nanogpt:
            nanogpt_data(work)
        for r in range(a.rounds):
            order = names if r % 2 == 0 else names[::-1]
            print(f"round {r + 1}/{a.rounds}: {', '.join(order)}", flush=True)
            res["rounds"].append(one_round(order, a, work, text, a.skip))
    res["summary"] = summarize(res["rounds"])
    a.out.mkdir(parents=True, exist_ok=True)
    stem = "peer_compiled" if a.compile else "peer"
    (a.out / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    (a.out / f"{stem}.md").write_text(report(res))
    print(report(res))


if __name__ == "__main__":
    main()
