"""S2 round 1: warmup x lr x depth x placement in GPT-2's init."""
