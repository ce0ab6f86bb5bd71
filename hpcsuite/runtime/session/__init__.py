"""A training session, managed and script mode alike: restore, the managed loop, the stop/save policy, checkpoints, the learning-rate schedule, the time limit and the slow-rank balance."""
