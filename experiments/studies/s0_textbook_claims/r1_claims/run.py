"""Three textbook claims about the norms, measured (minillm's norm modules, real Shakespeare data).

dist   "BatchNorm standardizes each feature over the batch, LayerNorm each token over its features": histograms
       of the same activations after BatchNorm, LayerNorm and RMSNorm (the textbook's toy input
       x = randn(16, 8) * 5 + 10, and real hidden states of the default model), plus a trained default model's
       per-layer activation histograms (trained here for TRAIN_STEPS steps)
bn     the three reasons BatchNorm is rarely used in language models, each shown by tiny runs
       (small batch; train/inference mismatch; position statistics)
leak   reason (c), the stronger test: BatchNorm with statistics pooled over (batch, time) at batch 1, 2
       and 4, for LEAK_STEPS steps. Does the model learn to read the future through the statistics?
table  "BatchNorm and LayerNorm have 2H parameters, RMSNorm H, and RMSNorm costs ~25% less": parameters per norm
       (counted) and op cost forward / forward+backward, read from S6's
       experiments/studies/s6_cost/r1_cost/bench.json (run python -m experiments.studies.s6_cost.r1_cost.bench
       first; not measured twice)

Training uses the reference loop (experiments.common.reference) on the composed configs/ with the overrides below.

  # ~10-15 min on 2 shared CPU cores
  .venv/bin/python -m experiments.studies.s0_textbook_claims.r1_claims.run dist bn leak table
"""

# ruff: noqa: B023  (the closures in the timing/eval loops are called at once, inside the loop)
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from experiments.common.layout import STUDIES
from experiments.common.plots import pyplot, save
from experiments.common.reference import Loop, compose, evaluate, gather, model_config, tokens, train
from minillm.model import Transformer
from minillm.norms import build_norm
from minillm.training.data import eval_starts

OUT = Path(__file__).parent
TRAIN_STEPS = 200  # the "trained model" of dist: the default config (rmsnorm, pre) for 200 steps

# bn: tiny model, short runs (overrides of the default config); thresholds fixed before the runs
TINY = ("model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.max_seq_len=32", "data.val_windows=256")
TINY_STEPS = 400  # steps of a bn run; validation once, at the end
TINY_CONFIG = dict(overrides=TINY, max_steps=TINY_STEPS)  # as results.json records it
BN_SEEDS = (0, 1)
SMALL_B, LARGE_B = 4, 64
GAP_MIN = 0.05  # nats: a gap counts when it exceeds this AND 2x the seed spread
LEAK_MIN = 0.10  # nats: "train loss far below causal eval loss" when eval - train exceeds this
# leak: fixed before its runs. The model exploits the leak when, in training mode on held-out windows, the
# loss of the first half of each sequence rises by more than FUTURE_GAIN_MIN nats once the second half is
# swapped for another window's (exactly 0 for a causal model), in every seed.
# The 10,000-step runs were added after the 1,500-step ones showed a gain of only ~0.01 nats.
LEAK_STEPS, LEAK_BATCHES, FUTURE_GAIN_MIN = (1500, 10000), (1, 2, 4), 0.05


def tiny(norm: str, batch: int, seed: int, steps: int = TINY_STEPS, stats: str | None = None) -> tuple[str, ...]:
    """The overrides of a tiny run: validated once, at the end; BatchNorm's statistics ``stats``."""
    extra = (f"model.norm_options.stats={stats}",) if stats else ()
    return (*TINY, f"norm={norm}", f"data.batch_size={batch}", f"seed={seed}", f"trainer.max_steps={steps}",
            f"trainer.val_check_interval={steps}", *extra)


def apply_norms(h: torch.Tensor) -> dict[str, torch.Tensor]:
    """h (B, T, C) through fresh minillm norms (gain 1, bias 0); BatchNorm: train mode, per-position stats."""
    B, T, C = h.shape
    with torch.no_grad():
        return {
            "BatchNorm (per position, batch stats)": build_norm("batchnorm", C, max_seq_len=T)(h),
            "LayerNorm": build_norm("layernorm", C)(h),
            "RMSNorm": build_norm("rmsnorm", C)(h),
        }


def moments(t: torch.Tensor, dim) -> dict:
    return dict(mean_of_means=float(t.mean(dim).mean()), mean_of_stds=float(t.std(dim, correction=0).mean()))


def dist() -> dict:
    p = pyplot()
    res = {}
    # 1) the textbook's toy input: batch 16, 8 features, mean 10, std 5 -> as (B=16, T=1, C=8)
    torch.manual_seed(42)
    x = torch.randn(16, 8) * 5 + 10
    outs = apply_norms(x[:, None, :])
    panels = {"input x = randn(16, 8)*5 + 10": x, **{k: v[:, 0, :] for k, v in outs.items()}}
    res["toy"] = {k: dict(per_feature=moments(v, 0), per_sample=moments(v, 1)) for k, v in panels.items()}

    # 2) real hidden states: the residual stream entering the last block of the default model, trained briefly
    t0 = time.time()
    cfg = compose(f"trainer.max_steps={TRAIN_STEPS}", f"trainer.val_check_interval={TRAIN_STEPS}")
    r = train(cfg, log_every=100)
    model: Transformer = r["model"].eval()
    res["trained_model"] = dict(
        config="default (rmsnorm, pre, dim 128, 4 layers)",
        steps=TRAIN_STEPS,
        val_loss=r["final_val_loss"],
        seconds=round(time.time() - t0, 1),
    )
    _, val, _ = tokens(cfg)
    xb, _ = gather(val, np.arange(32) * 64, 64)  # 32 consecutive val windows
    torch.manual_seed(0)
    init_model = Transformer(model.cfg).eval()
    acts = {}
    for tag, m in (("init", init_model), ("trained", model)):
        store = []
        hooks = [
            b.register_forward_pre_hook(lambda mod, a: store.append(("in", a[0].detach()))) for b in m.layers
        ]
        hooks += [
            b.attn_norm.register_forward_hook(lambda mod, a, o: store.append(("normed", o.detach())))
            for b in m.layers
        ]
        hooks.append(m.norm.register_forward_pre_hook(lambda mod, a: store.append(("in", a[0].detach()))))
        with torch.no_grad():
            m(xb)
        for h in hooks:
            h.remove()
        acts[tag] = dict(
            resid=[t for k, t in store if k == "in"], normed=[t for k, t in store if k == "normed"]
        )
    h_last = acts["trained"]["resid"][-2]  # input of the last block, (32, 64, 128)
    real = {"hidden state (trained, input of last block)": h_last, **apply_norms(h_last)}
    res["real"] = {
        k: dict(
            per_feature_over_batch=moments(v.flatten(0, 1), 0),
            per_token=moments(v, -1),
            min=float(v.min()),
            max=float(v.max()),
        )
        for k, v in real.items()
    }

    fig, axes = p.subplots(2, 4, figsize=(16, 6.5))
    for ax, (k, v) in zip(axes[0], panels.items(), strict=True):
        ax.hist(v.flatten().numpy(), bins=30, color="gray" if k.startswith("input") else None, alpha=0.8)
        ax.set_title(k, fontsize=9)
    for ax, (k, v) in zip(axes[1], real.items(), strict=True):
        ax.hist(v.flatten().numpy(), bins=80, alpha=0.8, color="gray" if k.startswith("hidden") else None)
        ax.set_title(k, fontsize=9)
        ax.set_yscale("log")
    axes[0, 0].set_ylabel("toy input")
    axes[1, 0].set_ylabel("real hidden states (log count)")
    save(fig, OUT / "norm_histograms.png", dpi=100)

    # per-layer activations of the trained model (and at init, for contrast)
    L = len(model.layers)
    fig, axes = p.subplots(2, L + 1, figsize=(3.2 * (L + 1), 6), sharey="row")
    for j in range(L + 1):
        for tag, color in (("init", "tab:gray"), ("trained", "tab:blue")):
            axes[0, j].hist(
                acts[tag]["resid"][j].flatten().numpy(), bins=80, alpha=0.55, color=color, label=tag
            )
            if j < L:
                axes[1, j].hist(
                    acts[tag]["normed"][j].flatten().numpy(), bins=80, alpha=0.55, color=color, label=tag
                )
        axes[0, j].set_title("residual into " + (f"layer {j}" if j < L else "final norm"), fontsize=9)
        axes[0, j].set_yscale("log")
        axes[1, j].set_yscale("log")
        if j < L:
            axes[1, j].set_title(f"layer {j}: after attn_norm (RMSNorm)", fontsize=9)
    axes[1, L].axis("off")
    axes[0, 0].legend()
    save(fig, OUT / "per_layer_activations.png", dpi=100)
    res["per_layer"] = {
        tag: [
            dict(layer=j, resid_rms=float(h.pow(2).mean().sqrt()), resid_absmax=float(h.abs().max()))
            for j, h in enumerate(a["resid"])
        ]
        for tag, a in acts.items()
    }
    return res


def bn() -> dict:
    runs = []

    def run(norm: str, batch: int, seed: int, stats: str = "position") -> dict:
        cfg = compose(*tiny(norm, batch, seed, stats=stats if norm == "batchnorm" else None))
        loop = Loop.of(cfg)
        t = time.time()
        r = train(cfg)
        m = r["model"]
        _, val, _ = tokens(cfg)
        row = dict(
            norm=norm,
            stats=stats if norm == "batchnorm" else None,
            batch=batch,
            seed=seed,
            eval_loss=r["final_val_loss"],  # eval mode: running statistics (causal for every norm)
            train_loss_last50=float(np.mean(r["history"]["train_loss"][-50:])),
        )
        if norm == "batchnorm":
            for eb in (1, 2, 8, 32):  # inference with batch statistics at another batch size
                row[f"trainmode_eval_loss_b{eb}"] = evaluate(
                    copy.deepcopy(m), val, loop.seq_len, eb, 64 if eb < 8 else 256, train_mode=True
                )
            row["causal_probe_max_abs_logit_change"] = causal_probe(m, cfg)
        row["seconds"] = round(time.time() - t, 1)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        runs.append(row)
        return row

    for seed in BN_SEEDS:
        for batch in (SMALL_B, LARGE_B):
            for norm in ("layernorm", "batchnorm"):
                run(norm, batch, seed)
        run("batchnorm", SMALL_B, seed, stats="pooled")

    def sel(**kw):
        return [r for r in runs if all(r.get(k) == v for k, v in kw.items())]

    def mean(rows, key):
        return float(np.mean([r[key] for r in rows]))

    def spread(rows, key):
        return float(np.ptp([r[key] for r in rows]))

    out = {
        "runs": runs,
        "config": dict(
            TINY_CONFIG, seeds=BN_SEEDS, small_batch=SMALL_B, large_batch=LARGE_B, gap_min=GAP_MIN,
            leak_min=LEAK_MIN,
        ),
    }
    # reason 1: small batch. gap = BN(position, eval mode) - LN, per batch size
    gap = {}
    for b in (SMALL_B, LARGE_B):
        d = [
            bn_r["eval_loss"] - ln_r["eval_loss"]
            for bn_r, ln_r in zip(
                sel(norm="batchnorm", stats="position", batch=b), sel(norm="layernorm", batch=b), strict=True
            )
        ]
        gap[b] = dict(mean=float(np.mean(d)), per_seed=d)
    noise = max(spread(sel(norm="layernorm", batch=b), "eval_loss") for b in (SMALL_B, LARGE_B))
    widen = gap[SMALL_B]["mean"] - gap[LARGE_B]["mean"]
    out["small_batch"] = dict(
        gap_bn_minus_ln=gap,
        widening=widen,
        seed_spread_ln=noise,
        shown=bool(widen > max(GAP_MIN, 2 * noise) and gap[SMALL_B]["mean"] > GAP_MIN),
    )
    # reason 2: train/inference mismatch, for BN(position) runs
    mism = {}
    for b in (SMALL_B, LARGE_B):
        rows = sel(norm="batchnorm", stats="position", batch=b)
        mism[b] = {
            k: mean(rows, k)
            for k in (
                "eval_loss",
                "train_loss_last50",
                "trainmode_eval_loss_b1",
                "trainmode_eval_loss_b2",
                "trainmode_eval_loss_b8",
                "trainmode_eval_loss_b32",
            )
        }
    worst = max(abs(m["trainmode_eval_loss_b2"] - m["eval_loss"]) for m in mism.values())
    out["mismatch"] = dict(by_train_batch=mism, shown=bool(worst > GAP_MIN))
    # reason 3: position statistics
    pooled, pos = (
        sel(norm="batchnorm", stats="pooled"),
        sel(norm="batchnorm", stats="position", batch=SMALL_B),
    )
    ln4 = sel(norm="layernorm", batch=SMALL_B)
    out["positions"] = dict(
        pooled=dict(
            train_loss=mean(pooled, "train_loss_last50"),
            causal_eval_loss=mean(pooled, "eval_loss"),
            trainmode_eval_loss_b32=mean(pooled, "trainmode_eval_loss_b32"),
            probe=max(r["causal_probe_max_abs_logit_change"] for r in pooled),
        ),
        position=dict(
            train_loss=mean(pos, "train_loss_last50"),
            causal_eval_loss=mean(pos, "eval_loss"),
            trainmode_eval_loss_b32=mean(pos, "trainmode_eval_loss_b32"),
            probe=max(r["causal_probe_max_abs_logit_change"] for r in pos),
        ),
        layernorm=dict(train_loss=mean(ln4, "train_loss_last50"), causal_eval_loss=mean(ln4, "eval_loss")),
    )
    P = out["positions"]
    out["positions"]["shown"] = bool(
        P["pooled"]["causal_eval_loss"] - P["pooled"]["train_loss"] > LEAK_MIN
        and P["position"]["probe"] < 1e-5
        and P["pooled"]["probe"] > 1e-3
    )
    plot_bn(out)
    return out


def leak() -> dict:
    runs = []
    for steps in LEAK_STEPS:
        for seed in BN_SEEDS:
            for batch in LEAK_BATCHES:
                cfg = compose(*tiny("batchnorm", batch, seed, steps, stats="pooled"))
                t = time.time()
                r = train(cfg)
                _, val, _ = tokens(cfg)
                row = dict(steps=steps, batch=batch, seed=seed, eval_loss=r["final_val_loss"],
                           train_loss_last50=float(np.mean(r["history"]["train_loss"][-50:])),
                           future_gain=future_gain(r["model"], val, Loop.of(cfg).seq_len, batch),
                           seconds=round(time.time() - t, 1))
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
                runs.append(row)
    exploited = {f"{steps} steps, batch {b}": all(r["future_gain"] > FUTURE_GAIN_MIN for r in runs
                                                  if r["batch"] == b and r["steps"] == steps)
                 for steps in LEAK_STEPS for b in LEAK_BATCHES}
    return dict(runs=runs, exploited=exploited, config=dict(TINY_CONFIG, max_steps=LEAK_STEPS, seeds=BN_SEEDS,
                                                            batches=LEAK_BATCHES, future_gain_min=FUTURE_GAIN_MIN))


def future_gain(model: Transformer, val: np.ndarray, T: int, batch: int, windows: int = 256) -> float:
    """Training mode, batches of `batch` held-out windows (as in training): mean loss of the first T/2 positions
    with every window's second half swapped for the next window's, minus the same with the true second half.
    Zero for a causal model; > 0 when the model reads the future through the batch statistics."""
    m = copy.deepcopy(model).train()  # batch statistics; the copy's running statistics are thrown away
    x, y = gather(val, eval_starts(len(val), T, windows), T)
    h = T // 2
    swapped = torch.cat([x[:, :h], x.roll(1, dims=0)[:, h:]], dim=1)

    def first_half_loss(inp: torch.Tensor) -> float:
        with torch.no_grad():
            logits = torch.cat([m(inp[i : i + batch]) for i in range(0, len(inp), batch)])
        return float(F.cross_entropy(logits[:, :h].flatten(0, 1), y[:, :h].flatten()))

    return first_half_loss(swapped) - first_half_loss(x)


@torch.no_grad()
def causal_probe(model: Transformer, cfg) -> float:
    """Train mode (batch stats): change only the last half of every sequence; max |change| of the logits
    at the first half. Zero for a causal model."""
    m = copy.deepcopy(model).train()
    T = Loop.of(cfg).seq_len
    _, val, vocab = tokens(cfg)
    x, _ = gather(val, np.arange(8) * T, T)
    x2 = x.clone()
    x2[:, T // 2 :] = torch.randint(0, vocab, (8, T - T // 2), generator=torch.Generator().manual_seed(0))
    return float((m(x)[:, : T // 2] - copy.deepcopy(model).train()(x2)[:, : T // 2]).abs().max())


def plot_bn(out: dict) -> None:
    p = pyplot()
    fig, axes = p.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for norm, color in (("layernorm", "tab:green"), ("batchnorm", "tab:blue")):
        rows = [r for r in out["runs"] if r["norm"] == norm and r["stats"] in (None, "position")]
        for b, xpos in ((SMALL_B, 0), (LARGE_B, 1)):
            v = [r["eval_loss"] for r in rows if r["batch"] == b]
            ax.scatter(
                [xpos + (0.08 if norm == "batchnorm" else -0.08)] * len(v),
                v,
                color=color,
                label=norm if b == SMALL_B else None,
            )
    ax.set_xticks([0, 1], [f"batch {SMALL_B}", f"batch {LARGE_B}"])
    ax.set_ylabel("val loss (eval mode)")
    ax.set_title("1. small batch: BN (per-position stats) vs LN")
    ax.legend()
    ax = axes[1]
    labels = ["eval mode\n(running)", "train b=1", "train b=2", "train b=8", "train b=32"]
    keys = [
        "eval_loss",
        "trainmode_eval_loss_b1",
        "trainmode_eval_loss_b2",
        "trainmode_eval_loss_b8",
        "trainmode_eval_loss_b32",
    ]
    for b, off in ((SMALL_B, -0.15), (LARGE_B, 0.15)):
        m = out["mismatch"]["by_train_batch"][b]
        ax.bar(np.arange(len(keys)) + off, [m[k] for k in keys], width=0.3, label=f"trained at batch {b}")
    ax.set_xticks(range(len(keys)), labels, fontsize=8)
    ax.set_ylabel("val loss")
    ax.set_title("2. inference: running stats vs batch stats at batch size b")
    ax.legend()
    ax = axes[2]
    P = out["positions"]
    names = ["LayerNorm", "BN per-position", "BN pooled (B,T)"]
    tr = [P["layernorm"]["train_loss"], P["position"]["train_loss"], P["pooled"]["train_loss"]]
    ev = [
        P["layernorm"]["causal_eval_loss"],
        P["position"]["causal_eval_loss"],
        P["pooled"]["causal_eval_loss"],
    ]
    ax.bar(np.arange(3) - 0.15, tr, width=0.3, label="train loss (last 50 steps)")
    ax.bar(np.arange(3) + 0.15, ev, width=0.3, label="causal eval loss (running stats)")
    ax.set_xticks(range(3), names, fontsize=8)
    ax.set_title(f"3. position statistics (batch {SMALL_B})")
    ax.legend(fontsize=8)
    save(fig, OUT / "batchnorm_reasons.png", dpi=100)


def table() -> dict:
    bench = json.loads((STUDIES / "s6_cost" / "r1_cost" / "bench.json").read_text())
    C = 128
    names = {"batchnorm": "BatchNorm", "layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
    rows = []
    for k, label in names.items():
        mod = build_norm(k, C, max_seq_len=64) if k == "batchnorm" else build_norm(k, C)
        n_params = sum(p.numel() for p in mod.parameters())
        n_buffers = sum(b.numel() for n, b in mod.named_buffers() if b.dtype.is_floating_point)
        cost = {(r["dtype"], r["tokens"], r["hidden"]): r for r in bench["op_level"] if r["op"] == k}
        r = cost["fp32", 2048, 128]
        r_big = cost["fp32", 4096, 1024]
        rows.append(
            dict(
                norm=label,
                params=n_params,
                params_formula={"batchnorm": "2H", "layernorm": "2H", "rmsnorm": "H"}[k],
                float_buffers=n_buffers,
                fwd_ms_2048x128=r["fwd_ms"],
                fwd_bwd_ms_2048x128=r["fwd_bwd_ms"],
                fwd_vs_ln_4096x1024=r_big["fwd_vs_layernorm"],
                fwd_bwd_vs_ln_4096x1024=r_big["fwd_bwd_vs_layernorm"],
            )
        )
    per_model = {}
    for k in names:
        m = Transformer(model_config(compose(f"norm={k}"), 88))
        per_model[k] = sum(p.numel() for n, p in m.named_parameters() if "norm" in n)
    cfg = compose()
    return dict(
        hidden=C,
        rows=rows,
        norm_params_in_default_model=per_model,
        machine=bench["machine"],
        default_model=f"dim {cfg.model.dim}, {cfg.model.n_layers} layers",
    )


def main() -> None:
    torch.set_num_threads(1)  # 1, not 2: on the shared 2-core CPU 2 threads ran 6-8x slower (measured)
    parts = sys.argv[1:] or ["dist", "bn", "leak", "table"]
    path = OUT / "results.json"
    res = json.loads(path.read_text()) if path.exists() else {}
    for part in parts:
        t = time.time()
        res[part] = {"dist": dist, "bn": bn, "leak": leak, "table": table}[part]()
        res[part]["seconds"] = round(time.time() - t, 1)
        path.write_text(json.dumps(res, indent=1))
        print(f"{part}: done in {time.time() - t:.0f}s", flush=True)


if __name__ == "__main__":
    main()
