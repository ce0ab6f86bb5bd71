"""hpcsuite's commands run from a laptop against a cluster's login node, over SSH.

A remote is named once, in ``~/.config/hpcsuite/remotes.yaml`` (:mod:`.config`); the system's
OpenSSH client reaches it, one multiplexed connection per remote (:mod:`.ssh`). A command given
``--remote NAME`` (or ``HPCSUITE_REMOTE``) runs there, as the hpcsuite the site installed
(:mod:`.forward`); what a spec names is sent first, by content (:mod:`.send`), and `fetch`
brings a run's directory back (:mod:`.fetch`). Nothing here runs on the cluster: the remote
side is the site's own hpcsuite, a POSIX shell, tar and GNU find.
"""
