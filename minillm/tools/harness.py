"""minillm in lm-evaluation-harness: the model ``minillm`` of its registry (``lm_eval.api.registry.register_model``,
an ``lm_eval.api.model.LM``), for any minillm checkpoint (every norm and placement; an imported Hugging Face model
too), with log-likelihoods, rolling log-likelihoods and greedy generation (minillm.tools.scoring).

    minillm-lm-eval --model minillm --model_args checkpoint=CKPT --tasks hellaswag      # lm_eval's own command line
    python -m minillm.tools.harness --model minillm --model_args checkpoint=CKPT,batch_size=32 --tasks my_task \\
        --include_path my_tasks/

lm_eval's ``lm_eval`` command finds only the models of its own package (no plugin entry point for models), so
``minillm-lm-eval`` is that command with this module imported first; in Python, ``import minillm.tools.harness`` then
``lm_eval.simple_evaluate(model="minillm", model_args="checkpoint=...")``. Needs ``pip install "minillm[eval]"``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from minillm import _compat
from minillm.errors import ConfigError, parse_in_one_line
from minillm.tools.hub import load_checkpoint, read_checkpoint
from minillm.tools.scoring import Scorer


@register_model("minillm")
class MinillmLM(LM):
    """``--model_args checkpoint=<.ckpt>[,device=cpu][,batch_size=16][,max_gen_toks=256]`` (cuda without a GPU:
    the CPU)."""

    def __init__(self, checkpoint: str, device: str = "cpu", batch_size: int | str = 16, max_gen_toks: int = 256,
                 **unused: Any) -> None:
        super().__init__()
        if str(device).startswith("cuda") and not torch.cuda.is_available():  # lm_eval's default is cuda
            device = "cpu"
        model, tokenizer, self.meta = load_checkpoint(checkpoint, device=device)
        size = int(batch_size) if str(batch_size).isdigit() else 16  # lm_eval's "auto": a fixed size here
        self.scorer, self.max_gen_toks = Scorer(model, tokenizer, size, device), int(max_gen_toks)
        self._device = device

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> MinillmLM:
        """--model_args, with lm_eval's --batch_size and --device where --model_args does not set them."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k in ("batch_size", "device")}
        return cls(**{**extra, **arg_dict})

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> MinillmLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @property
    def tokenizer_name(self) -> str:
        return f"minillm-{getattr(self.scorer.tok, 'kind', 'tokenizer')}-{self.scorer.tok.vocab_size}"

    def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = self.scorer.loglikelihood([tuple(r.args[:2]) for r in requests])
        for r, res in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", r.args, res)
        return out

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        return self.scorer.loglikelihood_rolling([r.args[0] for r in requests])

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        out = []
        for r in requests:
            context, kwargs = r.args[0], dict(r.args[1] or {})
            if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0) > 0:
                raise ValueError("the minillm model generates greedily: do_sample=true / temperature > 0 is not "
                                 "supported (use --gen_kwargs do_sample=false)")
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            text = self.scorer.generate_until(context, until, int(kwargs.get("max_gen_toks", self.max_gen_toks)))
            self.cache_hook.add_partial("generate_until", r.args, text)
            out.append(text)
        return out


def main(argv: list[str] | None = None) -> int:
    """lm_eval's command line with the model ``minillm`` registered; a bad flag, checkpoint or task is one line,
    ``minillm-lm-eval: error: ...``, exit code 2 (lm_eval reports its own input errors as ValueError)."""
    from lm_eval.utils import setup_logging

    sys.argv = ["minillm-lm-eval", *(sys.argv[1:] if argv is None else argv)]
    setup_logging()
    cli = _compat.lm_eval_cli()
    args = parse_in_one_line(cli.parse_args)
    try:
        if getattr(args, "model", None) == "minillm":  # a bad checkpoint fails before lm_eval indexes its tasks
            from lm_eval.utils import simple_parse_args_string

            given = getattr(args, "model_args", None) or {}
            given = simple_parse_args_string(given) if isinstance(given, str) else given  # lm_eval parses it
            read_checkpoint(given.get("checkpoint") or "", mmap=True)
        cli.execute(args)
    except (ConfigError, ValueError) as err:  # CheckpointError, a task lm_eval does not find
        print(f"minillm-lm-eval: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
