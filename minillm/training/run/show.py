"""The resolved config of a run, printed once at its start as a tree (rank 0; ``print_config=false`` silences it):
what the run really uses, after the overrides, the presets and minillm's own settings (a decay branch's length).
A sweep prints one tree, its first job's."""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.tree import Tree

log = logging.getLogger("minillm")
HEADER = "resolved config"


def config_tree(cfg: DictConfig) -> Tree:
    """A rich Tree of the config, resolved: one branch per group (data, model, optimizer, ...), then the top keys."""
    values = OmegaConf.to_container(cfg, resolve=True)
    tree = Tree(HEADER)

    def add(node: Tree, value: Any) -> None:
        for key, item in value.items():
            if str(key).startswith("_") and key != "_target_":  # Hydra's _convert_, _partial_
                continue
            if isinstance(item, dict) and item:
                add(node.add(str(key)), item)
            else:
                node.add(f"{key}: {item!r}" if isinstance(item, str) else f"{key}: {item}")

    groups = {k: v for k, v in values.items() if isinstance(v, dict) and v}
    add(tree, groups)
    add(tree, {k: v for k, v in values.items() if k not in groups})
    return tree


def sweep_job() -> int | None:
    """The job's number in a Hydra multirun; None for a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return int(HydraConfig.get().job.num)


@rank_zero_only
def show_config(cfg: DictConfig) -> None:
    """Log the tree (to the console and train.log) unless print_config is false; in a sweep, once (job 0's), and
    for each later job one line that points to its config file (its overrides are Hydra's line before it)."""
    if not cfg.get("print_config", True):
        return
    job = sweep_job()
    if job:
        log.info(f"{HEADER}: job #0's tree, with this job's overrides (in full: "
                 f"{cfg.paths.output_dir}/.hydra/config.yaml)")
        return
    console = Console(width=120, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(config_tree(cfg))
    console.file.close()
    log.info(console.export_text().rstrip())
