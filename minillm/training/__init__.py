"""Training: a Hydra job (run/), the LightningModule, its callbacks, the data pipeline, the optimizers, checkpoints,
loggers and the multi-process helpers. Built on the core (model, norms, kernels); reads finished runs through
analysis/ (a sweep's closing line counts its jobs), nothing of tools/."""
