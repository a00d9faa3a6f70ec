"""Generate text from a minillm checkpoint (KV-cached).

    python -m minillm.tools.sample CKPT --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8 --top-k 40 --seed 0

Prints the prompt and its continuation. temperature 0 is greedy decoding.
"""

from __future__ import annotations

import argparse
import sys

import torch

from minillm.errors import ArgumentParser
from minillm.tools.hub import load_checkpoint


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def sample(ckpt: str, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8, top_k: int | None = None,
           seed: int = 0, device: str = "cpu", use_cache: bool = True) -> str:
    """The prompt and max_new_tokens generated after it, as text; ValueError for a bad checkpoint or prompt."""
    model, tok, _ = load_checkpoint(ckpt, device)
    try:
        ids = tok.encode(prompt)  # (T,)
    except ValueError as err:
        raise ValueError(f"prompt {prompt!r}: {err}") from None
    if len(ids) == 0:
        raise ValueError("the prompt is empty; give at least one character (e.g. --prompt $'\\n')")
    idx = torch.as_tensor(ids, dtype=torch.long, device=device)[None]  # (1, T)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(idx, max_new_tokens, temperature, top_k, gen, use_cache=use_cache)  # (1, T + N)
    return tok.decode(out[0].tolist())


def main(argv: list[str] | None = None) -> int:
    """Console script minillm-sample; exit code 2 with one line on stderr for a bad checkpoint or prompt."""
    parser = ArgumentParser(prog="minillm-sample", description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", help="Lightning checkpoint written by minillm (.ckpt)")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    parser.add_argument("--max-new-tokens", type=_non_negative_int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=_positive_int, default=None, help="sample among the k likeliest tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="e.g. cpu, cuda")
    parser.add_argument("--no-cache", action="store_true", help="recompute the context at each step (reference)")
    args = parser.parse_args(argv)
    try:
        text = sample(args.ckpt, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                      args.device, use_cache=not args.no_cache)
    except ValueError as err:  # CheckpointError is a ValueError
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
