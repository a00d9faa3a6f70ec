"""An independent reference: a LLaMA-style character model and a nanoGPT-style training loop in one file.

It imports nothing from minillm (only torch and the standard library) and shares no code with it: its own
vocabulary (sorted characters of the text), its own train/val split (the last `--val-fraction` of the
characters), its own random windows (torch.randint, as nanoGPT's get_batch), its own model (RMSNorm, RoPE,
causal attention through SDPA, SwiGLU, no biases, untied output), init, AdamW groups, warmup + cosine
schedule, clipping and evaluation. What it shares with `train.py`'s defaults is the recipe: the sizes, the
optimizer's numbers and the budget, written out below as command-line defaults.

The number it reports is the loss on the whole val split in consecutive windows of `--seq` characters, each
character a target once: the quantity train.py calls test/loss. experiments/benchmarks/calibration/independent.py runs
it beside train.py; alone:

    python -m experiments.benchmarks.calibration.nanogpt_loop --text input.txt --out result.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x[..., i], x[..., i + d/2]) of each head by the position's angles."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, eps: float):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim, eps), RMSNorm(dim, eps)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(rotary(q, cos, sin), rotary(k, cos, sin), v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class CharLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, hidden: int, context: int, eps: float,
                 std: float, theta: float):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden, eps) for _ in range(layers))
        self.norm = RMSNorm(dim, eps)
        self.head = nn.Linear(dim, vocab, bias=False)
        half = dim // heads // 2
        angles = torch.outer(torch.arange(context).float(), theta ** (-torch.arange(half).float() / half))
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for name, p in self.named_parameters():  # GPT-2's init: N(0, std); residual outputs / sqrt(2 * layers)
            if p.ndim == 2:
                scaled = name.endswith(("proj.weight", "down.weight"))
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * layers) if scaled else std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        return self.head(self.norm(x))


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warmup over `warmup` steps, then cosine from lr to min_lr_ratio * lr at the last step."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def mean_loss(model: nn.Module, data: torch.Tensor, starts: torch.Tensor, seq: int, batch: int) -> float:
    """Token-weighted mean cross entropy of the windows data[s : s + seq] -> data[s + 1 : s + seq + 1]."""
    model.eval()
    total = 0.0
    offsets = torch.arange(seq)
    for chunk in starts.split(batch):
        x, y = data[chunk[:, None] + offsets], data[chunk[:, None] + offsets + 1]
        total += F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").item()
    model.train()
    return total / (len(starts) * seq)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", type=Path, required=True, help="the corpus as one UTF-8 text file")
    ap.add_argument("--out", type=Path, help="write the result as JSON here")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=352, help="SwiGLU width (LLaMA's 8/3 * dim, rounded up to 32)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=400)
    ap.add_argument("--eval-windows", type=int, default=256, help="random val windows of the periodic evaluation")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    text = args.text.read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    n_train = int(len(data) * (1 - args.val_fraction))
    train, val = data[:n_train], data[n_train:]
    model = CharLM(len(chars), args.dim, args.layers, args.heads, args.hidden, args.seq, 1e-5, 0.02, 10000.0)
    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and not n.startswith("embed")]
    rest = [p for n, p in model.named_parameters() if not (p.ndim == 2 and not n.startswith("embed"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    periodic = torch.randint(len(val) - args.seq, (args.eval_windows,))
    offsets = torch.arange(args.seq)
    curve, start = [], time.perf_counter()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        ix = torch.randint(len(train) - args.seq, (args.batch,))
        x, y = train[ix[:, None] + offsets], train[ix[:, None] + offsets + 1]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            val_loss = mean_loss(model, val, periodic, args.seq, 64)
            curve.append({"step": step + 1, "train_loss": loss.item(), "val_loss": val_loss})
            print(f"step {step + 1}/{args.steps} | train {loss.item():.4f} | val {val_loss:.4f} | "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    train_time = time.perf_counter() - start
    whole = torch.arange((len(val) - 1) // args.seq) * args.seq
    result = {"seed": args.seed, "vocab": len(chars), "chars": len(data), "train_chars": n_train,
              "n_params": sum(p.numel() for p in model.parameters()), "curve": curve,
              "test_loss": mean_loss(model, val, whole, args.seq, 256), "train_time_s": round(train_time, 1),
              "tokens_per_s": args.steps * args.batch * args.seq / train_time}
    print(f"whole val split: {result['test_loss']:.4f} nats/char", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
