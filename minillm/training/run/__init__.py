"""What it takes to run a job from the Hydra config, apart from building the objects: the run folder (its lock,
its clean-up after a refused start) and turning Hydra's own errors into one line."""
