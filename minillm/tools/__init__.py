"""The command-line tools beside train.py: evaluate, sample, export, import, inspect, prepare, replay and lm-eval,
each a ``main`` installed as a ``minillm-*`` console script."""
