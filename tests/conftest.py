"""Shared pytest setup."""

import os

import torch

# --- fused kernels (tests/test_kernels.py) --------------------------------------------------------------
# Without a CUDA GPU, run the Triton kernels on the CPU interpreter. This must happen before anything
# imports minillm.kernels.rmsnorm: Triton decides interpreter vs GPU when the kernels are defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# --- end fused kernels -----------------------------------------------------------------------------------
