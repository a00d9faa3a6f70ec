"""Load a trained minillm model outside train.py: from a Lightning checkpoint, or from a Hub-mixin folder.

``load_checkpoint(path)`` is the one loader of export.py and sample.py. ``MinillmHub`` saves any minillm model
(every norm and placement) as config.json + model.safetensors through ``huggingface_hub.PyTorchModelHubMixin``.
"""
# no `from __future__ import annotations`: the Hub mixin reads the ModelConfig annotation of __init__ as a type

import os
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import PyTorchModelHubMixin

from minillm.errors import CheckpointError
from minillm.model import ModelConfig, Transformer
from minillm.norms import canonical_norms
from minillm.training.checkpointing import load_weights_only
from minillm.training.data import Tokenizer, tokenizer_from_state

DATAMODULE_KEY = "TextDataModule"  # Lightning stores a datamodule's state_dict() under its class name


def _tokenizer_state(ckpt: dict) -> dict | None:
    """The tokenizer state of the checkpoint's datamodule (TextDataModule first, else any datamodule state)."""
    states = [ckpt.get(DATAMODULE_KEY)] + [v for k, v in ckpt.items() if k != DATAMODULE_KEY]
    return next((s["tokenizer"] for s in states if isinstance(s, dict) and isinstance(s.get("tokenizer"), dict)),
                None)


def says_no_tokenizer(ckpt: dict) -> bool:
    """The checkpoint records that it has no tokenizer (minillm-import of a folder without tokenizer.json)."""
    state = ckpt.get(DATAMODULE_KEY)
    return isinstance(state, dict) and "tokenizer" in state and state["tokenizer"] is None


def read_checkpoint(path: str | os.PathLike, require_tokenizer: bool = True, mmap: bool = False) -> dict[str, Any]:
    """A minillm Lightning checkpoint (or one of minillm-import) as a dict, checked: a file torch.save wrote, with
    minillm's model config, its weights and (unless ``require_tokenizer=False``) a tokenizer. ``mmap``: tensors are
    not read (a quick check before a long start). Raises CheckpointError (a ValueError) with one readable line."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory (a sharded checkpoint? consolidate it first)" if path.is_dir() else "does not exist"
        raise CheckpointError(f"checkpoint {str(path)!r} {what}")
    ckpt = load_weights_only(path, mmap=mmap)
    hparams = ckpt.get("hyper_parameters") if isinstance(ckpt, dict) else None
    model_cfg = hparams.get("model") if isinstance(hparams, dict) else None
    if not isinstance(model_cfg, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise CheckpointError(f"{str(path)!r} is not a minillm checkpoint (no state_dict and "
                              "hyper_parameters['model'] written by minillm's LitLM)")
    if _tokenizer_state(ckpt) is None and (require_tokenizer or not says_no_tokenizer(ckpt)):
        if says_no_tokenizer(ckpt):
            raise CheckpointError(f"checkpoint {str(path)!r} has no tokenizer: it was imported from a folder without "
                                  "tokenizer.json; import it again with --tokenizer <tokenizer.json>")
        raise CheckpointError(f"checkpoint {str(path)!r} has no tokenizer: saved without its datamodule "
                              f"(checkpoint[{DATAMODULE_KEY!r}]['tokenizer'])")
    return ckpt


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu",
                    require_tokenizer: bool = True) -> tuple[Transformer, Tokenizer | None, dict[str, Any]]:
    """A minillm Lightning checkpoint (or one of minillm-import) -> (Transformer in eval mode, tokenizer, meta).

    meta: ``model`` (the ModelConfig dict as trained, fused_rmsnorm kept), ``global_step``, ``epoch``,
    ``hyper_parameters``, ``path`` and ``minillm`` (the checkpoint's record: version, commit, ``imported_from``).
    A fused_rmsnorm model is built with rmsnorm (identical weights and function), so it loads on any machine.
    A checkpoint that says it has no tokenizer gives None with ``require_tokenizer=False``. Raises CheckpointError
    (a ValueError) with one readable line (read_checkpoint).
    """
    path = Path(path)
    ckpt = read_checkpoint(path, require_tokenizer)
    hparams = ckpt["hyper_parameters"]
    model_cfg = hparams["model"]
    tok_state = _tokenizer_state(ckpt)
    model = Transformer(ModelConfig(**canonical_norms(model_cfg)))
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise CheckpointError(f"checkpoint {str(path)!r}: weights do not fit its model config "
                              f"({str(err).splitlines()[0]})") from None
    try:  # char, byte, or a Hugging Face tokenizer (bpe, tokenizer.json, hf:) stored as its JSON
        tok = tokenizer_from_state(tok_state) if tok_state is not None else None
    except Exception as err:
        raise CheckpointError(f"checkpoint {str(path)!r}: its tokenizer cannot be rebuilt "
                              f"({' '.join(str(err).split())[:160]})") from None
    meta = {"model": model_cfg, "global_step": ckpt.get("global_step"), "epoch": ckpt.get("epoch"),
            "hyper_parameters": hparams, "path": str(path), "minillm": ckpt.get("minillm") or {}}
    return model.to(device).eval(), tok, meta


class MinillmHub(Transformer, PyTorchModelHubMixin, library_name="minillm", tags=["minillm"]):
    """A Transformer with ``save_pretrained`` / ``from_pretrained`` (config.json: the ModelConfig fields).

    ``MinillmHub.from_pretrained(folder)`` loads strictly: a missing or unexpected weight is an error.
    """

    def __init__(self, config: ModelConfig):
        super().__init__(config)

    @classmethod
    def _from_pretrained(cls, *, strict: bool = True, **kwargs: Any) -> "MinillmHub":
        return super()._from_pretrained(strict=strict, **kwargs)
