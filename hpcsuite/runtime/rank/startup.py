"""The startup watch: a rank that has trained no step ``train.startup_timeout_seconds`` after it
started ends the job, saying where the ranks stopped, instead of the job waiting out its time
limit (a 2-node job hung inside Horovod's init did, and lost its whole allocation).

Where a rank is, in order: before Horovod's init (the framework's imports, a script's own code
before ``hvd.init()``), inside it (MPI's start, the communicators), before the first step
(opening the data, building the model, the first step's collectives and compilation). The
managed mode marks its stages (:meth:`StartupWatch.mark`, :meth:`StartupWatch.follow`: the
backend and the session are handed the rank's watch); for script mode, where the user's script
calls ``hvd.init()``, the watch reads the main thread's stack.

Why a thread: a rank hung in Horovod's init or a collective waits inside a ctypes call, and one
blocked in the user's code in a sleep, a lock or I/O; all of them release the GIL, so a daemon
thread still runs and can end the process.

The clock starts when ``hpcsuite train`` starts on the rank (the queue and the batch script's
own set-up do not count) and stops at its first trained step; it does not run while the rank
restores a checkpoint (:meth:`StartupWatch.paused`: rank 0 reads it, the others wait for it), which may take
long for a large model without anything being wrong. When the time is up each rank writes where
it is (:meth:`~hpcsuite.runs.rundir.RunDir.startup_word`), waits :data:`GRACE` seconds for the
other ranks' words, and rank 0 names them all (``FAILED-attempt-N``, exit 1: the job ends at
once, and a requeue within ``train.preemption.max_failures`` may find the cause gone); the other
ranks report themselves only when rank 0 does not (:meth:`StartupWatch.report`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from ...runs.results import write_json_atomic
from ...runs.rundir import RunDir
from ...world import current
from .userframes import user_frame

log = logging.getLogger(__name__)

BEFORE_INIT, IN_INIT, BEFORE_STEP = "before_init", "in_init", "before_step"
WHERE = {BEFORE_INIT: "before Horovod's init", IN_INIT: "inside Horovod's init",
         BEFORE_STEP: "before the first step"}
KEY = "train.startup_timeout_seconds"
GRACE = 5.0          # seconds a rank out of time waits for the other ranks' words
TICK = 1.0           # how often the watch looks
POLL = 0.2           # how often rank 0 counts the words (one listing), the others look for its report


class StartupWatch:
    """One rank's startup watch (see the module's doc). ``on_stall(text)`` reports the stall
    and ends the rank (:func:`hpcsuite.runtime.train.fail`); it is not expected to return."""

    def __init__(self, seconds: float, run_dir: Path, rank: int, size: int, attempt: int | str,
                 on_stall: Callable[[str], None], script: bool = False, grace: float = GRACE,
                 clock: Callable[[], float] = time.monotonic):
        self.seconds, self.rank, self.size, self.script = seconds, rank, size, script
        self.run = RunDir(run_dir)
        self.attempt, self.on_stall, self.grace, self.clock = attempt, on_stall, grace, clock
        self.stage = BEFORE_INIT
        self.has_stepped: Callable[[], bool] | None = None
        self.started = clock()
        self.paused_for = 0.0
        self.paused_since: float | None = None
        self.done = threading.Event()
        self.main = threading.main_thread().ident

    # ---------------------------------------------------------------- what the rank tells it
    def mark(self, stage: str) -> None:
        self.stage = stage

    def follow(self, has_stepped: Callable[[], bool]) -> None:
        """Horovod is initialised and a training session exists: ``has_stepped()`` says when
        this rank has trained its first step."""
        self.has_stepped = has_stepped
        self.stage = BEFORE_STEP

    @contextmanager
    def paused(self):
        """The clock does not run inside (restoring a checkpoint)."""
        self.paused_since = self.clock()
        try:
            yield
        finally:
            self.paused_for += self.clock() - self.paused_since
            self.paused_since = None

    # ---------------------------------------------------------------- the clock
    def elapsed(self) -> float:
        now = self.clock()
        paused = self.paused_for + (now - self.paused_since if self.paused_since is not None else 0.0)
        return now - self.started - paused

    def stepped(self) -> bool:
        try:
            return self.has_stepped is not None and bool(self.has_stepped())
        except Exception:  # noqa: BLE001 - a session half-built: not yet
            return False

    def start(self) -> "StartupWatch":
        threading.Thread(target=self.watch, name="hpcsuite-startup-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        self.done.set()

    def watch(self) -> None:
        while not self.done.wait(min(TICK, max(self.seconds - self.elapsed(), 0.01))):
            if self.stepped():
                return
            if self.elapsed() < self.seconds:
                continue
            word = self.where()
            if word is None:
                log.info("startup watch: the script trains without hpcsuite.api.Run after "
                         "Horovod's init; its steps are not seen, so the watch ends here")
                return
            self.report(word)
            return

    # ---------------------------------------------------------------- the report
    def where(self) -> dict | None:
        """This rank's word: its stage and the user's frame the main thread is in (None: a
        script that trains without hpcsuite.api, where no step can be seen)."""
        frames = main_frames(self.main)
        stage = self.stage
        if stage != BEFORE_STEP and in_horovod_init(frames):
            stage = IN_INIT
        elif self.script and stage == BEFORE_INIT and horovod_initialised():
            return None
        return {"rank": self.rank, "stage": stage, "at": user_frame(frames),
                "host": current().node}

    def report(self, word: dict) -> None:
        """Write this rank's word; rank 0 waits for the others' (a listing of the directory
        each :data:`POLL` s, not a read of every word) and ends the job naming them all. The
        other ranks wait for its report (their failure watch then ends them); only when none
        comes (rank 0 never started, or is stuck where its threads cannot run) does each read
        the words and report itself. So the words are read once, by one rank: not every rank
        reading every rank's word five times a second (25·N² reads at N ranks)."""
        try:
            path = self.run.startup_word(self.attempt, self.rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, word)
        except OSError as e:
            log.warning("startup watch: cannot write %s: %s", self.run.startup(self.attempt), e)
        if self.rank == 0:
            deadline = self.clock() + self.grace
            while self.clock() < deadline and self.heard() < self.size:
                time.sleep(POLL)
        else:
            marker = self.run.failed(self.attempt)
            deadline = self.clock() + 3 * self.grace
            while self.clock() < deadline and not marker.exists():
                time.sleep(POLL)
            if marker.exists():
                return          # reported (by rank 0, or a rank that failed): ended from there
        if self.stepped():       # it trained a step after all, just in time
            return
        words = self.words()
        words.setdefault(self.rank, word)
        self.on_stall(stall_line(words, self.size, self.seconds))

    def heard(self) -> int:
        """How many ranks have written their word (one listing of the directory)."""
        try:
            return len(self.run.startup_words(self.attempt))
        except OSError:
            return 0

    def words(self) -> dict[int, dict]:
        out = {}
        try:
            paths = self.run.startup_words(self.attempt)
        except OSError:
            return out
        for path in paths:
            try:
                word = json.loads(path.read_text())
                out[int(word["rank"])] = word
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out


# ------------------------------------------------------------------- the message
def stall_line(words: dict[int, dict], size: int, seconds: float) -> str:
    """One line: where the ranks stopped (grouped by stage), that no step came within the
    bound, and where in the user's code they were."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(words):
        groups.setdefault(words[rank].get("stage", BEFORE_INIT), []).append(rank)
    silent = [r for r in range(size) if r not in words]
    stages = [s for s in WHERE if s in groups]
    who = "the rank" if size == 1 else "ranks"
    if len(stages) == 1 and not silent:
        head = f"{who} stopped {WHERE[stages[0]]}"
    else:
        parts = [f"{WHERE[s]} ({rank_list(groups[s])})" for s in stages]
        if silent:
            parts.append(f"not heard from ({rank_list(silent)}: never started, or stuck where "
                         "they could not answer)")
        head = f"{who} stopped " + ", ".join(parts)
    text = (f"{head}: no step within {seconds:g} s after {'it' if size == 1 else 'they'} "
            f"started ({KEY})")
    places: dict[str, list[int]] = {}
    for rank in sorted(words):
        if words[rank].get("at"):
            places.setdefault(words[rank]["at"], []).append(rank)
    if places:
        shown = [f"{at}" + (f" ({rank_list(ranks)})" if size > 1 else "")
                 for at, ranks in list(places.items())[:2]]
        text += "; in " + ", ".join(shown)
    return text


def rank_list(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-3``, ``ranks 0, 2, 5-7``."""
    ranks = sorted(ranks)
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return ("rank " if len(ranks) == 1 else "ranks ") + text


# ------------------------------------------------------------------- the main thread
def main_frames(ident: int | None) -> list:
    """The main thread's frames, innermost first ([] when it has none)."""
    frame = sys._current_frames().get(ident)
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


def in_horovod_init(frames: list) -> bool:
    """Whether the main thread is inside Horovod's ``init`` (horovod/common/basics.py)."""
    sep = os.sep
    return any(f.f_code.co_name == "init" and f"{sep}horovod{sep}" in f.f_code.co_filename
               for f in frames)


def horovod_initialised() -> bool:
    """Whether a Horovod module this process imported has been initialised."""
    for name in ("horovod.torch", "horovod.tensorflow", "horovod.keras"):
        module = sys.modules.get(name)
        try:
            if module is not None and module.is_initialized():
                return True
        except Exception:  # noqa: BLE001 - a half-imported module: not initialised
            continue
    return False


# ------------------------------------------------------------------- no watch
class NoWatch:
    """The watch of a rank that has none (``train.startup_timeout_seconds: 0``, a script run by
    hand, a test): what a rank tells it is not heard. Whoever makes a backend or a session
    passes the rank's watch, this one by default."""

    def mark(self, stage: str) -> None:
        pass

    def follow(self, has_stepped: Callable[[], bool]) -> None:
        pass

    @contextmanager
    def paused(self):
        yield

    def over(self) -> None:
        pass

    def stop(self) -> None:
        pass


OFF = NoWatch()
