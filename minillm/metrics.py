"""Every name minillm logs, defined once: the loggers, callbacks, LightningModule, report and studies import
them from here (docs/definitions.md says what each measures).

    train/...  the loss of each step, its lr and the tokens seen        (minillm.training.lit_module)
    val/..., test/...  loss (nats/token), ppl, bpc (char tokenizer), bpb (bits per UTF-8 byte)
    stab/...   the stability metrics                                     (minillm.training.callbacks.stability,
    divergence)
    perf/...   throughput, model FLOPs utilization, data wait            (minillm.training.callbacks.perf)
    layer/<i>/<name>, norm/<site>/<name>   per block and per norm module (layer_metric, norm_metric)
    hist/<site>/input, hist/<site>/gain    W&B histograms                (minillm.training.callbacks.histograms)

BEST_IS_LOW and BEST_IS_HIGH say which way each run-level summary of a metric goes (W&B keeps its min or max).
"""

from __future__ import annotations

TRAIN_LOSS, TRAIN_LR, TRAIN_TOKENS, TRAIN_LOSS_WITH_Z = "train/loss", "train/lr", "train/tokens", "train/loss_with_z"
EVAL_NAMES = ("loss", "ppl", "bpc", "bpb")  # what a validation or a test pass logs, as <stage>/<name>
VAL_LOSS, VAL_PPL, VAL_BPC, VAL_BPB = (f"val/{n}" for n in EVAL_NAMES)
TEST_LOSS, TEST_PPL, TEST_BPC, TEST_BPB = (f"test/{n}" for n in EVAL_NAMES)
GRAD_NORM, GRAD_NONFINITE = "stab/grad_norm", "stab/grad_nonfinite"
UPDATE_RATIO, OUTPUT_CHANGE = "stab/update_ratio", "stab/output_change"
MAX_ABS_H, MAX_ATTN_LOGIT = "stab/max_abs_h", "stab/max_attn_logit"
LOG_Z_MEAN, LOG_Z_MAX = "stab/log_z_mean", "stab/log_z_max"
LOSS_SPIKE_SCORE, LOSS_SPIKES = "stab/loss_spike_score", "stab/loss_spikes"
GRAD_NORM_SPIKE_SCORE, GRAD_NORM_SPIKES = "stab/grad_norm_spike_score", "stab/grad_norm_spikes"
AMP_SCALE, AMP_SKIPPED_STEPS = "stab/amp_scale", "stab/amp_skipped_steps"
DIVERGED = "stab/diverged"
TOKENS_PER_S, TOKENS_PER_S_DEVICE = "perf/tokens_per_s", "perf/tokens_per_s_device"
FLOPS_PER_S_DEVICE, MFU, DATA_WAIT_FRAC = "perf/flops_per_s_device", "perf/mfu", "perf/data_wait_frac"

BEST_IS_LOW = (VAL_LOSS, VAL_BPC, VAL_BPB, TEST_LOSS, TEST_BPC, TEST_BPB)
BEST_IS_HIGH = (GRAD_NORM, MAX_ABS_H, MAX_ATTN_LOGIT, LOG_Z_MAX, UPDATE_RATIO, OUTPUT_CHANGE,
                LOSS_SPIKE_SCORE, GRAD_NORM_SPIKE_SCORE)  # the worst a run reached
PER_SITE = ("layer", "norm")  # the kinds of per-block and per-norm-site names


def tokens_seen(steps: int, batch_tokens: int, world_size: int = 1, accumulate: int = 1) -> int:
    """``train/tokens`` after ``steps`` optimizer steps: every process's micro-batches of ``batch_tokens`` tokens
    (the one count: the LightningModule logs it, summary.json reports it)."""
    return steps * batch_tokens * world_size * accumulate


def eval_metric(stage: str, name: str) -> str:
    """``<stage>/<name>`` for stage val or test and a name of EVAL_NAMES."""
    return f"{stage}/{name}"


def layer_metric(i: int, name: str) -> str:
    """``layer/<i>/<name>``: grad_norm, update_ratio, weight_norm, resid_rms, resid_max, resid_median, attn_logit_max,
    attn_entropy_min, attn_entropy_mean."""
    return f"layer/{i}/{name}"


def norm_metric(site: str, name: str) -> str:
    """``norm/<site>/<name>``: in_rms, in_max_fp16, outlier_ratio, kurtosis, saturation, gain_mean, gain_std, alpha,
    bn_mean_dist, bn_var_dist, bn_mean_z, bn_var_z."""
    return f"norm/{site}/{name}"


def hist_metric(site: str, what: str) -> str:
    """``hist/<site>/<what>``: the W&B histogram of a norm site's input or gain."""
    return f"hist/{site}/{what}"


def parse_metric(key: str) -> tuple[str, str, str] | None:
    """``layer/<i>/<name>`` -> ("layer", "<i>", name), ``norm/<site>/<name>`` -> ("norm", "<site>", name)."""
    kind, _, rest = key.partition("/")
    inner, _, name = rest.rpartition("/")
    return (kind, inner, name) if kind in PER_SITE and inner and name and "/" not in inner else None
