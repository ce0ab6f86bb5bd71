"""One rank in the job: its job file, node, devices, shared memory, signals, startup and vote."""
