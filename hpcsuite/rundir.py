"""The one owner of a job's run directory (in the spirit of submitit's ``JobPaths``).

Every file a job, a rank, the batch script, ``status``, ``attempts``, the registry and studies read
or write in a run directory is named here and nowhere else; the batch template receives the names
through its context (:meth:`RunDir.template_names`), so bash and Python cannot drift. The layout::

    OUTPUT_DIR/NAME/                     RunRoot: every run of a job name
        slurm-JOBID.out                  Slurm's log of the batch script
        JOBID/                           RunDir: one submitted job, all its attempts
            job.sbatch submit.json       the script as submitted, the sbatch command
            job.json profile.json        the resolved job and site profile (the ranks read job.json)
            attempts.jsonl               one line per attempt (hpcsuite attempt begin/end)
            ready/attempt-N/rank-R       rank R of attempt N has its signal handler in place
            STOP-REQUESTED-attempt-N     the batch shell caught a stop signal in attempt N
            FAILED-attempt-N             the first failure of attempt N was reported
            PREEMPTED                    "STEP REASON": the run stopped with a checkpoint
            progress.json                the latest step, loss, throughput (every ~2 s)
            results.json                 the latest attempt, with every attempt's summary
            results-attempt-N.json       each attempt's own record
            rank-R.json                  rank R's own record (steps, step times, checksum)
            logs/rank-R.log              rank R's log, every attempt appended
            ledger/rank-R-attempt-N.txt  sample ids trained (train.ledger)
            timeline/                    Horovod timeline windows
            loss.png throughput.png ...  `hpcsuite report`

Light: the login-node commands import it, so it imports nothing beyond the standard library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

JOB = "job.json"
PROFILE = "profile.json"
SCRIPT = "job.sbatch"
SUBMIT = "submit.json"
ATTEMPTS = "attempts.jsonl"
PROGRESS = "progress.json"
RESULTS = "results.json"
PREEMPTED = "PREEMPTED"
READY = "ready"
STOP_REQUESTED = "STOP-REQUESTED"
FAILED = "FAILED"
LOGS = "logs"
LEDGER = "ledger"
TIMELINE = "timeline"
REPORT_PLOTS = ("loss.png", "throughput.png", "utilisation.png", "metrics.png")
SLURM_LOG = "slurm-{job_id}.out"          # in the run root; sbatch's --output spells %j
_ATTEMPT_RESULTS = re.compile(r"^results-attempt-(\d+)\.json$")


def slurm_log_pattern(run_root: str) -> str:
    """The ``#SBATCH --output`` value: Slurm puts the job id where ``%j`` stands."""
    return f"{run_root}/{SLURM_LOG.format(job_id='%j')}"


@dataclass(frozen=True)
class RunDir:
    """One job's run directory, ``OUTPUT_DIR/NAME/JOBID``."""
    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    # the job, as submitted
    @property
    def job(self) -> Path:
        return self.path / JOB

    @property
    def profile(self) -> Path:
        return self.path / PROFILE

    @property
    def script(self) -> Path:
        return self.path / SCRIPT

    @property
    def submit(self) -> Path:
        return self.path / SUBMIT

    # attempts and their markers
    @property
    def attempts(self) -> Path:
        return self.path / ATTEMPTS

    def ready(self, attempt: int | str) -> Path:
        return self.path / READY / f"attempt-{attempt}"

    def ready_mark(self, attempt: int | str, rank: int) -> Path:
        return self.ready(attempt) / f"rank-{rank}"

    def stop_requested(self, attempt: int | str) -> Path:
        return self.path / f"{STOP_REQUESTED}-attempt-{attempt}"

    def failed(self, attempt: int | str) -> Path:
        return self.path / f"{FAILED}-attempt-{attempt}"

    def failed_markers(self) -> list[Path]:
        return sorted(self.path.glob(f"{FAILED}-attempt-*"))

    @property
    def preempted(self) -> Path:
        return self.path / PREEMPTED

    # what the ranks write
    @property
    def progress(self) -> Path:
        return self.path / PROGRESS

    @property
    def results(self) -> Path:
        return self.path / RESULTS

    def attempt_results(self, attempt: int | str) -> Path:
        return self.path / f"results-attempt-{attempt}.json"

    def attempt_results_files(self) -> dict[int, Path]:
        """Each attempt's results-attempt-N.json, by attempt number."""
        found = {}
        for path in self.path.glob("results-attempt-*.json"):
            m = _ATTEMPT_RESULTS.match(path.name)
            if m:
                found[int(m.group(1))] = path
        return dict(sorted(found.items()))

    def rank_record(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.json"

    def rank_log(self, rank: int) -> Path:
        return self.path / LOGS / f"rank-{rank}.log"

    @property
    def ledger_dir(self) -> Path:
        return self.path / LEDGER

    def ledger(self, rank: int, attempt: int | str) -> Path:
        return self.path / LEDGER / f"rank-{rank}-attempt-{attempt}.txt"

    def ledger_files(self) -> list[Path]:
        return sorted((self.path / LEDGER).glob("rank-*-attempt-*.txt"))

    @property
    def timeline_dir(self) -> Path:
        return self.path / TIMELINE

    def plot(self, name: str) -> Path:
        return self.path / name

    # beside it, in the run root
    def slurm_log(self, job_id: str) -> Path:
        return self.path.parent / SLURM_LOG.format(job_id=job_id)

    @staticmethod
    def template_names() -> dict[str, str]:
        """The names the batch template writes and reads in ``$RUN_DIR`` (its ``rundir``)."""
        return {"job": JOB, "attempts": ATTEMPTS, "ready": READY, "stop_requested": STOP_REQUESTED,
                "preempted": PREEMPTED, "failed": FAILED}
