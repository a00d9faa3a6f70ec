"""Opt-in Triton kernels, the only code that imports triton; import each one, e.g. kernels.rmsnorm."""
