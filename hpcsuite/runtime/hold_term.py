"""Run a command with SIGTERM blocked: ``python -m hpcsuite.runtime.hold_term PROGRAM ARGS...``.

Open MPI 5's daemons (PRRTE 3.0's ``prterun``, which is its ``mpirun``, and the ``prted`` it
starts on the other nodes) take a SIGTERM as "abort the job": they end their ranks with SIGCONT,
SIGTERM and a SIGKILL half a second later (hard-coded in PRRTE's odls; it reads no kill timeout).
Slurm's own stop of a running job (``scontrol requeue``, a cancel, a preemption without the
warning signal) sends SIGTERM to every process of the job at once, so the ranks, which take it
as "save and stop", were killed before their save. A blocked signal stays blocked through
``exec`` and PRRTE only installs handlers, so a daemon started through this wrapper never sees
Slurm's SIGTERM; its ranks are started with every signal unblocked (PRRTE's odls does so), get
Slurm's SIGTERM themselves, save and exit, and the daemons end with them. Slurm's SIGKILL after
KillWait still ends everything; the batch shell ends such a launcher with SIGINT
(:meth:`hpcsuite.submit.mpi_flavours.OpenMpi5.launcher_signals`).
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m hpcsuite.runtime.hold_term PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"hpcsuite: cannot run {argv[0]}: {e.strerror}", file=sys.stderr)
        return 127
    return 0   # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
