"""Calibration: minillm (Lightning + Hydra) vs the reference loop of experiments.common.reference (README.md)."""
