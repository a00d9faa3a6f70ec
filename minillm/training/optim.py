"""The optimizer's parameter groups, Muon with AdamW (``optimizer=muon``), and the learning-rate schedules (warmup,
then cosine, linear, constant, inverse square root, or warmup-stable-decay), with the schedule settings a resumed
run must keep and the ones a decay branch may change."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable

import torch

from minillm.errors import ConfigError, check_betas, check_bool, check_choice, check_int, check_number, invalid
from minillm.mup import is_hidden_matrix

SCHEDULES = ("cosine", "linear", "constant", "inverse_sqrt", "wsd")
STEP_FREE_SCHEDULES = ("constant", "inverse_sqrt")  # they ignore total_steps and min_lr_ratio
MUON_LR_RULES = (None, "original", "match_rms_adamw")  # Muon's adjust_lr_fn (torch.optim.Muon)
DECAY_SHAPES = ("sqrt", "linear", "cosine")  # wsd's decay: 1 - sqrt(progress), 1 - progress, half a cosine
# the settings of a WSD run's decay: what a decay branch (decay_from=) may change, and nothing else
DECAY_SETTINGS = ("total_steps", "min_lr_ratio", "decay_fraction", "decay_shape", "decay_start")
BARE_MUON = ("optimizer._target_=torch.optim.Muon would be given every parameter, but Muon only takes the 2-D hidden "
             "matrices; allowed: optimizer=muon (Muon for the hidden matrices, AdamW for gains, biases, embeddings "
             "and the head, each with its lr: optimizer.lr, optimizer.adamw_lr)")


def schedule_settings(scheduler: dict | None) -> dict:
    """The scheduler settings that decide the lr: without total_steps and min_lr_ratio for the schedules that
    ignore them, so a constant-lr run may be extended (run settings compared on resume)."""
    scheduler = {k: v for k, v in (scheduler or {}).items() if not k.startswith("_")}  # not _target_: code paths
    if scheduler.get("kind") in STEP_FREE_SCHEDULES:
        scheduler = {k: v for k, v in scheduler.items() if k not in ("total_steps", "min_lr_ratio")}
    return scheduler


def stable_phase_settings(scheduler: dict | None) -> dict:
    """What a decay branch shares with the run it branches from: the schedule without its decay (a constant-lr
    run with warmup is a stable phase too)."""
    out = {k: v for k, v in schedule_settings(scheduler).items() if k not in DECAY_SETTINGS}
    if out.get("kind") in ("wsd", "constant"):
        out["kind"] = "stable"
    return out


def decay_start(total_steps: int, decay_fraction: float, start: int | None = None) -> int:
    """The step at which a WSD schedule starts to decay: ``start`` when given (a decay branch), else
    total_steps - round(decay_fraction * total_steps) (decay_fraction 0: never)."""
    return start if start is not None else total_steps - round(decay_fraction * total_steps)


def lr_lambda(kind: str, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1, decay_fraction: float = 0.2,
              decay_shape: str = "sqrt", decay_start: int | None = None) -> Callable[[int], float]:
    """Multiplier of the peak lr at a step: linear warmup, then cosine / linear decay to min_lr_ratio,
    constant, inverse square root (1 / sqrt(step / warmup)), or wsd: warmup, stable (1), then from the decay
    start (the last decay_fraction of total_steps, or decay_start) a decay of decay_shape to min_lr_ratio. A
    decay that starts inside the warmup decays from the lr reached there."""
    check_choice("scheduler.kind", kind, SCHEDULES)
    check_int("scheduler.warmup_steps", warmup_steps, low=0)
    check_int("scheduler.total_steps", total_steps, low=1)
    check_number("scheduler.min_lr_ratio", min_lr_ratio, low=0.0, high=1.0)
    check_number("scheduler.decay_fraction", decay_fraction, low=0.0, high=1.0)
    check_choice("scheduler.decay_shape", decay_shape, DECAY_SHAPES)
    check_int("scheduler.decay_start", decay_start, low=0, optional=True)
    start = globals()["decay_start"](total_steps, decay_fraction, decay_start)

    def warm(step: int) -> float:
        return (step + 1) / warmup_steps if step < warmup_steps else 1.0

    def factor(step: int) -> float:
        if kind == "wsd":
            if step < start:
                return warm(step)
            progress = min(1.0, (step - start) / max(1, total_steps - start))
            shape = {"sqrt": 1 - math.sqrt(progress), "linear": 1 - progress,
                     "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[decay_shape]
            return warm(start) * (min_lr_ratio + (1 - min_lr_ratio) * shape)
        if step < warmup_steps:
            return warm(step)
        if kind == "constant":
            return 1.0
        if kind == "inverse_sqrt":
            return math.sqrt(max(warmup_steps, 1) / (step + 1))
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1 - progress
        return min_lr_ratio + (1 - min_lr_ratio) * shape

    return factor


def warmup_schedule(optimizer: torch.optim.Optimizer, kind: str = "cosine", warmup_steps: int = 100,
                    total_steps: int = 1000, min_lr_ratio: float = 0.1,
                    **wsd: object) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step LambdaLR (the Hydra config passes it as a partial); ``wsd``: decay_fraction, decay_shape,
    decay_start. Every param group gets the same multiplier of its own lr (Muon's and AdamW's)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(kind, warmup_steps, total_steps, min_lr_ratio,
                                                                  **wsd))


def param_groups(model: torch.nn.Module, decay_norms: bool = False, decay_embeddings: bool = False,
                 split_hidden: bool = False, hidden_lr_mult: float = 1.0) -> list[dict]:
    """AdamW parameter groups: weight decay on the matrices of linear layers; the norm gains and biases (every
    0-D and 1-D parameter) and the token embedding get it only when decay_norms / decay_embeddings say so.
    ``split_hidden`` (Muon): a first group of the 2-D hidden matrices (``use_muon``), then the AdamW groups of
    everything else (embedding, head, gains, biases), each group marked with ``use_muon``. ``hidden_lr_mult``
    other than 1 (muP, minillm.mup): the hidden matrices in a group of their own, last, marked ``lr_mult``
    (scale_group_lrs applies it once the optimizer is built)."""
    hidden, decay, no_decay = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if (split_hidden or hidden_lr_mult != 1.0) and is_hidden_matrix(name, p):
            hidden.append(p)
            continue
        skip = (p.ndim < 2 and not decay_norms) or (name.startswith("tok_emb.") and not decay_embeddings)
        (no_decay if skip else decay).append(p)
    mult = {"lr_mult": hidden_lr_mult} if hidden_lr_mult != 1.0 else {}
    if not split_hidden:
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        return groups + [{"params": hidden, **mult}] if hidden else groups
    return [{"params": hidden, "use_muon": True, **mult}, {"params": decay, "use_muon": False},
            {"params": no_decay, "use_muon": False, "weight_decay": 0.0}]


def scale_group_lrs(optimizer: torch.optim.Optimizer) -> None:
    """Each group marked ``lr_mult`` (param_groups) gets lr * lr_mult and weight_decay / lr_mult (the decoupled
    decay per step, lr * weight_decay, is unchanged: the ``mup`` package's rule); call it once, on a new
    optimizer, before the lr schedule is made (a resumed run's groups come from its checkpoint)."""
    for group in optimizer.param_groups:
        mult = group.get("lr_mult", 1.0)
        group["lr"] *= mult
        group["weight_decay"] /= mult


FUSED = ("auto", True, False, None)  # optimizer.fused; not set: auto for torch.optim.AdamW


def check_fused(factory: Callable | None) -> None:
    """optimizer.fused is auto, true, false or null (a one-line ConfigError otherwise)."""
    fused = getattr(factory, "keywords", {}).get("fused")
    if fused not in FUSED or isinstance(fused, int) and not isinstance(fused, bool):
        raise invalid("optimizer.fused", fused, "auto (torch's fused kernel on a CUDA GPU, its default elsewhere), "
                      "true, false or null")


def with_fused(factory: Callable, device: torch.device, scaled: bool = False) -> Callable:
    """The optimizer factory with ``fused`` resolved for the device the parameters are on: ``auto`` (and, for
    torch.optim.AdamW, not setting it) is True on a CUDA GPU (one kernel for every parameter's update, no per-step
    host work) and torch's default elsewhere (on a CPU it keeps runs bit-identical with earlier versions), and
    under a GradScaler (``scaled``: fp16) too, where a fused step would unscale the gradients after Lightning
    clipped them."""
    keywords = getattr(factory, "keywords", {})
    fused = keywords.get("fused", "auto" if getattr(factory, "func", None) is torch.optim.AdamW else None)
    if fused != "auto":
        return factory
    return functools.partial(factory, fused=True if device.type == "cuda" and not scaled else None)


def is_bare_muon(target: object) -> bool:
    """A _target_ (or class) that is torch.optim.Muon itself."""
    muon = getattr(torch.optim, "Muon", None)
    return (muon is not None and target is muon) or str(target) in ("torch.optim.Muon", "torch.optim._muon.Muon")


def optimizer_kind(factory: object) -> str:
    """What muP's lr rule (minillm.mup.hidden_lr_mult) calls an optimizer class: ``muon`` (one that splits off the
    hidden matrices: MuonWithAdamW), ``adamw`` (torch's AdamW or Adam), else its class name."""
    factory = getattr(factory, "func", factory)  # a partial (Hydra's _partial_)
    if getattr(factory, "splits_hidden_matrices", False):
        return "muon"
    if factory in (torch.optim.AdamW, torch.optim.Adam):
        return "adamw"
    return getattr(factory, "__name__", str(factory))


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer of two: ``torch.optim.Muon`` (Jordan et al. 2024: momentum, then the update orthogonalized by
    Newton-Schulz iterations) for the 2-D hidden matrices, ``torch.optim.AdamW`` for the rest (embedding, head,
    gains, biases), which Muon is not meant for. Give it ``param_groups(model, split_hidden=True)``.

    It is a real ``torch.optim.Optimizer``: its ``param_groups`` are the two optimizers' groups (the same dicts,
    so an lr schedule scales both lrs, clipping and a GradScaler see every parameter) and its ``state`` is theirs,
    so ``state_dict`` / ``load_state_dict`` are torch's own and a Lightning checkpoint resumes it exactly.
    ``lr``, ``momentum``, ``nesterov``, ``ns_steps``, ``weight_decay`` and ``adjust_lr_fn`` are Muon's;
    ``adamw_*`` AdamW's (the groups marked weight_decay 0 keep it).
    """

    splits_hidden_matrices = True  # LitLM gives it param_groups(..., split_hidden=True)

    def __init__(self, params: Iterable[dict], lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, weight_decay: float = 0.01, adjust_lr_fn: str | None = None,
                 adamw_lr: float = 3e-3, adamw_betas: tuple[float, float] | list[float] = (0.9, 0.95),
                 adamw_eps: float = 1e-8, adamw_weight_decay: float = 0.1):
        adamw_betas = tuple(adamw_betas) if not isinstance(adamw_betas, (str, bytes)) else adamw_betas  # ListConfig
        self.check(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, weight_decay=weight_decay,
                   adjust_lr_fn=adjust_lr_fn, adamw_lr=adamw_lr, adamw_betas=adamw_betas, adamw_eps=adamw_eps,
                   adamw_weight_decay=adamw_weight_decay)
        groups = [dict(g) for g in params]
        if not all(isinstance(g.get("use_muon"), bool) for g in groups):
            raise ConfigError("MuonWithAdamW needs parameter groups marked use_muon: "
                              "minillm.training.optim.param_groups(model, split_hidden=True)")
        hidden = [g for g in groups if g["use_muon"]]
        if not any(g["params"] for g in hidden):
            raise ConfigError("optimizer=muon: the model has no 2-D hidden matrices for Muon")
        self.muon = torch.optim.Muon(hidden, lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                                     weight_decay=weight_decay, adjust_lr_fn=adjust_lr_fn)
        self.adamw = torch.optim.AdamW([g for g in groups if not g["use_muon"]], lr=adamw_lr,
                                       betas=adamw_betas, eps=adamw_eps, weight_decay=adamw_weight_decay)
        super().__init__(self.muon.param_groups + self.adamw.param_groups, {})
        self._share()

    @staticmethod
    def check(**kw: object) -> None:
        """Each setting's range, named as in the config (optimizer.<key>)."""
        check_number("optimizer.lr", kw["lr"], low=0.0, low_open=True)
        check_number("optimizer.momentum", kw["momentum"], low=0.0, high=0.999)
        check_bool("optimizer.nesterov", kw["nesterov"])
        check_int("optimizer.ns_steps", kw["ns_steps"], low=1, high=99)
        check_number("optimizer.weight_decay", kw["weight_decay"], low=0.0)
        check_choice("optimizer.adjust_lr_fn", kw["adjust_lr_fn"], MUON_LR_RULES)
        check_number("optimizer.adamw_lr", kw["adamw_lr"], low=0.0, low_open=True)
        check_betas("optimizer.adamw_betas", kw["adamw_betas"])
        check_number("optimizer.adamw_eps", kw["adamw_eps"], low=0.0, low_open=True)
        check_number("optimizer.adamw_weight_decay", kw["adamw_weight_decay"], low=0.0)

    def _share(self) -> None:
        """The inner optimizers step this optimizer's groups and state (after __init__ and load_state_dict)."""
        self.muon.param_groups = [g for g in self.param_groups if g["use_muon"]]
        self.adamw.param_groups = [g for g in self.param_groups if not g["use_muon"]]
        self.muon.state = self.adamw.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # new group dicts and state: share them again
        self._share()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def lrs(self) -> dict[str, float]:
        """The lr each optimizer started from (before the schedule): {"muon": ..., "adamw": ...}."""
        first = {}
        for g in self.param_groups:
            first.setdefault("muon" if g["use_muon"] else "adamw", g.get("initial_lr", g["lr"]))
        return first
