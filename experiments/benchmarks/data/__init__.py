"""The data layer: preparing a 1 GB corpus, and starting a run from its token store (README.md)."""
