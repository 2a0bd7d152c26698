"""The cleanup suite: policies, runs, windows and their invariants on real databases."""
