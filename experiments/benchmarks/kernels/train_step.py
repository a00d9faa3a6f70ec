"""The end-to-end train step of the kernel benchmark (``bench.py --mode train``): a ~125M LLaMA-style model with a 32K
vocabulary, its forward and loss compiled together (or eager), fused AdamW.

``--train-matrix full`` (the default): rmsnorm vs fused_rmsnorm (with and without the fused residual add) and
layernorm, compiled and eager, bf16-mixed and bf16-true, at ``--train-batch`` sequences, the plain loss.
``--train-matrix loss``: what the GPU step of the next run measures: compiled, bf16-mixed, the chunked loss
(minillm.training.loss) at three batch sizes for rmsnorm (tokens/s and peak memory: the batch that fills the device),
at two
for fused_rmsnorm, and the plain loss at the middle one (what the chunked loss buys).

The configurations of one batch size are timed in interleaved windows (window 1 of each, then window 2, ...), each
window synchronized only at its ends, so their ratios are paired per window (report.train_ratio). Imports only torch
and minillm's model and loss (the MFU count imports lightning, and is left out where it does not)."""

from __future__ import annotations

import statistics
import time

from experiments.common.failure import failure

ADD_UNFUSED = "fused_rmsnorm, add unfused"  # the kernel for every norm, the Pre-LN residual adds as torch ops
WINDOWS = 4  # timed windows per configuration (the median is reported): --train-steps // 4 steps each, >= 1
MODEL_125M = dict(vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=12, max_seq_len=1024, placement="pre")
SMOKE_MODEL = dict(vocab_size=256, dim=64, n_layers=2, n_heads=2, n_kv_heads=2, max_seq_len=32, placement="pre")
LOSS_MATRIX = [(16, "rmsnorm", "chunked"), (32, "rmsnorm", "chunked"), (32, "fused_rmsnorm", "chunked"),
               (32, "rmsnorm", "plain"), (64, "rmsnorm", "chunked"), (64, "fused_rmsnorm", "chunked")]


def peak_flops(device: str) -> float | None:
    """bf16 dense peak of the GPU, from minillm's one table (None on the CPU)."""
    import torch

    from minillm.training.callbacks.perf import device_peak_flops

    return device_peak_flops(torch.device("cuda"), torch.bfloat16) if device == "cuda" else None


def matrix(args) -> list[list[dict]]:
    """The configurations to time, in groups timed together (interleaved), most valuable first (a time limit loses
    the last): each a dict of norm, compiled, precision, batch, loss_impl."""
    if args.train_matrix == "loss":
        scale = (lambda b: max(1, b // 16)) if args.smoke else (lambda b: b)
        groups: dict[int, list[dict]] = {}
        for batch, norm, loss in LOSS_MATRIX:
            groups.setdefault(scale(batch), []).append(dict(norm=norm, compiled=not args.no_compile,
                                                            precision="bf16-mixed", batch=scale(batch),
                                                            loss_impl=loss))
        return [groups[b] for b in sorted(groups, key=lambda b: (b != scale(32), -b))]  # the comparisons' batch
        # first, then the larger: a time limit loses the smallest batch, rmsnorm alone
    batch = 2 if args.smoke else args.train_batch
    compiles = (True, False) if not args.no_compile else (False,)
    return [[dict(norm=norm, compiled=compiled, precision=precision, batch=batch, loss_impl="plain")
             for norm in ("fused_rmsnorm", ADD_UNFUSED, "rmsnorm", "layernorm") if compiled or norm != ADD_UNFUSED]
            for compiled in compiles for precision in ("bf16-mixed", "bf16-true")]


def bench_train(args, device: str, save) -> None:
    import torch

    kw = SMOKE_MODEL if args.smoke else MODEL_125M
    steps, warmup = (2, 1) if args.smoke else (args.train_steps, 5)
    peak = peak_flops(device)
    for group in matrix(args):
        try:
            rows = train_group(device, kw, group, steps, warmup, peak)
        except Exception as e:  # a compile failure or an OOM must not lose the other groups
            rows = [{**c, **failure(e)} for c in group]
        save("train_step", rows)
        for row in rows:
            timed = (f"{row['step_ms']:8.2f} ms/step {row['tokens_per_s']:10.0f} tok/s MFU {row.get('mfu')} "
                     f"peak {row.get('peak_mem_GiB')} GiB") if "error" not in row else row["error"]
            print(f"train {row['norm']:>14} compiled={row['compiled']!s:5} {row['precision']:10} "
                  f"batch {row['batch']:>3} {row['loss_impl']:>7} loss: {timed}", flush=True)
        torch._dynamo.reset()
        if device == "cuda":
            torch.cuda.empty_cache()


def _config(kw: dict, c: dict):
    from minillm.model import ModelConfig

    return ModelConfig(norm="fused_rmsnorm" if c["norm"] == ADD_UNFUSED else c["norm"], **kw)


def _stepper(device: str, kw: dict, c: dict, batch: int):
    """(one train step, the model) of a configuration: forward and loss (compiled together when c["compiled"]),
    backward, fused AdamW on a GPU."""
    import torch

    from minillm.model import Transformer
    from minillm.training.loss import linear_cross_entropy

    torch.manual_seed(0)
    model = Transformer(_config(kw, c)).to(device, dtype=torch.bfloat16 if c["precision"] == "bf16-true" else None)
    for block in model.layers:
        block.fused_add = block.fused_add and c["norm"] != ADD_UNFUSED
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=device == "cuda")
    mixed = c["precision"] == "bf16-mixed"

    def loss_of(inp, tgt):
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=mixed):
            return linear_cross_entropy(model.hidden(inp), model.lm_head.weight, tgt, c["loss_impl"])[0]

    forward = torch.compile(loss_of) if c["compiled"] else loss_of
    # drawn on the CPU: a graph capture that failed earlier in the process (--mode all) leaves CUDA's default
    # generator unusable
    idx = torch.randint(kw["vocab_size"], (batch, kw["max_seq_len"] + 1),
                        generator=torch.Generator().manual_seed(0)).to(device)
    inp, tgt = idx[:, :-1], idx[:, 1:]

    def step():
        loss = forward(inp, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step, model


def train_group(device: str, kw: dict, group: list[dict], steps: int, warmup: int, peak: float | None) -> list[dict]:
    """Train-step time of the configurations of one batch size, timed in WINDOWS interleaved windows of steps //
    WINDOWS steps each, the device synchronized only at a window's ends (as in training, the host queues the next
    step's kernels while the GPU runs); the median window per configuration, with every window kept. Peak memory:
    the largest during a configuration's own windows (the other configurations' weights and optimizer states
    resident too)."""
    import torch

    T = kw["max_seq_len"]

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    runs, rows = [], []
    for c in group:
        try:
            step, model = _stepper(device, kw, c, c["batch"])
            for _ in range(warmup):  # compilation, autotuning, allocator warm-up
                step()
            runs.append((c, step, model, [], []))
        except Exception as e:  # this configuration fails (an OOM at a batch size): the others are still timed
            rows.append({**c, **failure(e)})
    per_window = max(1, steps // WINDOWS)
    for _ in range(WINDOWS):
        for c, step, _model, times, peaks in runs:
            sync()
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            for _ in range(per_window):
                loss = step()
            sync()
            times.append((time.perf_counter() - t0) * 1e3 / per_window)
            peaks.append(torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None)
            c["loss"] = loss.item()  # after the window's end: outside the timing
    try:
        from minillm.training.callbacks.perf import analytic_flops_per_token  # imports lightning
    except Exception:
        analytic_flops_per_token = None
    for c, _step, model, times, peaks in runs:
        ms = statistics.median(times)
        tok_s = c["batch"] * T / (ms * 1e-3)
        cfg = _config(kw, c)
        flops = analytic_flops_per_token(cfg, T) * tok_s if analytic_flops_per_token else None
        causal = analytic_flops_per_token(cfg, T, causal=True) * tok_s if analytic_flops_per_token else None
        rows.append({**c, "params_M": model.num_params() / 1e6, "seq_len": T, "step_ms": ms, "window_ms": times,
                     "interleaved": len(runs) > 1, "tokens_per_s": tok_s, "flops_per_s": flops, "peak_flops": peak,
                     "mfu": flops / peak if flops and peak else None,
                     "mfu_causal": causal / peak if causal and peak else None,
                     "peak_mem_GiB": max(peaks) if peaks and peaks[0] is not None else None})
    return rows
