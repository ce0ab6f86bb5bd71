"""Script mode: the user's own Horovod script in a session, its job, collectives and hints."""
