"""The preemption flag: set by a signal handler, acted on at the next step boundary.

Installed first thing in ``hpcsuite train``, before torch or TensorFlow is imported (which takes
seconds), so a signal that arrives during start-up is remembered instead of killing the rank.
The managed loop and script mode (:mod:`hpcsuite.api`) read the same flag.
"""

from __future__ import annotations

import signal


class StopFlag:
    def __init__(self):
        self.signal: str | None = None
        self.installed: tuple[str, ...] = ()

    def install(self, names) -> None:
        names = tuple(sorted(set(names)))
        for name in names:
            signal.signal(getattr(signal, f"SIG{name}"), self._handler)
        self.installed = names

    def _handler(self, signum, frame) -> None:
        self.signal = signal.Signals(signum).name

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
