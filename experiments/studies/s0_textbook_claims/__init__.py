"""The seed notes' own comparisons, measured (README.md)."""
