"""The wall-clock budget every bench/ script runs under: --budget SECONDS, at most 20 minutes.

A script walks its rounds (repeats, cases) with ``budget.each(items)``, which starts no more of
them once a stop signal came or the budget cannot fit another as long as the longest so far.
Inside ``with budget.watch():`` SIGTERM, SIGINT and the end of the budget itself raise
:class:`Interrupted`, which the ``with`` ends quietly: the round in flight is abandoned
(children started with :func:`run_group` are stopped, the script's own ``finally`` blocks run),
and the script prints what the completed rounds measured, after ``budget.report(done, total,
unit)`` has marked the run as cut short.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

MAX_SECONDS = 1200          # no benchmark run may take longer than 20 minutes
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """A stop signal or the end of the budget, raised in the main thread. A BaseException, as
    KeyboardInterrupt is, so that no ``except Exception`` on the way swallows it."""


class Budget:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.monotonic()
        self.stopped_by: str | None = None     # "--budget 300 s" or "SIGTERM"
        self.signum: int | None = None
        self.stopped_at = 0.0       # seconds into the run
        self.settled = False        # the rounds are over: signals no longer interrupt cleanup

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return max(0.0, self.seconds - self.elapsed())

    def expired(self, expect: float = 0.0) -> bool:
        """Whether to start no more work: a stop signal came, or the budget cannot fit
        ``expect`` more seconds."""
        if self.stopped_by is None and self.elapsed() + expect > self.seconds:
            self._stop(f"--budget {self.seconds:g} s")
        return self.stopped_by is not None

    def _stop(self, reason: str) -> None:
        self.stopped_by, self.stopped_at = reason, self.elapsed()

    def each(self, items, *, predict: bool = True, agree=None):
        """The items, one by one, while the budget allows another. ``predict``: stop when the
        longest item so far would not fit in what is left (else only once it is spent).
        ``agree``: a function from this process's stop (bool) to the one all ranks take."""
        longest = 0.0
        try:
            for item in items:
                stop = self.expired(longest if predict else 0.0)
                if agree is not None and agree(stop) and not stop:
                    self._stop("a stop on another rank")
                    stop = True
                if stop:
                    return
                t0 = time.monotonic()
                yield item
                longest = max(longest, time.monotonic() - t0)
        finally:
            self.settled = True

    @contextlib.contextmanager
    def watch(self, hard: bool = True):
        """Stop signals (and, with ``hard``, the end of the budget: SIGALRM) raise Interrupted
        in the block, which ends it quietly. ``hard=False`` is for MPI ranks, which must stop
        together at a round boundary: a signal only makes :meth:`expired` true."""
        def on_signal(signum, frame):
            if self.stopped_by is not None or self.settled:
                return                          # already stopping: let the cleanup run
            self.signum = signum
            self._stop(signal.Signals(signum).name)
            if hard:
                raise Interrupted(self.stopped_by)

        def on_alarm(signum, frame):
            if self.stopped_by is None and not self.settled:
                self._stop(f"--budget {self.seconds:g} s")
                raise Interrupted(self.stopped_by)

        before = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
        if hard:
            before[signal.SIGALRM] = signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, max(self.remaining(), 0.001))
        try:
            yield self
        except Interrupted:
            pass
        finally:
            if hard:
                signal.setitimer(signal.ITIMER_REAL, 0)
            for s, handler in before.items():
                signal.signal(s, handler)

    def report(self, done: int, total: int | None, unit: str, file=None) -> None:
        """Mark a run that did ``done`` of ``total`` (None: not known yet) units as cut short,
        in one line; with none done, say that nothing was measured and exit non-zero."""
        if self.stopped_by is None or (total is not None and done >= total):
            return
        of = f"{done} of {total}" if total is not None else f"{done}"
        line = f"cut short by {self.stopped_by} after {of} {unit} ({self.stopped_at:.0f} s)"
        if not done:
            print(f"{line}: nothing measured", file=file or sys.stdout, flush=True)
            raise SystemExit(self.exit_code(1))
        print(f"{line}: figures from the completed {unit} only", file=file or sys.stdout, flush=True)

    def exit_code(self, code: int = 0) -> int:
        """``code``, or 128 + the signal's number when a signal stopped the run."""
        return 128 + self.signum if self.signum is not None else code

    @staticmethod
    def add_argument(ap: argparse.ArgumentParser, default: float, what: str) -> None:
        """--budget SECONDS; ``what``: the work the script stops starting ("rounds")."""
        ap.add_argument("--budget", type=float, default=default, metavar="SECONDS",
                        help=f"wall-clock seconds for the whole run (default {default:g}, at most "
                             f"{MAX_SECONDS}); when they run out, or on SIGTERM/SIGINT, no more {what} "
                             "are started and what was measured so far is printed, marked as cut "
                             "short (exit 128+N after signal N)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Budget:
        """The run's Budget, its clock started now; a budget out of range is refused in one line."""
        if not 0 < args.budget <= MAX_SECONDS:      # (NaN is refused too)
            print(f"error: --budget {args.budget:g}: must be more than 0 and at most {MAX_SECONDS} s "
                  "(no benchmark runs longer than 20 minutes)", file=sys.stderr)
            raise SystemExit(2)
        return cls(args.budget)


def run_group(argv: list[str], *, check: bool = False, capture_output: bool = False,
              timeout: float | None = None, **popen) -> subprocess.CompletedProcess:
    """subprocess.run in a process group of its own, stopped as a whole (SIGTERM, then SIGKILL
    after 10 s) when the wait is interrupted: mpirun passes the SIGTERM on to its ranks, while
    the SIGKILL of mpirun alone that subprocess.run sends would leave them running."""
    if capture_output:
        popen.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with subprocess.Popen(argv, start_new_session=True, **popen) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            _stop_group(proc)
            raise
    done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def cancel_jobs_under(env: dict, directory, wait: float = 60) -> None:
    """scancel the Slurm jobs submitted from ``directory`` or below it (their WorkDir): the
    jobs of a run that was cut short, which would otherwise keep the cluster busy. Waits up to
    ``wait`` seconds for them to end, so that they write nothing into a directory the caller
    removes next (a rank saves a checkpoint on scancel's SIGTERM)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %Z"], env=env, capture_output=True,
                         text=True, timeout=60).stdout
    root = os.path.realpath(directory)
    ids = [job for job, _, workdir in (line.partition(" ") for line in out.splitlines())
           if os.path.realpath(workdir) == root or os.path.realpath(workdir).startswith(root + os.sep)]
    if not ids:
        return
    subprocess.run(["scancel", *ids], env=env, capture_output=True, timeout=60)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        left = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(ids)], env=env,
                              capture_output=True, text=True, timeout=60)
        if left.returncode != 0 or not left.stdout.strip():
            return
        time.sleep(0.5)
