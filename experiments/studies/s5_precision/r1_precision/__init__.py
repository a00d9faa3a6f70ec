"""S5 round 1: fp16 overflow in a norm (unit level), and training per placement x precision."""
