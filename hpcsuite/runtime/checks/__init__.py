"""Checks run on the ranks: the preflight step, `lint --build`, the allreduce benchmark."""
