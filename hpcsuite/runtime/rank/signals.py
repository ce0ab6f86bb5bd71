"""The preemption flag: set by a signal handler, acted on at the next step boundary.

Installed first thing in ``python -m hpcsuite train`` (:mod:`hpcsuite.__main__`, before even
the command line is parsed), so a signal that arrives during start-up is remembered instead of
killing the rank. The managed loop and script mode (:mod:`hpcsuite.api`) read the same flag.

Two gaps remain that no handler can close, and the batch script closes them (see the
template's launch block): a signal that comes before the ranks exist (the launcher forwards it
to nobody), and one that comes in the first milliseconds of a rank's interpreter. So the batch
shell's trap first writes a stop request (:meth:`~hpcsuite.runs.rundir.RunDir.stop_requested`) into
the run directory, then waits until every rank has said it is ready (:func:`announce_ready`: its
handler is installed) before it forwards the signal; a rank that becomes ready reads the stop
request itself.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from ...runs.attempts import attempt_number
from ...runs.rundir import RunDir

EARLY_SIGNALS = ("USR1", "USR2", "TERM")   # caught before the job says which one it uses


class StopFlag:
    def __init__(self):
        self.signal: str | None = None
        self.at: float | None = None          # time.monotonic() of the first signal
        self.installed: tuple[str, ...] = ()

    def install(self, names) -> None:
        names = tuple(sorted(set(names)))
        for name in set(self.installed) - set(names):   # caught early, not this job's
            signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_DFL)
        for name in names:
            signal.signal(getattr(signal, f"SIG{name}"), self._handler)
        self.installed = names

    def _handler(self, signum, frame) -> None:
        self.raise_(signal.Signals(signum).name[3:])

    def raise_(self, name: str) -> None:
        if self.signal is None:
            self.signal, self.at = name, time.monotonic()

    def retire(self) -> None:
        """Ignore these signals from now on: this rank's work is done and recorded.

        Python's finalization puts its handlers back to the default action (terminate), so a
        preemption signal that arrives while the interpreter and Horovod shut down would turn a
        completed rank into a failed job; an ignored signal stays ignored through finalization."""
        for name in self.installed:
            signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)

    @property
    def raised(self) -> bool:
        return self.signal is not None


FLAG = StopFlag()


def announce_ready(run_dir: Path, rank: int, flag: StopFlag = FLAG) -> None:
    """Tell the batch shell this rank can take the signal now, then pick up a stop request
    the shell wrote before (whose signal it is holding back, or that came before any rank
    existed). Best effort: without a writable run directory the shell forwards after its
    wait and a rank not yet ready then would die, as it did before this existed."""
    try:
        run = RunDir(run_dir)
        mark = run.ready_mark(attempt_number(), rank)
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
        requested = run.stop_requested(attempt_number()).read_text().split()
    except OSError:
        return
    if requested:
        flag.raise_(requested[0])
