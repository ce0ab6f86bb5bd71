"""A training session of either mode: restore, the managed loop, policy, checkpoints, time limit."""
