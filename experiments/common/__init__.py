"""What several studies share.

    study      load a sweep's runs (or the committed copy), tables, write results.json / results.md, the CLI
    plots      matplotlib on the Agg backend, saving a figure
    machine    the one description of the machine a result was produced on
    reference  the reference loop: configs/ composed with Hydra, trained by a plain PyTorch loop (no Lightning)

Nothing here imports Hydra, omegaconf or ``datasets`` at import time (the GPU image has none of them).
"""
