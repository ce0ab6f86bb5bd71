"""Checks that run on the ranks: the preflight step, `lint --build`, the allreduce benchmark and the collective timing they share."""
