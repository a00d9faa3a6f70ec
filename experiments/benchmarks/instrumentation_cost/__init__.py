"""What the stability callbacks cost per training step (README.md)."""
