"""One lifecycle for what runs beside training in a rank: started together when the rank
starts; what judges the rank by its training stopped together when training is over.

The watches (:mod:`~hpcsuite.runtime.rank.startup`'s startup watch,
:mod:`~hpcsuite.runtime.observe.failwatch`, :mod:`~hpcsuite.runtime.observe.netwatch`) start
here, one call. The startup and network watches judge a rank by its steps: no first step in
time, no step with a neighbour unreachable. After the last step that means nothing, and a rank
may work long still: rank 0 saving the final checkpoint, evaluating, writing the results,
flushing MLflow, a script's code after its loop. So "training is over" is one event,
:meth:`Lifecycle.over`, that stops them before that work: the managed loop fires it when its
last step ends, script mode when the script's ``run.batches()`` ends, ``run.should_stop()``
says stop, or ``run.finish()`` is called, and ``hpcsuite train`` when the rank's training
returns (whichever comes first). Before, the network watch was never stopped: a rank 0
exporting its model for 20 s after the last step took the finished ranks' closed ports for dead
ranks and failed a completed job.

The failure watch runs on until the rank ends: it judges nothing by steps, only ends this rank
once another rank has recorded its failure, and after the last step collectives still run (the
results' gather, the final save's) that would otherwise wait for the failed rank until the time
limit (under srun, which does not end a step for one bad exit).

The lifecycle is what the backend and the session are handed as the rank's ``watch``: it
passes the startup marks (:meth:`mark`, :meth:`follow`, :meth:`paused`) to the startup watch.
The monitor's sampler and the tracking thread belong to the loop, which stops the sampler at
the same point and flushes tracking as the last work.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from ...world import World
from . import failwatch, netwatch
from ..rank import startup

log = logging.getLogger(__name__)


class Lifecycle:
    """The rank's watches (see the module's doc). ``fail(text, code)`` reports a failure and
    ends the rank (:func:`hpcsuite.runtime.train.fail`)."""

    NETWORK_EXIT = 1     # a node lost its network: a failure like a crash (max_failures requeues)

    def __init__(self, run_dir: Path, world: World, startup_seconds: float, script: bool,
                 fail: Callable[[str, int], None]):
        self.run_dir, self.world, self.fail = run_dir, world, fail
        self.startup_seconds, self.script = startup_seconds, script
        self.startup = startup.OFF
        self.ended = threading.Event()
        self.network = False

    def start(self) -> "Lifecycle":
        w = self.world
        if self.startup_seconds:           # train.startup_timeout_seconds' clock starts
            self.startup = startup.StartupWatch(
                self.startup_seconds, self.run_dir, w.rank, w.size, w.attempt,
                lambda text: self.fail(text, 1), script=self.script).start()
        # Another rank's failure ends this one at once: nothing is left to save, and the
        # launcher would take 10 s more to kill a rank waiting in an allreduce (or, under
        # srun, never). It runs until the rank ends (the module's doc).
        failwatch.watch(self.run_dir, w.rank, w.attempt)
        # A node that lost its network: named in seconds, not at Slurm's node timeout or the
        # time limit, while every rank waits in an allreduce. One rank a node.
        if w.local_rank == 0:
            self.network = netwatch.watch(
                self.run_dir, w.rank, w.attempt, w.node,
                lambda text: self.fail(text, self.NETWORK_EXIT), self.ended,
                nodes=w.nodes) is not None
        return self

    # ---------------------------------------------------------------- the startup watch's marks
    def mark(self, stage: str) -> None:
        self.startup.mark(stage)

    def follow(self, has_stepped: Callable[[], bool]) -> None:
        self.startup.follow(has_stepped)

    def paused(self):
        return self.startup.paused()

    # ---------------------------------------------------------------- the end
    def over(self) -> None:
        """Training is over: the startup and network watches stop (once; later calls do
        nothing)."""
        if self.ended.is_set():
            return
        self.ended.set()
        self.startup.stop()
        if self.network:      # before this node's listener closes with the process
            netwatch.finished(self.run_dir, self.world.attempt, self.world.node)
        log.info("training is over: the startup and network watches stop")

    def stop(self) -> None:
        self.over()
