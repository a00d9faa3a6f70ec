"""Fused Triton RMSNorm benchmark and its report (README.md)."""
