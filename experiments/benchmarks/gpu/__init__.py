"""First contact with a GPU: the plan, the preset runs and the merge of what they bring back (README.md)."""
