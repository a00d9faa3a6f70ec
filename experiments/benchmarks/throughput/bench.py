"""Throughput benchmark, in one process (see README.md here):

  (a) minillm's Lightning training step (the default config: callbacks, logging) vs the reference loop
      (experiments.common.reference: a plain PyTorch loop over the same composed configs/), interleaved rounds
  (b) tokens/s and activation memory per norm x placement (reference loop, interleaved rounds)
  (c) GPU only (skipped without CUDA): model=gpt125m in bf16, eager vs torch.compile, rmsnorm vs
      fused_rmsnorm, tokens/s and MFU against Lightning's peak table; synthetic tokens, so it needs neither
      Hydra nor `datasets` (a bare CUDA image with torch, triton and lightning runs it)

    .venv/bin/python -m experiments.benchmarks.throughput.bench --out DIR        # CPU: (a) + (b)
    .venv/bin/python -m experiments.benchmarks.throughput.bench --gpu --out DIR  # on a CUDA machine: (c) only
    .venv/bin/python -m experiments.benchmarks.throughput.bench --sections abc   # everything

Results go to --out (a .json path, or a folder for throughput-<device>.json; default: a temp folder, never
the committed results) and are rewritten after every section and every (c) configuration; a (c)
configuration that fails becomes an error row and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

if "--smoke" in sys.argv:  # fused_rmsnorm on the CPU interpreter: must be set before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

import lightning as L  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from experiments.common import reference  # noqa: E402  (imports Hydra and datasets only when (a) / (b) run)
from experiments.common.failure import failure  # noqa: E402
from experiments.common.machine import machine  # noqa: E402
from minillm.model import ModelConfig, Transformer  # noqa: E402
from minillm.training.callbacks.perf import analytic_flops_per_token, device_peak_flops  # noqa: E402


class _StepClock(L.Callback):
    """Wall time from the start of step `skip` to the end of the last step (callbacks and logging included)."""

    def __init__(self, skip: int):
        self.skip, self.t0, self.t1 = skip, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.skip:
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.t1 = time.perf_counter()


def lightning_tokens_per_s(steps: int, skip: int, tmp: Path) -> float:
    """train.py's fit with the default config (model, norm, callbacks, csv logger), no validation/test."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    import minillm.training.train as train_script
    from minillm.training.run.hydra import config_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["logger=csv", f"trainer.max_steps={steps}", "+trainer.limit_val_batches=0",
                                          "test=false", "callbacks.text_sample.max_new_tokens=0",
                                          "~callbacks.progress_bar"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp / f"run-{time.time_ns()}")
        del cfg["hydra"]
    clock = _StepClock(skip)
    import minillm.training.run.build as build

    real = build.instantiate

    def with_clock(c, *a, **kw):  # add the clock to the trainer's callbacks
        if "callbacks" in kw:
            kw["callbacks"] = [*kw["callbacks"], clock]
        return real(c, *a, **kw)

    build.instantiate = with_clock
    try:
        train_script.train(cfg)
    finally:
        build.instantiate = real
    B, T = cfg.data.batch_size, cfg.model.max_seq_len
    return (steps - skip) * B * T / (clock.t1 - clock.t0)


# the reference arms' configs: the default run (scheduled over 2000 steps, as measured), or a norm x placement
PLAIN = ("trainer.max_steps=2000",)


def plain_tokens_per_s(cfg, steps: int, skip: int) -> float:
    """The reference loop's step (same batches, AdamW groups, schedule, clipping), timed from step `skip` on."""
    loop = reference.Loop.of(cfg)
    torch.manual_seed(loop.seed)
    tr, _, vocab = reference.tokens(cfg)
    model, opt, sched = reference.build(cfg, vocab)
    model.train()
    for step in range(steps):
        if step == skip:
            t0 = time.perf_counter()
        x, y = reference.train_batch(tr, loop.data_seed, step, loop.batch_size, loop.seq_len)
        loss = reference.step(model, opt, sched, x, y, loop.clip)
        loss.item()  # as Lightning's loop reads the loss for the progress bar / logs
    return (steps - skip) * loop.batch_size * loop.seq_len / (time.perf_counter() - t0)


def activation_bytes(cfg: ModelConfig, batch: int, seq_len: int) -> int:
    """Bytes of the tensors autograd saves for the backward of one training forward (distinct storages)."""
    model = Transformer(cfg).train()
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if t.device.type != "meta":
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randint(0, cfg.vocab_size, (batch, seq_len)))
    return sum(n for ptr, n in seen.items() if ptr not in params)


def section_a(rounds: int, steps: int, skip: int, tmp: Path) -> dict:
    lit, plain = [], []
    for r in range(rounds):  # interleaved: Lightning, plain, Lightning, plain, ...
        lit.append(lightning_tokens_per_s(steps, skip, tmp))
        plain.append(plain_tokens_per_s(reference.compose(*PLAIN), steps, skip))
        print(f"(a) round {r}: minillm {lit[-1]:.0f} tok/s, plain {plain[-1]:.0f} tok/s", flush=True)
    ratio = statistics.median(lit) / statistics.median(plain)
    return dict(minillm_tokens_per_s=lit, plain_tokens_per_s=plain, ratio_of_medians=ratio,
                ratios_per_round=[a / b for a, b in zip(lit, plain, strict=True)])


def section_b(rounds: int, steps: int, skip: int, norms: list[str], placements: list[str]) -> list[dict]:
    cases = [(n, p) for n in norms for p in placements]
    cfgs = {c: reference.compose(*PLAIN, f"norm={c[0]}", f"placement={c[1]}") for c in cases}
    tps: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    for r in range(rounds):
        for c in cases:
            tps[c].append(plain_tokens_per_s(cfgs[c], steps, skip))
        print(f"(b) round {r} done", flush=True)
    out = []
    for n, p in cases:
        cfg = cfgs[(n, p)]
        model_cfg = reference.model_config(cfg, reference.tokens(cfg)[2])
        out.append(dict(norm=n, placement=p, tokens_per_s=statistics.median(tps[(n, p)]), runs=tps[(n, p)],
                        activation_mib=activation_bytes(model_cfg, cfg.data.batch_size, cfg.data.seq_len) / 2**20))
    return out


def section_c(steps: int = 30, skip: int = 10, batch: int = 16, seq_len: int = 1024, save=lambda rows: None,
              smoke: bool = False) -> list[dict]:
    """GPU: gpt125m-like model (dim 768, 12 layers, 12 heads, 32K vocab), bf16 autocast, AdamW, random tokens.
    smoke: a tiny model on the CPU (the code path only; fused_rmsnorm then needs TRITON_INTERPRET=1)."""
    dev = torch.device("cpu" if smoke else "cuda")
    peak = None if smoke else peak_flops(dev)
    shape = dict(vocab_size=256, dim=32, n_layers=2, n_heads=2) if smoke else dict(vocab_size=32768, dim=768,
                                                                                     n_layers=12, n_heads=12)
    if smoke:
        steps, skip, batch, seq_len = 3, 1, 2, 16
    out = []
    for norm in ("rmsnorm", "fused_rmsnorm"):
        for compiled in (False, True):
            row = dict(norm=norm, compiled=compiled, batch=batch, seq_len=seq_len)
            try:
                row.update(_train_steps(dev, ModelConfig(max_seq_len=seq_len, norm=norm, **shape), compiled,
                                        steps, skip, batch, seq_len, peak))
            except Exception as e:  # one failing configuration must not lose the others
                row.update(failure(e))
            out.append(row)
            save(out)
            print(row, flush=True)
            torch._dynamo.reset()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return out


def _train_steps(dev, cfg: ModelConfig, compiled: bool, steps: int, skip: int, batch: int, seq_len: int,
                 peak: float | None) -> dict:
    torch.manual_seed(0)
    model = Transformer(cfg).to(dev)
    if compiled:
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev.type == "cuda")
    x = torch.randint(0, cfg.vocab_size, (batch, seq_len), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else lambda: None
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(steps):
        if step == skip:
            sync()
            t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float().flatten(0, 1), x.roll(-1, 1).flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync()
    tok_s = (steps - skip) * batch * seq_len / (time.perf_counter() - t0)
    flops = analytic_flops_per_token(cfg, seq_len) * tok_s
    causal = analytic_flops_per_token(cfg, seq_len, causal=True) * tok_s
    return dict(tokens_per_s=tok_s, flops_per_s=flops, mfu=flops / peak if peak else None,
                mfu_causal=causal / peak if peak else None, peak_flops=peak,
                peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None)


def peak_flops(dev: torch.device) -> float | None:
    """bf16 dense peak of the GPU (minillm's one table: Lightning's, else minillm's by device name)."""
    return device_peak_flops(dev, torch.bfloat16)


def conditions() -> dict:
    """What else the timings depend on, besides the machine."""
    return dict(platform=platform.platform(), torch_threads=torch.get_num_threads(), lightning=L.__version__,
                load_avg_start=os.getloadavg())


def out_path(out: str | None) -> Path:
    """--out: a .json path as given, or a folder for throughput-<device>.json; default: a temp folder."""
    if out and out.endswith(".json"):
        return Path(out)
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    name = "throughput-" + "".join(c if c.isalnum() or c in "._-" else "-" for c in dev) + ".json"
    return Path(out or Path(tempfile.gettempdir()) / "minillm-throughput") / name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=5, help="warmup steps not timed")
    ap.add_argument("--norms", default="layernorm,rmsnorm,batchnorm,none")
    ap.add_argument("--placements", default="pre,post")
    ap.add_argument("--sections", help="sections to run, letters of abc (default: ab; c alone with --gpu)")
    ap.add_argument("--gpu", action="store_true", help="run section (c) (needs CUDA)")
    ap.add_argument("--smoke", action="store_true", help="section (c) with a tiny model on the CPU (code check)")
    ap.add_argument("--out", help="results .json, or a folder (default: a temp folder)")
    ap.add_argument("--report", metavar="JSON", help="measure nothing: rewrite the .md of a results JSON")
    a = ap.parse_args()
    if a.report:
        Path(a.report).with_suffix(".md").write_text(markdown(json.loads(Path(a.report).read_text())))
        return
    sections = a.sections or ("c" if a.gpu or a.smoke else "ab")
    if a.gpu and "c" not in sections:
        sections += "c"
    torch.set_num_threads(2)
    tmp = Path(tempfile.gettempdir()) / "minillm-throughput"
    out = out_path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    res: dict = dict(machine=machine(), device=device, conditions=conditions(), args=vars(a), a=None, b=[])

    def save(section: str | None = None, value=None) -> None:
        if section:
            res[section] = value
        res["conditions"]["load_avg_end"] = os.getloadavg()
        out.write_text(json.dumps(res, indent=1))
        out.with_suffix(".md").write_text(markdown(res))

    if "a" in sections:
        save("a", section_a(a.rounds, a.steps, a.skip, tmp))
    if "b" in sections:
        save("b", section_b(max(2, a.rounds - 1), a.steps // 2, a.skip, a.norms.split(","), a.placements.split(",")))
    if "c" in sections:
        if torch.cuda.is_available() or a.smoke:
            section_c(save=lambda rows: save("c", rows), smoke=a.smoke and not torch.cuda.is_available())
        else:
            save("c", "skipped: no CUDA device")
    save()
    print(markdown(res))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    failed = [r for r in res["c"] if "error" in r] if isinstance(res.get("c"), list) else []
    if failed:  # the rows are written; the exit status says that some failed
        raise SystemExit(f"bench: {len(failed)} configuration(s) of section c failed; see {out.with_suffix('.md')}")


def markdown(res: dict) -> str:
    A, lines = res.get("a"), []
    if A:
        lines += ["| run | minillm tok/s | plain tok/s | ratio |", "|---|---|---|---|"]
        lines += [f"| round {i} | {x:.0f} | {y:.0f} | {x / y:.3f} |"
                  for i, (x, y) in enumerate(zip(A["minillm_tokens_per_s"], A["plain_tokens_per_s"], strict=True))]
        lines += [f"| median | {np.median(A['minillm_tokens_per_s']):.0f} | "
                  f"{np.median(A['plain_tokens_per_s']):.0f} | {A['ratio_of_medians']:.3f} |", ""]
        q1, q2, q3 = np.percentile(A["ratios_per_round"], [25, 50, 75])
        lines += [f"Median of the per-round (paired) ratios: {q2:.3f}, quartiles {q1:.3f} / {q3:.3f}.", ""]
    if res.get("b"):
        lines += ["| norm | placement | tokens/s (median) | activation memory (MiB, saved for backward) |",
                  "|---|---|---|---|"]
        lines += [f"| {r['norm']} | {r['placement']} | {r['tokens_per_s']:.0f} | {r['activation_mib']:.1f} |"
                  for r in res["b"]]
    if isinstance(res.get("c"), list):
        lines += ["", "| norm | compiled | tokens/s | MFU | peak mem GiB |", "|---|---|---|---|---|"]
        for r in res["c"]:
            if "error" in r:
                lines.append(f"| {r['norm']} | {r['compiled']} | error: {r['error']} | | |")
                continue
            mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.3f} ({r.get('mfu_causal') or 0:.3f} causal)"
            mem = "" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}"
            lines.append(f"| {r['norm']} | {r['compiled']} | {r['tokens_per_s']:.0f} | {mfu} | {mem} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
