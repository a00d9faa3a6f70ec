"""S7 round 2: the change of the model's output per step at L=48 (DeepNet's mechanism)."""
