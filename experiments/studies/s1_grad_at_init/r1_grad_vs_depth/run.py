"""S1: gradients at initialization by depth, Pre-LN vs Post-LN (Xiong et al. 2020, Theorem 1).

No training step: build the model, run forward + backward on real Shakespeare batches, record
  - g_last  = ||dL/dW|| (Frobenius) of the LAST layer's ffn.w2 (Xiong et al.'s W^{2,L}); also of all three
              FFN matrices of the last layer (w1, w2, w3 together) as a second metric
  - per-layer ||dL/d ffn.w2|| for every layer (the shape of Xiong et al.'s Fig. 3)
over placement {pre, post} x init {depth_scaled (minillm default, model.init=gpt2), unscaled (gpt2 with
depth_scaled_init=False), xavier (model.init=xavier: the paper's setting)} x d {128, 256} x L {2, 4, 8, 16, 24}
x seeds x batches. Norm: layernorm (as in the paper).
Fits the slope of log(g_last) vs log(L) (mean over seeds and batches) and decides with the thresholds below.

    .venv/bin/python -m experiments.studies.s1_grad_at_init.r1_grad_vs_depth.run            # ~3-6 min on 2 CPU cores
    # seconds: the PNGs from results.json
    .venv/bin/python -m experiments.studies.s1_grad_at_init.r1_grad_vs_depth.run --replot
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from experiments.common.machine import machine
from experiments.common.plots import pyplot, save
from minillm.model import ModelConfig, Transformer
from minillm.training.data import TextDataModule

OUT = Path(__file__).parent
DIMS = (128, 256)
DEPTHS = (2, 4, 8, 16, 24)
PLACEMENTS = ("pre", "post")
INITS = {  # name -> ModelConfig fields
    "depth_scaled": dict(init="gpt2"),
    "unscaled": dict(init="gpt2", depth_scaled_init=False),
    "xavier": dict(init="xavier"),  # added in the second round, with the threshold below, before its runs
}
SEEDS = (0, 1, 2)
N_BATCHES = 2
BATCH, SEQ = 16, 64
# Verdict thresholds, fixed before the runs (Xiong et al.: Post ~ L^0, Pre ~ L^-0.5).
POST_FLAT = 0.15  # |slope| <= 0.15 counts as "independent of L"
PRE_RANGE = (-0.75, -0.25)  # slope in this range counts as "~ L^-0.5"
PER_LAYER_GROWS = (
    1.5  # Post-LN, deepest L: g(last layer) / g(first layer) >= 1.5 counts as "grows toward output"
)
PER_LAYER_FLAT = (0.5, 2.0)  # Pre-LN, deepest L: that ratio inside this range counts as "flat across layers"
# Xiong et al.'s precondition for warmup (their Sec. 3): at the deepest L, Post-LN's last-layer gradient is larger
# than Pre-LN's. Reported per init, next to the verdict (which counts the four checks above).
POST_OVER_PRE = 1.0


def batches(n: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    dm = TextDataModule(source="shakespeare", seq_len=SEQ, batch_size=BATCH, seed=1337)
    dm.prepare_data()
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    return [next(it) for _ in range(n)], dm.vocab_size


def grads_at_init(cfg: ModelConfig, data) -> dict:
    model = Transformer(cfg)
    out = {"g_last_w2": [], "g_last_ffn": [], "per_layer_w2": []}
    for x, y in data:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        last = model.layers[-1].ffn
        out["g_last_w2"].append(last.w2.weight.grad.norm().item())
        out["g_last_ffn"].append(
            torch.cat([w.weight.grad.flatten() for w in (last.w1, last.w2, last.w3)]).norm().item()
        )
        out["per_layer_w2"].append([b.ffn.w2.weight.grad.norm().item() for b in model.layers])
    return out


def slope(depths, values) -> float:
    return float(np.polyfit(np.log(depths), np.log(values), 1)[0])


def main() -> None:
    if "--replot" in sys.argv[1:]:
        return plot(json.loads((OUT / "results.json").read_text())["fits"])
    torch.set_num_threads(2)
    t0 = time.time()
    data, vocab = batches(N_BATCHES)
    rows = []
    for init, fields in INITS.items():
        for placement in PLACEMENTS:
            for d in DIMS:
                for L in DEPTHS:
                    for seed in SEEDS:
                        torch.manual_seed(seed)
                        cfg = ModelConfig(
                            vocab_size=vocab,
                            dim=d,
                            n_layers=L,
                            n_heads=4,
                            max_seq_len=SEQ,
                            norm="layernorm",
                            placement=placement,
                            **fields,
                        )
                        g = grads_at_init(cfg, data)
                        rows.append(dict(init=init, placement=placement, dim=d, n_layers=L, seed=seed, **g))
                print(f"{init:12s} {placement:4s} d={d}: done ({time.time() - t0:.0f}s)", flush=True)

    fits = []
    for init in INITS:
        for placement in PLACEMENTS:
            for d in DIMS:
                sel = [r for r in rows if (r["init"], r["placement"], r["dim"]) == (init, placement, d)]
                mean = {
                    m: [float(np.mean([v for r in sel if r["n_layers"] == L for v in r[m]])) for L in DEPTHS]
                    for m in ("g_last_w2", "g_last_ffn")
                }
                # per-seed-and-batch slopes give a spread for the fitted exponent
                per_draw = [
                    slope(
                        DEPTHS,
                        [
                            next(r for r in sel if r["n_layers"] == L and r["seed"] == s)["g_last_w2"][b]
                            for L in DEPTHS
                        ],
                    )
                    for s in SEEDS
                    for b in range(N_BATCHES)
                ]
                deep = [r for r in sel if r["n_layers"] == max(DEPTHS)]
                prof = np.mean([p for r in deep for p in r["per_layer_w2"]], axis=0)
                fits.append(
                    dict(
                        init=init,
                        placement=placement,
                        dim=d,
                        g_last_w2=mean["g_last_w2"],
                        g_last_ffn=mean["g_last_ffn"],
                        slope_w2=slope(DEPTHS, mean["g_last_w2"]),
                        slope_ffn=slope(DEPTHS, mean["g_last_ffn"]),
                        slope_w2_draws_min=min(per_draw),
                        slope_w2_draws_max=max(per_draw),
                        per_layer_w2_deepest=prof.tolist(),
                        last_over_first=float(prof[-1] / prof[0]),
                    )
                )

    def verdict(init: str) -> dict:
        f = {(x["placement"], x["dim"]): x for x in fits if x["init"] == init}
        post_flat = all(abs(f["post", d]["slope_w2"]) <= POST_FLAT for d in DIMS)
        pre_half = all(PRE_RANGE[0] <= f["pre", d]["slope_w2"] <= PRE_RANGE[1] for d in DIMS)
        post_grows = all(f["post", d]["last_over_first"] >= PER_LAYER_GROWS for d in DIMS)
        pre_flat = all(PER_LAYER_FLAT[0] <= f["pre", d]["last_over_first"] <= PER_LAYER_FLAT[1] for d in DIMS)
        n = sum((post_flat, pre_half, post_grows, pre_flat))
        post_over_pre = {d: f["post", d]["g_last_w2"][-1] / f["pre", d]["g_last_w2"][-1] for d in DIMS}
        return dict(
            post_over_pre_deepest=post_over_pre,
            post_larger_than_pre=all(r > POST_OVER_PRE for r in post_over_pre.values()),
            post_flat=post_flat,
            pre_minus_half=pre_half,
            post_per_layer_grows=post_grows,
            pre_per_layer_flat=pre_flat,
            verdict="confirmed" if n == 4 else "partly" if n else "not reproduced",
        )

    result = dict(
        study="S1 gradients at init",
        machine=machine(),
        torch=torch.__version__,
        seconds=round(time.time() - t0, 1),
        setup=dict(
            norm="layernorm",
            dims=DIMS,
            depths=DEPTHS,
            seeds=SEEDS,
            n_batches=N_BATCHES,
            batch=BATCH,
            seq_len=SEQ,
            n_heads=4,
            init_std=0.02,
            inits=INITS,
            data="Shakespeare train windows, data seed 1337",
        ),
        thresholds=dict(
            post_flat=POST_FLAT,
            pre_range=PRE_RANGE,
            per_layer_grows=PER_LAYER_GROWS,
            per_layer_flat=PER_LAYER_FLAT,
            post_over_pre=POST_OVER_PRE,
        ),
        verdicts={init: verdict(init) for init in INITS},
        fits=fits,
    )
    (OUT / "results.json").write_text(json.dumps(result, indent=1))
    (OUT / "raw.json").write_text(json.dumps(rows))
    plot(fits)
    for f in fits:
        print(
            f"{f['init']:12s} {f['placement']:4s} d={f['dim']}: slope w2 {f['slope_w2']:+.3f} "
            f"(draws {f['slope_w2_draws_min']:+.2f}..{f['slope_w2_draws_max']:+.2f}), "
            f"slope ffn {f['slope_ffn']:+.3f}, "
            f"L=24 last/first layer {f['last_over_first']:.2f}"
        )
    print(json.dumps(result["verdicts"], indent=1))


def plot(fits: list[dict]) -> None:
    plt = pyplot()
    inits = list(dict.fromkeys(f["init"] for f in fits))
    fig, axes = plt.subplots(1, len(inits), figsize=(5.5 * len(inits), 4.2), sharey=True)
    for ax, init in zip(axes, inits, strict=True):
        for f in (x for x in fits if x["init"] == init):
            style = "-" if f["placement"] == "pre" else "--"
            ax.loglog(
                DEPTHS,
                f["g_last_w2"],
                style,
                marker="o",
                label=f"{f['placement']}-LN d={f['dim']} (slope {f['slope_w2']:+.2f})",
            )
        ref = np.array(DEPTHS, dtype=float)
        ax.loglog(
            ref,
            0.8 * min(min(x["g_last_w2"]) for x in fits if x["init"] == init) * (ref / ref[0]) ** -0.5,
            ":",
            color="gray",
            label="L^-0.5 reference",
        )
        ax.set_title(f"init: {init}")
        ax.set_xlabel("number of layers L")
        ax.set_xticks(DEPTHS, [str(d) for d in DEPTHS])
        ax.legend(fontsize=7)
    axes[0].set_ylabel("||grad W2|| of the last layer at init")
    save(fig, OUT / "g_last_vs_depth.png")

    fig, axes = plt.subplots(1, len(inits), figsize=(5.5 * len(inits), 4.2), sharey=True)
    for ax, init in zip(axes, inits, strict=True):
        for f in (x for x in fits if x["init"] == init):
            style = "-" if f["placement"] == "pre" else "--"
            ax.semilogy(
                range(1, max(DEPTHS) + 1),
                f["per_layer_w2_deepest"],
                style,
                marker=".",
                label=f"{f['placement']}-LN d={f['dim']}",
            )
        ax.set_title(f"L={max(DEPTHS)}, per-layer ||grad W2||, init: {init}")
        ax.set_xlabel("layer (1 = next to the embedding)")
        ax.legend(fontsize=7)
    save(fig, OUT / "per_layer_grad.png")


if __name__ == "__main__":
    main()
