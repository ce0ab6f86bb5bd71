"""When to vote, save, validate, log and stop: pure decisions from counters and clocks.

Both modes (:mod:`.loop`'s managed loop and script mode, :mod:`hpcsuite.api`) decide through
one :class:`Policy`, held by their :class:`~.session.Session`; neither it nor this module acts.
"""

from __future__ import annotations

from ...submit.spec import JobSpec

# Ranks agree on time- and signal-driven decisions (checkpoint now, stop now) through one tiny
# allreduce (a "vote") posted after a step and read after the next one: it travels with that
# step's gradient traffic instead of stalling a step, and every rank acts on the same step
# because every rank posts and reads at the same steps. A vote costs a step's worth of Horovod
# calls (~0.5 ms of CPU in PyTorch), so the votes are spaced by time: each vote also carries
# every rank's proposal for the next interval (about VOTE_SECONDS of steps), and all ranks adopt
# the smallest. A stop then takes effect at most one interval and one step after the signal.
POLL_STEPS = 10            # the interval until the step time is known
VOTE_SECONDS = 0.25
MAX_POLL_STEPS = 1000
LOG_SECONDS = 30
PROGRESS_SECONDS = 2.0     # rank 0 rewrites progress.json at most this often


class Policy:
    """When to vote, save, validate, log and stop. Pure decisions; the session and its mode act."""

    def __init__(self, job: JobSpec, start_step: int, now: float):
        self.train = job.train
        self.start_step = start_step
        self.last_save = now
        self.last_log = float("-inf")   # the first step is logged: training has begun
        # The first vote right after the first step, so that it (and, for TensorFlow, the
        # first run of the step variant that carries it) falls inside warm-up.
        self.next_poll = start_step + 1
        self.poll_every = POLL_STEPS

    def poll_due(self, step: int) -> bool:
        return step >= self.next_poll

    @staticmethod
    def propose_interval(step_times: list[float], seconds: float = VOTE_SECONDS) -> int:
        """Steps between votes for about ``seconds``, from the recent step times."""
        recent = sorted(step_times[-20:])
        if not recent:
            return POLL_STEPS
        median = recent[len(recent) // 2]
        return max(1, min(MAX_POLL_STEPS, int(seconds / max(median, 1e-6))))

    def polled(self, step: int) -> None:
        """A vote was posted at ``step``."""
        self.next_poll = step + self.poll_every

    def agreed(self, posted: int, every: int) -> None:
        """The vote posted at step ``posted`` was read: the ranks' interval from there."""
        self.poll_every = max(1, every)
        self.next_poll = posted + self.poll_every

    def time_to_save(self, now: float) -> bool:
        minutes = self.train.checkpoint.every_minutes
        return bool(minutes) and now - self.last_save >= minutes * 60

    def save_due(self, step: int, agreed: bool) -> bool:
        ck = self.train.checkpoint
        return ck.enabled and (agreed or bool(ck.every_steps and step % ck.every_steps == 0))

    def saved(self, now: float) -> None:
        self.last_save = now

    def log_due(self, now: float) -> bool:
        if now - self.last_log > LOG_SECONDS:
            self.last_log = now
            return True
        return False

    def done(self, step: int) -> bool:
        return bool(self.train.max_steps and step >= self.train.max_steps)

    def eval_due(self, epochs_done: int) -> bool:
        ev = self.train.eval
        return ev is not None and ev.enabled and epochs_done % ev.every_epochs == 0


def steady_throughput(step_times: list[float], real: list[int]) -> float:
    """Samples/s over the steps after warm-up (graph tracing, first allreduce negotiation):
    the first tenth of the steps, at most 10, is left out."""
    skip = min(10, len(step_times) // 10)
    seconds = sum(step_times[skip:])
    return sum(real[skip:]) / seconds if seconds else 0.0
