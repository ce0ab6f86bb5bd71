"""Script mode: running the user's own Horovod script inside a session, its job, its collectives, and hints for its known failures."""
