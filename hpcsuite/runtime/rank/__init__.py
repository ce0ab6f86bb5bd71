"""One rank in the job: its job file and published results, its node and devices, shared memory, signals, the startup watch, the user's stack frames, and the vote it sends the others."""
