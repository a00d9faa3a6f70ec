"""The numbers the study headlines quote that no round's analysis writes, computed from the committed files.

Each round's finding.json says its finding in one sentence (the index of experiments/README.md is built from it).
Its numbers come from the round's result files (results.json / results.md, the engine's verdicts.json /
verdicts.md) or from here:
- every round's **scale**: parameters, tokens per parameter, seeds and steps, from its committed runs (runs.jsonl;
  S0, S1 and S6 keep no run records, so their models are built from the settings their scripts record);
- the few **re-analyses** the study READMEs label as such: a ratio, a count or a range over seeds that the round's
  own analysis does not print, each computed from that round's committed runs or results (an analysis must
  regenerate its committed results unchanged, so they live here, not in it).
tests/test_experiments.py checks that every number of a headline is one of these or in the round's result files.

    python -m experiments.studies.headlines                        # every round
    python -m experiments.studies.headlines s4_batchnorm/r3_powernorm_nogroup
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from experiments.common.layout import STUDIES, rounds, studies

Numbers = dict[str, list[float]]


def _runs(folder: Path) -> list[dict[str, Any]]:
    """A round's committed run records (runs.jsonl: each run's summary.json); none for a round not run yet."""
    path = folder / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _distinct(values: Sequence[float]) -> list[float]:
    """The distinct values, in order."""
    return sorted(set(values))


def _scale(params: Sequence[int], tokens: Sequence[int], seeds: int, steps: Sequence[int]) -> Numbers:
    """One round's scale: every model size, the tokens per parameter of every run, seeds and steps."""
    return {"parameters (M)": _distinct([p / 1e6 for p in params]),
            "tokens per parameter": _distinct([t / p for t, p in zip(tokens, params, strict=True)]),
            "seeds": [float(seeds)], "steps": sorted({float(s) for s in steps})}


VOCAB = 88  # Shakespeare's characters: the vocabulary every committed run records


@functools.cache
def _param_count(**fields: Any) -> int:
    """Parameters of minillm's Transformer with these ModelConfig fields (built on the meta device: shapes only)."""
    import torch

    from minillm.model import ModelConfig, Transformer

    with torch.device("meta"):
        return sum(p.numel() for p in Transformer(ModelConfig(vocab_size=VOCAB, **fields)).parameters())


def _s0_scale(folder: Path) -> Numbers:
    """S0's trained runs (the small-batch, mismatch and leak probes): the tiny model its results.json records."""
    results = json.loads((folder / "results.json").read_text())
    runs = [(r["norm"], r["batch"], results["bn"]["config"]["max_steps"], r["seed"]) for r in results["bn"]["runs"]]
    runs += [("batchnorm", r["batch"], r["steps"], r["seed"]) for r in results["leak"]["runs"]]
    tiny = results["bn"]["config"]
    params = [_param_count(dim=tiny["dim"], n_layers=tiny["n_layers"], n_heads=tiny["n_heads"],
                           max_seq_len=tiny["seq_len"], norm=norm) for norm, *_ in runs]
    return _scale(params, [steps * batch * tiny["seq_len"] for _, batch, steps, _ in runs],
                  len({seed for *_, seed in runs}), [steps for _, _, steps, _ in runs])


def _s1_scale(folder: Path) -> Numbers:
    """S1 measures gradients at initialization: model sizes and init seeds, no training."""
    setup = json.loads((folder / "results.json").read_text())["setup"]
    params = [_param_count(dim=d, n_layers=n, n_heads=setup["n_heads"], max_seq_len=setup["seq_len"],
                           norm=setup["norm"]) for d in setup["dims"] for n in setup["depths"]]
    return {"parameters (M)": _distinct([p / 1e6 for p in params]), "seeds": [float(len(setup["seeds"]))],
            "batches": [float(setup["n_batches"])]}


S6_MODEL = dict(dim=128, n_layers=4, n_heads=4, max_seq_len=64)  # the default model S6's quality runs trained
S6_BATCH = 32  # sequences of 64 characters per step: the default config's batch when they ran (S6's README)


def _s6_scale(folder: Path) -> Numbers:
    """S6's quality runs of rounds 1-2 (quality.json): the default model, shortened to 300 steps
    (r1_cost/quality.py)."""
    quality = json.loads((folder / "quality.json").read_text())
    params = [_param_count(**S6_MODEL, norm=r["norm"]) for r in quality["runs"]]
    steps = quality["max_steps"]
    return _scale(params, [steps * S6_BATCH * S6_MODEL["max_seq_len"]] * len(params), len(quality["seeds"]),
                  [steps])


def scale(folder: Path) -> Numbers:
    """A round's scale, from its committed runs."""
    special = {"s0_textbook_claims": _s0_scale, "s1_grad_at_init": _s1_scale, "s6_cost": _s6_scale}
    if folder.parent.name == "s6_cost" and not (folder / "quality.json").exists():  # from round 3: runs.jsonl
        special.pop("s6_cost")
    if folder.parent.name in special:
        return special[folder.parent.name](folder)
    if not (folder / "runs.jsonl").exists():  # pre-registered, not yet run: no numbers of its own
        return {}
    runs = _runs(folder)
    if not runs:
        return {}
    setting = {label: sorted({float(r[key]) for r in runs}) for label, key in (
        ("widths", "dim"), ("layers", "n_layers"), ("learning rates", "lr"), ("batch sizes", "batch_size"))}
    return {**_scale([r["n_params"] for r in runs], [r["tokens"] for r in runs], len({r["seed"] for r in runs}),
                     [r["steps"] for r in runs]), **setting}


# --- re-analyses: what a README quotes beyond its round's own analysis, each labelled there as a re-analysis ------


def _results(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text())


def _s0_table_ratio(folder: Path) -> Numbers:
    rows = {r["norm"]: r for r in _results(folder)["table"]["rows"]}
    key = "fwd_bwd_ms_2048x128"
    return {"RMSNorm / LayerNorm fwd+bwd at 2048x128": [rows["RMSNorm"][key] / rows["LayerNorm"][key]]}


def _lr_sensitivity_per_seed(runs: list[dict], **arm: Any) -> dict[int, float]:
    """seed -> the lr sensitivity of one arm's runs of that seed (minillm.analysis.report's measure, a round's own
    loss)."""
    from minillm.analysis.report import lr_sensitivity
    from minillm.outcome import loss_for_comparison

    mine = [r for r in runs if all(r[k] == v for k, v in arm.items())]
    return {seed: lr_sensitivity({r["lr"]: loss_for_comparison(r) for r in mine if r["seed"] == seed})
            for seed in sorted({r["seed"] for r in mine})}


def _with_qk(run: dict) -> bool:
    return run["qk_norm"] != "none"


def _logits_at(runs: list[dict], lr: float, qk: bool) -> list[float]:
    """The smallest and largest max attention logit of the runs at ``lr``, with QK-norm or without."""
    found = [r["max_attn_logit"] for r in runs if r["lr"] == lr and _with_qk(r) == qk]
    return [min(found), max(found)]


def _s3_r1(folder: Path) -> Numbers:
    runs = _runs(folder)
    ratios = []
    for norm in ("layernorm", "rmsnorm"):
        qk = _lr_sensitivity_per_seed(runs, norm=norm, qk_norm="layernorm", z_loss=0)
        none = _lr_sensitivity_per_seed(runs, norm=norm, qk_norm="none", z_loss=0)
        ratios += [qk[s] / none[s] for s in qk]
    low, high = min(r["lr"] for r in runs), max(r["lr"] for r in runs)
    checks = [c for c in _results(folder)["checks"] if c[0] == "QK-norm lowers LR sensitivity"]
    return {"lr sensitivity with / without QK-norm, per norm (its seed-mean curves)": [c[3] / c[2] for c in checks],
            "lr sensitivity with / without QK-norm, per norm and seed (z-loss 0)": ratios,
            f"max attention logit at lr {low:g}, with QK-norm (min, max)": _logits_at(runs, low, True),
            f"at lr {high:g}, with QK-norm": _logits_at(runs, high, True),
            f"at lr {low:g}, without": _logits_at(runs, low, False),
            f"at lr {high:g}, without": _logits_at(runs, high, False)}


def _s3_r3(folder: Path) -> Numbers:
    """At the round's highest lr: the seed pairs whose QK-norm entropy is the higher, the logits without QK-norm,
    and what QK-norm saves in loss (seed means)."""
    entropy, runs, norms = _results(folder)["entropy"], _runs(folder), ("layernorm", "rmsnorm")
    top = max(r["lr"] for r in runs)
    pairs = [(entropy[f"{n}/qk/{top:g}"][s], entropy[f"{n}/none/{top:g}"][s]) for n in norms
             for s in entropy[f"{n}/none/{top:g}"]]
    loss = {(n, qk): statistics.fmean(r["final_val_loss"] for r in runs
                                      if r["lr"] == top and r["norm"] == n and _with_qk(r) == qk)
            for n in norms for qk in (False, True)}
    return {f"seed pairs at lr {top:g} whose QK-norm min entropy is the higher": [float(sum(a > b for a, b in pairs))],
            "seed pairs": [float(len(pairs))],
            f"max attention logit without QK-norm at lr {top:g} (min, max)": _logits_at(runs, top, False),
            f"val loss at lr {top:g}, without - with QK-norm, per norm": [loss[n, False] - loss[n, True]
                                                                         for n in norms]}


def _s3_r5(folder: Path) -> Numbers:
    return {"slope of a best lr that falls as 1/width (decades per doubling)": [-math.log10(2)]}


def _s3_r6(folder: Path) -> Numbers:
    """How far the seed-mean loss rises from its best lr to the grid's top lr, per width, without and with QK-norm
    (the curve the README's figure draws)."""
    from minillm.outcome import loss_for_comparison

    runs, out = _runs(folder), {}
    for qk in ("none", "layernorm"):
        rises = []
        for width in sorted({r["dim"] for r in runs}):
            mine = [r for r in runs if r["dim"] == width and r["qk_norm"] == qk]
            mean = {lr: statistics.fmean(loss_for_comparison(r) for r in mine if r["lr"] == lr)
                    for lr in sorted({r["lr"] for r in mine})}
            rises.append(mean[max(mean)] - min(mean.values()))
        out[f"loss rise from the best lr to the top lr, seed means, per width, qk_norm={qk}"] = rises
    res = _results(folder)
    for qk in ("none", "layernorm"):  # results.md's seed means, as numbers a claim can name
        out[f"lr sensitivity, seed mean, per width, qk_norm={qk}"] = [
            statistics.fmean(res["sensitivity"][f"{w}/{qk}"].values()) for w in sorted({r["dim"] for r in runs})]
        out[f"best lr's slope, seed mean, qk_norm={qk}"] = [statistics.fmean(res["lr_slopes"][qk].values())]
    return out


def _s3_r7(folder: Path) -> Numbers:
    """The flattened form's max attention logit over the per-head one's, and the heads the runs split width into."""
    runs, logit = _runs(folder), _results(folder)["max_attn_logit"]
    return {"max attention logit, flattened / per head": [logit["flat"] / logit["head"]],
            "heads": sorted({float(r["n_heads"]) for r in runs}),
            "head dim": sorted({float(r["dim"] // r["n_heads"]) for r in runs})}


def _s4_r3(folder: Path) -> Numbers:
    runs = _runs(folder)

    def arm(r: dict) -> str:
        return r["norm"] + ("" if r["norm"] != "powernorm" else f" group_scaling={r['norm_options']['group_scaling']}")

    out: Numbers = {}
    for name in sorted({arm(r) for r in runs}):
        grad = [r["max_grad_norm"] for r in runs if arm(r) == name]
        out[f"max grad norm, {name} (min, max)"] = [min(grad), max(grad)]
    out["most steps with a non-finite gradient in a run"] = [float(max(r["nonfinite_grad_steps"] for r in runs))]
    out["runs with gradient clipping"] = [float(sum(r["grad_clip"] is not None for r in runs))]
    return out


def _s4_r4(folder: Path) -> Numbers:
    """Each cell's seed-mean val loss over its runs that did not diverge (results.md's table), and the options every
    PowerNorm run recorded: its statistics per position or pooled, its groups."""
    out: Numbers = {}
    for cell in _results(folder)["cells"]:
        finite = [v for v in cell["val"].values() if v is not None and math.isfinite(v)]
        out[f"seed-mean val loss of the runs not diverged, {cell['norm']} at batch {cell['batch']}"] = [
            statistics.fmean(finite)]
    powernorm = [r["norm_options"] for r in _runs(folder) if r["norm"] == "powernorm"]
    out["PowerNorm runs with per-position statistics"] = [float(sum(o["stats"] == "position" for o in powernorm))]
    out["PowerNorm runs"] = [float(len(powernorm))]
    out["group_scaling of the runs with it"] = sorted({float(o["group_scaling"]) for o in powernorm
                                                       if o["group_scaling"]})
    return out


def _s5_r3(folder: Path) -> Numbers:
    """S10 round 4's steps (the budget where Pre-LN's stream outgrew sqrt(L) in the same model) over this round's."""
    theirs = {r["steps"] for r in _runs(STUDIES / "s10_mixln" / "r4_lns_budget")}
    mine = {r["steps"] for r in _runs(folder)}
    return {"S10 round 4's steps / this round's": [max(theirs) / max(mine)]}


def _rates(counts: dict[str, tuple[int, int]]) -> Numbers:
    """Each arm's failures of n with minillm.analysis.stats' Clopper-Pearson interval (results.md writes it)."""
    from minillm.analysis.stats import exact_ci

    return {f"failed of n, {arm}, with its 95% interval": [float(k), float(n), *exact_ci(k, n)]
            for arm, (k, n) in counts.items()}


def _s7_r3(folder: Path) -> Numbers:
    """The stall counts results.json writes as text ("4/10 [0.12, 0.74]"), as numbers."""
    return _rates({f"warmup {row[0]}": tuple(int(x) for x in row[1].split(" ")[0].split("/"))
                   for row in _results(folder)["rows"]})


def _s7_r5(folder: Path) -> Numbers:
    return _rates({arm: tuple(kn) for arm, kn in _results(folder)["failed"].items()})


def _s7_r6(folder: Path) -> Numbers:
    """Each arm's failures per lr, as for round 5; the mean final val loss of each cell's runs that trained
    (results.md's table writes it as text); each scalar at lr 1e-2 against DeepNorm at 3e-3 on the same seeds, with
    minillm.analysis.stats' paired t interval (across lrs, chosen after the data: reported, not tested)."""
    from experiments.common.study import paired

    trained = _results(folder)["trained_loss"]
    out = {**_s7_r5(folder), **{f"mean final val loss of the runs that trained, {cell}": [statistics.fmean(v.values())]
                                for cell, v in trained.items() if v}}
    for scalar in ("rezero", "layerscale"):
        res = paired(trained[f"post+{scalar}@0.01"], trained["deepnorm@0.003"])
        out[f"post+{scalar} at lr 1e-2 - deepnorm at 3e-3, same seeds, mean and 95% CI"] = [
            res["diff"], res["ci_low"], res["ci_high"]]
    return out


def _s8_r4(folder: Path) -> Numbers:
    """The embedding scale's start, sqrt(width), on unit-scale (Xavier) embeddings: their RMS at init."""
    return {"embedding RMS at init with the embedding scale": sorted({math.sqrt(r["dim"]) for r in _runs(folder)})}


def _s9_r1(folder: Path) -> Numbers:
    """W per seed: each norm's best cell without warmup minus its best with warmup 40 (the cells W compares, by
    their seed means), with minillm.analysis.stats' paired t interval."""
    from experiments.common.study import by_seed, paired
    from minillm.outcome import loss_for_comparison

    runs, best = _runs(folder), {}
    for cell in _results(folder)["loss"]:  # each (norm, warmup)'s best lr on the seed means, as W reads it
        key = cell["norm"], cell["warmup"]
        if key not in best or cell["loss"] < best[key]["loss"]:
            best[key] = cell
    out = {}
    for norm in ("layernorm", "scalenorm"):
        without, with_warmup = ([r for r in runs if r["norm"] == norm and r["warmup_steps"] == w
                                 and r["lr"] == best[norm, w]["lr"]] for w in (0, 40))
        res = paired(by_seed(without, loss_for_comparison), by_seed(with_warmup, loss_for_comparison))
        out[f"{norm}: best without - with warmup, mean and 95% CI"] = [res["diff"], res["ci_low"], res["ci_high"]]
    return out


def _s11_r3(folder: Path) -> Numbers:
    alpha = json.loads((folder / "params.json").read_text())
    return {f"mean alpha with / without decay, per seed, lr {lr}": [
        alpha[f"dyt_lr{lr}_decay_seed{s}"] / alpha[f"dyt_lr{lr}_nodecay_seed{s}"] for s in range(5)]
        for lr in ("0.003", "0.01")}


def _s12_r1(folder: Path) -> Numbers:
    """The standard arm's seeds whose slope is negative, its seeds at the grid's low edge at width 128, and muP's best
    loss over standard's at the widths above the base."""
    res = _results(folder)
    slopes = res["lr_slopes"]["standard"].values()
    best = res["best_log10_lr"]
    lowest = math.log10(min(r["lr"] for r in _runs(folder)))
    return {"standard slope negative, seeds": [float(sum(v < 0 for v in slopes))],
            "standard seeds at the grid's lowest lr, width 128": [
                float(sum(v == lowest for k, v in best.items() if k.startswith("standard/128/")))],
            "muP - standard best loss on the grid, widths 64 and 128": [
                res["best_loss"][f"mup/{w}"] - res["best_loss"][f"standard/{w}"] for w in (64, 128)]}


def _s13_r1(folder: Path) -> Numbers:
    """nGPT's speed-up per judged seed: the 400 steps of the baseline over the first validated step of nGPT's own
    400-step run at or below the baseline's final loss (a lower bound: that run's schedule had not yet annealed)."""
    reached = _results(folder)["steps_to_target"]
    return {"nGPT's steps-to-target speed-up per seed (400 / step reached)": [400 / v for v in reached.values()]}


REANALYSES: dict[str, Callable[[Path], Numbers]] = {
    "s0_textbook_claims/r1_claims": _s0_table_ratio, "s3_lr_sensitivity/r1_grid": _s3_r1,
    "s3_lr_sensitivity/r3_attn_entropy": _s3_r3, "s3_lr_sensitivity/r5_width_low_lr": _s3_r5,
    "s3_lr_sensitivity/r6_qk_width": _s3_r6, "s3_lr_sensitivity/r7_qk_forms": _s3_r7,
    "s4_batchnorm/r3_powernorm_nogroup": _s4_r3, "s4_batchnorm/r4_powernorm_paper": _s4_r4,
    "s5_precision/r3_peri_recipe": _s5_r3, "s7_depth/r3_warmup": _s7_r3, "s7_depth/r5_residual_scalars": _s7_r5,
    "s7_depth/r6_scalars_budget": _s7_r6,
    "s8_dyt/r4_derf": _s8_r4,
    "s9_scalenorm/r1_grid": _s9_r1, "s11_gain_decay/r3_dyt_trained": _s11_r3, "s12_mup_transfer/r1_transfer": _s12_r1,
    "s13_ngpt/r1_budgets": _s13_r1}


def numbers(folder: Path) -> Numbers:
    """Every number this module gives a round: its scale and its re-analyses."""
    name = f"{folder.parent.name}/{folder.name}"
    return {**scale(folder), **(REANALYSES[name](folder) if name in REANALYSES else {})}


def _fmt(values: list[float]) -> str:
    return ", ".join(dict.fromkeys(f"{v:.3g}" for v in values))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("rounds", nargs="*", help="sNN_name/rK_name (default: every round)")
    args = p.parse_args(argv)
    folders = [STUDIES / r for r in args.rounds] or [r for s in studies() for r in rounds(s)]
    for folder in folders:
        said = "; ".join(f"{label} {_fmt(values)}" for label, values in numbers(folder).items())
        print(f"{folder.relative_to(STUDIES)}: {said}")


if __name__ == "__main__":
    main()
