"""What a run leaves, defined once: every field of summary.json with its type and a one-line meaning.

RunSummary writes these fields (a test checks a real run's summary.json against them), the report's table and the
comparison engine read them, and docs/definitions.md's field table is this module's ``markdown()`` (a test compares
them). Adding a run-level number is one line in FIELDS, the code that computes it, and, to show it in the sweep
report, one line in minillm.analysis.report's COLUMNS.

    python -m minillm.schema        # the field table, as docs/definitions.md holds it
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # JSON type; "|null" when the field can be null
    meaning: str
    group: str  # config (what the run was asked to do) | result (what happened) | provenance (where it ran)


def _fields(group: str, rows: str) -> tuple[Field, ...]:
    """Fields from lines of ``name  type  meaning`` (two spaces or more between the columns)."""
    out = []
    for line in rows.strip().splitlines():
        name, kind, meaning = (part.strip() for part in line.split("  ", 2))
        out.append(Field(name, kind.strip(), meaning.strip(), group))
    return tuple(out)


CONFIG = _fields("config", """
name  string|null  the run's name (train.py's name=: its log folder and W&B group)
norm  string  the norm, by its registry name (minillm.norms.NORMS)
placement  string  where the norm sits (minillm.placements, or mix)
lr  number  the peak learning rate (optimizer=muon: Muon's; AdamW's is adamw_lr)
warmup_steps  integer|null  the schedule's warmup steps
precision  string  trainer.precision as asked
tags  list  the run's tags (labels, never a stratum)
seed  integer  the seed of the model's init and the data order
precision_used  string  the precision the trainer ran (a plugin can change what was asked)
deterministic  boolean  torch's deterministic mode as the run trained (trainer.deterministic=auto resolved)
dim  integer  the model width
n_layers  integer  the number of decoder layers
n_heads  integer  attention heads
n_kv_heads  integer  key/value heads (grouped-query attention)
qk_norm  string  the QK-norm (none, rmsnorm, layernorm, l2; its axis and gains are in settings.model)
parametrization  string  standard or mup (model.parametrization)
mup_base_width  integer|null  muP's base width, the width its lrs and init are relative to
init  string  the init scheme (model.init)
vocab_size  integer  the vocabulary size V
max_seq_len  integer  the context length
norm_eps  number  the norms' epsilon
tie_embeddings  boolean  the LM head shares the token embedding
norm_options  object  the norm's options (model.norm_options)
attn_norm_options  object  the attention sublayer's norm options, only when set
weight_decay  number|null  AdamW's weight decay
z_loss  number|null  the z-loss coefficient
optimizer  string|null  the optimizer's class
adamw_lr  number|null  optimizer=muon: AdamW's lr for the parameters Muon does not take
grad_clip  number|null  the gradient clipping threshold (null: none)
max_steps  integer  trainer.max_steps
batch_size  integer|null  sequences per step (per process)
seq_len  integer|null  tokens per sequence
n_params  integer  the model's parameters
norm_impl  object|null  each norm's implementation as it ran ({norm: reference | torch | compiled | triton})
loss_init  number  ln V, the loss of a uniform guess: the ceiling every failed run is counted at
unigram_loss  number|null  the validated targets' cross entropy under the train split's token frequencies
parent  object  a decay branch: the run folder, checkpoint and step it branched from (only in a branch)
settings  object|null  every setting a user can sweep, nested as the config (optimizer, scheduler, data, model, ...)
""")

RESULTS = _fields("result", """
status  string  completed | diverged | not_trained | failed | preempted (stopped by a signal, to be resumed)
error  string|null  the exception of a failed run
steps  integer  optimizer steps taken
final_val_loss  number|null  the last validation's loss (nats per token)
best_val_loss  number|null  the lowest validation loss
best_val_step  integer|null  its step (0-based, as metrics.csv's step column)
test_loss  number|null  the held-out test pass's loss over the whole held-out split
test_weights  string|null  the weights the test pass evaluated (a checkpoint, or final)
diverged  boolean  minillm.outcome's rule: the guard stopped it, or the final val loss is not finite or back at ln V
diverged_step  integer|null  the step it diverged at
diverged_reason  string|null  why it counts as diverged
stopped_early  boolean  the divergence guard stopped the run
failed  boolean|null  diverged, not trained, crashed, never validated, or final val loss >= unigram (null: preempted)
max_grad_norm  number|null  the largest global gradient norm of any step
nonfinite_grad_steps  integer|null  steps with a non-finite gradient
spike_count  integer|null  loss spikes (SpikeDetector)
grad_spike_count  integer|null  gradient-norm spikes
max_attn_logit  number|null  the largest attention logit measured
max_abs_h  number|null  the largest |h| in the residual stream measured
max_log_z  number|null  the largest log Z of the output softmax measured
max_update_ratio  number|null  the largest update/weight norm ratio of a layer's matrices at a measured step
skipped_steps  integer|null  steps the GradScaler skipped
amp_scale  number|null  the GradScaler's last scale
spike_files  list|null  the spike records written (forensics)
tokens  integer  tokens trained on, from step 0 (a decay branch's include its parent's)
train_time_s  number  seconds training (validation excluded), every segment of the run
tokens_per_s  number|null  tokens per second of the steps this run trained
steady_tokens_per_s  number|null  the same over the second half of max_steps (a compile and warm-up left out)
wall_time_s  number  seconds from the start to this write, every segment
run_dir  string  the run folder as the run saw it (a reader takes the folder the summary is in)
callback_errors  object|null  observing callbacks that failed and were turned off ({class: "hook: error"})
started_at  string  UTC, ISO 8601: when the run's first segment began
written_at  string  UTC, ISO 8601: this write
""")

PROVENANCE = _fields("provenance", """
minillm_version  string  minillm's version
git_commit  string|null  the commit of the checkout it ran from
git_dirty  boolean|null  uncommitted changes in that checkout
torch_version  string  torch's version
cpu_capability  string  the CPU kernels torch ran (AVX2, AVX512, ...): they round differently
""")

FIELDS: dict[str, Field] = {f.name: f for f in (*CONFIG, *RESULTS, *PROVENANCE)}
OPTIONAL = ("attn_norm_options", "parent")  # written only when they apply

# the fields that several modules read or write, each spelt once (code uses these names, never the strings)
FINAL_VAL_LOSS, BEST_VAL_LOSS, BEST_VAL_STEP = "final_val_loss", "best_val_loss", "best_val_step"
TEST_LOSS = "test_loss"
LOSS_INIT, UNIGRAM_LOSS, STATUS, DIVERGED, FAILED = "loss_init", "unigram_loss", "status", "diverged", "failed"
DIVERGED_STEP, STOPPED_EARLY, SPIKE_COUNT, GRAD_SPIKE_COUNT = "diverged_step", "stopped_early", "spike_count", \
    "grad_spike_count"
MAX_GRAD_NORM, TOKENS_PER_S = "max_grad_norm", "tokens_per_s"
LOSSES = (FINAL_VAL_LOSS, BEST_VAL_LOSS, TEST_LOSS)  # losses in nats, with ln V as their ceiling
SPELT_ONCE = (FINAL_VAL_LOSS, BEST_VAL_LOSS, BEST_VAL_STEP, TEST_LOSS, LOSS_INIT, UNIGRAM_LOSS, DIVERGED_STEP,
              STOPPED_EARLY, SPIKE_COUNT, GRAD_SPIKE_COUNT, MAX_GRAD_NORM, TOKENS_PER_S)
assert all(name in FIELDS for name in SPELT_ONCE)
REQUIRED = ("lr", "seed")  # a summary without them describes no run a sweep can place


def _of_type(value: object, kind: str) -> bool:
    """Whether a JSON value has a FIELDS type ("number", "integer|null", ...): booleans are not numbers, and an
    integer may be written as a whole float (8.0). Null passes (an unknown value; a reader treats it as missing)."""
    if value is None:
        return True
    base = kind.split("|")[0]
    if base in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return base == "number" or isinstance(value, int) or float(value).is_integer()
    return isinstance(value, {"string": str, "boolean": bool, "object": dict, "list": list}[base])


def problems(summary: dict) -> list[str]:
    """What makes a summary.json not a run's: a REQUIRED field missing (or null), or a field of FIELDS holding a
    value of another type (a loss of "abc"); fields FIELDS does not name are not checked. Empty for a readable
    summary."""
    found = [f"no {name}" for name in REQUIRED if summary.get(name) is None]
    found += [f"{name} is {value!r}, not {FIELDS[name].type.replace('|', ' or ')}" for name, value in summary.items()
              if name in FIELDS and not _of_type(value, FIELDS[name].type)]
    return found


def markdown() -> str:
    """The table of every field, as docs/definitions.md holds it."""
    lines = ["| field | type | meaning |", "|---|---|---|"]
    lines += [f"| `{f.name}` | {f.type} | {f.meaning} |" for f in FIELDS.values()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
