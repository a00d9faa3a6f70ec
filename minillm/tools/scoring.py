"""Scoring text with a minillm model, for downstream evaluation: the log-likelihood of a continuation given a context,
of a whole text (rolling windows), and greedy generation until a stop string. minillm-eval --tasks and the
lm-evaluation-harness model (minillm.tools.harness) both score through ``Scorer``; this module needs neither lm_eval nor
Lightning.

Conventions (lm-evaluation-harness's): a context's trailing spaces move to the continuation; the continuation's
tokens are those of encode(context + continuation) after encode(context) (exact for char and byte tokenizers); an
empty context is the start of a document (the tokenizer's separator: the end-of-document token, or a blank line).
A sequence longer than the model's context (max_seq_len) is scored in windows of max_seq_len tokens from its end,
each token once, the last ones with the most context.

Multiple-choice task files (``minillm-eval --tasks FILE.jsonl``): one item per line,
``{"context": "...", "choices": ["...", "..."], "answer": <index of the right choice>}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minillm.analysis.stats import exact_ci


class Scorer:
    """Log-likelihoods and greedy continuations of a Transformer with its tokenizer."""

    def __init__(self, model: nn.Module, tokenizer: Any, batch_size: int = 16, device: str | torch.device = "cpu"):
        self.model, self.tok, self.batch_size = model.to(device).eval(), tokenizer, batch_size
        self.device, self.window = torch.device(device), model.cfg.max_seq_len
        try:
            self.prefix = [int(i) for i in tokenizer.separator]
        except Exception:  # a char vocabulary without a newline: the first token of a document is not scored
            self.prefix = []

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tok.encode(text)] if text else []

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids), as lm-evaluation-harness splits them."""
        spaces = len(context) - len(context.rstrip(" "))
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        if not context:
            return list(self.prefix), self.encode(continuation)
        whole, ctx = self.encode(context + continuation), self.encode(context)
        if whole[:len(ctx)] != ctx:  # a tokenizer that merges across the boundary: encode them apart
            return ctx, self.encode(continuation)
        return ctx, whole[len(ctx):]

    def _windows(self, ids: list[int], start: int) -> list[tuple[int, int]]:
        """(first, end) windows: input ids[first:end - 1] predicts ids[begin:end], begin = max(start, first + 1);
        made from the end, so they predict every id of ids[start:] once (position 0 has no context: never)."""
        out, end = [], len(ids)
        while end > max(start, 1):
            first = max(0, end - 1 - self.window)
            out.append((first, end))
            end = max(start, first + 1)
        return out

    @torch.no_grad()
    def token_logprobs(self, sequences: Sequence[tuple[list[int], int]]) -> list[tuple[list[float], list[bool]]]:
        """For each (ids, start): the log-probability of each of ids[start:] given what precedes it (at most
        max_seq_len tokens), and whether it is the argmax."""
        jobs = [(i, w) for i, (ids, start) in enumerate(sequences) for w in self._windows(ids, start)]
        found: dict[tuple[int, int], tuple[list[float], list[bool]]] = {}
        for b in range(0, len(jobs), self.batch_size):
            batch = jobs[b:b + self.batch_size]
            width = max(end - 1 - first for _, (first, end) in batch)
            x = torch.zeros(len(batch), width, dtype=torch.long)
            for row, (i, (first, end)) in enumerate(batch):
                x[row, :end - 1 - first] = torch.tensor(sequences[i][0][first:end - 1])
            logp = F.log_softmax(self.model(x.to(self.device)).float(), dim=-1).cpu()  # (B, T, V)
            for row, (i, (first, end)) in enumerate(batch):
                ids, start = sequences[i]
                begin = max(start, first + 1)
                targets = torch.tensor(ids[begin:end])
                rows = logp[row, begin - first - 1:end - first - 1]  # (end - begin, V)
                found[i, begin] = (rows.gather(1, targets[:, None])[:, 0].tolist(),
                                   (rows.argmax(-1) == targets).tolist())
        out = []
        for i in range(len(sequences)):
            parts = sorted((begin, v) for (j, begin), v in found.items() if j == i)
            out.append(([x for _, (v, _) in parts for x in v], [g for _, (_, gs) in parts for g in gs]))
        return out

    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        """Per (context, continuation): the sum of the continuation's log-probabilities, and whether greedy
        decoding gives it."""
        encoded = [self.encode_pair(c, x) for c, x in pairs]
        scored = self.token_logprobs([(ctx + cont, len(ctx)) for ctx, cont in encoded])
        return [(math.fsum(v), all(g)) for v, g in scored]

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        """Log-probability of each whole text after a document start."""
        scored = self.token_logprobs([(self.prefix + self.encode(t), len(self.prefix)) for t in texts])
        return [math.fsum(v) for v, _ in scored]

    @torch.no_grad()
    def generate_until(self, context: str, until: Sequence[str] = (), max_new_tokens: int = 256) -> str:
        """Greedy continuation of context, cut before the first stop string (and at the end-of-document token)."""
        ids = self.encode(context) or list(self.prefix)
        if not ids:
            raise ValueError("an empty context and a tokenizer with no document start: nothing to continue")
        out = self.model.generate(torch.tensor([ids], device=self.device), max_new_tokens, temperature=0)
        new = out[0, len(ids):].tolist()
        eos = getattr(self.tok, "eos_id", None)
        if eos is not None and eos in new:
            new = new[:new.index(eos)]
        text = self.tok.decode(new)
        cut = min((text.index(s) for s in until if s and s in text), default=len(text))
        return text[:cut]


# --- multiple-choice task files --------------------------------------------------------------------------------


def read_task(path: str | Path) -> list[dict[str, Any]]:
    """The items of a JSONL task file; ValueError naming the file and line for a malformed one."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--tasks {str(path)!r} does not exist")
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            ok = (isinstance(item.get("context"), str) and isinstance(item.get("choices"), list)
                  and len(item["choices"]) >= 2 and all(isinstance(c, str) and c for c in item["choices"])
                  and isinstance(item.get("answer"), int) and 0 <= item["answer"] < len(item["choices"]))
        except (json.JSONDecodeError, AttributeError):
            ok = False
        if not ok:
            raise ValueError(f"--tasks {str(path)!r} line {n} is not an item; allowed: one JSON object per line, "
                             '{"context": "...", "choices": ["...", "..."], "answer": <index of the right choice>}')
        items.append(item)
    if not items:
        raise ValueError(f"--tasks {str(path)!r} holds no item")
    return items


def multiple_choice(scorer: Scorer, items: Sequence[dict[str, Any]], alpha: float = 0.05) -> dict[str, Any]:
    """Accuracy (the choice of highest log-likelihood) with its exact binomial (Clopper-Pearson) interval, acc_norm
    (log-likelihood per UTF-8 byte of the choice) and the bits per byte of the right continuations (their nats
    summed / ln 2 / their UTF-8 bytes summed), which still moves when accuracy sits at chance."""
    pairs = [(item["context"], choice) for item in items for choice in item["choices"]]
    scores = iter(scorer.loglikelihood(pairs))
    right = right_norm = 0
    nats = nbytes = 0.0
    for item in items:
        ll = [next(scores)[0] for _ in item["choices"]]
        sizes = [len(c.encode("utf-8")) for c in item["choices"]]
        right += max(range(len(ll)), key=ll.__getitem__) == item["answer"]
        right_norm += max(range(len(ll)), key=lambda i: ll[i] / sizes[i]) == item["answer"]
        nats -= ll[item["answer"]]
        nbytes += sizes[item["answer"]]
    n = len(items)
    low, high = exact_ci(right, n, alpha) or (None, None)
    return {"n": n, "acc": right / n, "acc_low": low, "acc_high": high, "acc_norm": right_norm / n,
            "chance": sum(1 / len(i["choices"]) for i in items) / n, "bpb": nats / math.log(2) / nbytes}
