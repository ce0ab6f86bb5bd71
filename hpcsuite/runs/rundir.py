"""The one owner of a job's run directory (in the spirit of submitit's ``JobPaths``).

Every file a job, a rank, the batch script, ``status``, ``attempts``, the registry and studies read
or write in a run directory is named here and nowhere else; the batch template receives the names
through its context (:meth:`RunDir.template_names`), so bash and Python cannot drift. The layout::

    OUTPUT_DIR/NAME/                     RunRoot: every run of a job name
        slurm-JOBID.out                  Slurm's log of the batch script
        .submit-STAMP.sbatch             the script between sbatch and its job id (submit)
        checkpoints/                     the job name's checkpoints (no train.checkpoint.dir)
        mlruns/                          the MLflow file store of train.tracking without a uri
        local/STAMP/                     a run in this process (hpcsuite.api, no Slurm)
        JOBID/                           RunDir: one submitted job, all its attempts
            job.sbatch submit.json       the script as submitted, the sbatch command
            job.json profile.json        the resolved job and site profile (the ranks read job.json)
            attempts.jsonl               one line per attempt (hpcsuite attempt begin/end)
            ready/attempt-N/rank-R       rank R of attempt N has its signal handler in place
            STOP-REQUESTED-attempt-N     the batch shell caught a stop signal in attempt N
            FAILED-attempt-N             the first failure of attempt N was reported
            startup/attempt-N/rank-R.json  where rank R was when attempt N's startup watch ran
            startup/attempt-N/net-R.json   the addresses where rank R's network watch answers
                                         out (no step within train.startup_timeout_seconds)
            script/attempt-N/rank-R.json  what rank R saw once its script returned (script mode)
            PREEMPTED                    "STEP REASON": the run stopped with a checkpoint
            progress.json                the latest step, loss, throughput (every ~2 s)
            results.json                 the latest attempt, with every attempt's summary
            results-attempt-N.json       each attempt's own record
            rank-R.json                  rank R's own record (steps, step times, checksum)
            monitor/rank-R.json          rank R could not write its Prometheus textfile
            logs/rank-R.log              rank R's log, every attempt appended
            ledger/rank-R-attempt-N.txt  sample ids trained (train.ledger)
            horovod-timeline.json        Horovod's timeline of the whole run (train.horovod.timeline)
            horovod-timeline-steps-A-B.json  a timeline window (train.monitor.timeline_steps)
            horovod-autotune.csv         Horovod's autotuning log (train.horovod.autotune)
            tensorboard/                 rank 0's TensorBoard event files, one per attempt, all
                                         in one log directory (train.monitor.tensorboard)
            allreduce.json allreduce.csv the allreduce benchmark's report (hpcsuite bench)
            preflight.json               the preflight step's figures (preflight: node pairs'
                                         busbw, each rank's GPU health), the newest attempt's
            mlflow.json                  the MLflow run rank 0 logs to (train.tracking): its
                                         store and run id, which a resumed attempt continues
            mlruns/                      the MLflow file store rank 0 falls back to when it
                                         cannot reach the tracking server
            loss.png throughput.png ...  `hpcsuite report`
        ARRAYID_INDEX/                   RunDir of an element of a job array (``hpcsuite sweep``),
                                         named as Slurm names the element (element_id): a
                                         run's files, its job.json copied from the sweep
                                         directory (which keeps the script and submit record)

The names of files that belong to an attempt or a rank are built by the ``*_name`` functions;
the batch template gets them built with the shell's attempt number (:data:`SHELL_ATTEMPT`), so
the shell and Python spell them through one formula.

Light: the login-node commands import it, so it imports nothing beyond the standard library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ENV = "HPCSUITE_RUN_DIR"      # the batch script exports the run directory to every rank
NODE_PRIVATE_SHM = "HPCSUITE_NODE_PRIVATE_SHM"   # where each node gets its own MPI segments (runtime/rank/shm.py)
NODE_SHM_VARIABLE = "HPCSUITE_NODE_SHM_VARIABLE"   # the MPI's variable for it, when not Open MPI 4's
SHELL_ATTEMPT = "${SLURM_RESTART_COUNT:-0}"   # the attempt number, as the batch shell reads it
SHELL_PID = "$$"              # the batch shell's process id: its staged files are its own

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
STARTUP = "startup"
SCRIPT_WORDS = "script"
LOGS = "logs"
LEDGER = "ledger"
TENSORBOARD = "tensorboard"
# TensorBoard finds event files by "tfevents" in the name; the time first, so that the files
# of a requeued job's attempts sort in the order they were written.
TENSORBOARD_EVENTS = "events.out.tfevents"
HOROVOD_TIMELINE = "horovod-timeline.json"
HOROVOD_AUTOTUNE_LOG = "horovod-autotune.csv"
ALLREDUCE = "allreduce.json"
ALLREDUCE_CSV = "allreduce.csv"
PREFLIGHT = "preflight.json"
MLFLOW = "mlflow.json"
MLRUNS = "mlruns"
MONITOR = "monitor"
LOSS_PLOT = "loss.png"
THROUGHPUT_PLOT = "throughput.png"
UTILISATION_PLOT = "utilisation.png"
METRICS_PLOT = "metrics.png"
# in the run root
SLURM_LOG = "slurm-{job_id}.out"          # sbatch's --output spells %j for the id (%A_%a in an array)
# The run directory's name as the batch shell spells it: the job id, or for an element of a
# job array the id Slurm shows for it (squeue, sacct, scontrol: ARRAYID_INDEX).
SHELL_RUN_NAME = '"$SLURM_JOB_ID"'
SHELL_ELEMENT_NAME = '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
CHECKPOINTS = "checkpoints"
LOCAL = "local"

_ATTEMPT_RESULTS = re.compile(r"^results-attempt-(\d+)\.json$")
_TIMELINE_WINDOW = re.compile(r"horovod-timeline-steps-(\d+)-(\d+)\.json$")


# ------------------------------------------------------------------- names (relative)
def staged_name(name: str, writer: int | str) -> str:
    """Where ``writer`` (a process id, or SHELL_PID) writes ``name`` before renaming it in:
    beside it, hidden, so that a reader sees the old file or the new one, never half."""
    return f".{name}.{writer}"


# ``attempt`` may be a number or a shell expression (SHELL_ATTEMPT) for the template.
def ready_name(attempt: int | str) -> str:
    return f"{READY}/attempt-{attempt}"


def ready_mark_name(rank: int) -> str:
    return f"rank-{rank}"


def stop_requested_name(attempt: int | str) -> str:
    return f"{STOP_REQUESTED}-attempt-{attempt}"


def failed_name(attempt: int | str) -> str:
    return f"{FAILED}-attempt-{attempt}"


FAILURE_TAGS = ("node", "raised", "at", "hint")   # a marker's optional lines, in this order


def failure_text(rank: int | None, code: int, text: str, **tags: str | None) -> str:
    """A FAILED-attempt-N marker's text: the first rank that failed, the status it exits with,
    the optional ``FAILURE_TAGS`` (its node; for an exception, its type and message on one
    line, the user's file:line it came from, a hint for a known one) as ``TAG: value`` lines,
    then what it said (``error: ...`` lines or a traceback)."""
    said = [f"{tag}: {tags[tag]}" for tag in FAILURE_TAGS if tags.get(tag)]
    who = [f"rank {rank}"] if rank is not None else []     # None: the batch script's own step
    return "\n".join([*who, f"exit {code}", *said, text]) + "\n"


def failure_exit(path: Path) -> int | None:
    """The exit status a FAILED marker's rank ended with (None: no marker, or none said)."""
    try:
        lines = path.read_text(errors="replace").splitlines()[:2]
    except OSError:
        return None
    words = next((w for w in map(str.split, lines) if w[:1] == ["exit"]), [])
    return int(words[1]) if len(words) == 2 and words[0] == "exit" and words[1].isdigit() \
        else None


def startup_name(attempt: int | str) -> str:
    return f"{STARTUP}/attempt-{attempt}"


def script_word_name(attempt: int | str, rank: int | str) -> str:
    return f"{SCRIPT_WORDS}/attempt-{attempt}/rank-{rank}.json"


def attempt_results_name(attempt: int | str) -> str:
    return f"results-attempt-{attempt}.json"


def rank_record_name(rank: int | str) -> str:
    """A rank's own record in a directory (the run's, startup/attempt-N/, monitor/)."""
    return f"rank-{rank}.json"


def rank_log_name(rank: int) -> str:
    return f"{LOGS}/rank-{rank}.log"


def ledger_name(rank: int, attempt: int | str) -> str:
    return f"{LEDGER}/rank-{rank}-attempt-{attempt}.txt"


def tensorboard_events_name(seconds: float, host: str, pid: int) -> str:
    return f"{TENSORBOARD}/{TENSORBOARD_EVENTS}.{int(seconds):010d}.{host}.{pid}"


def timeline_window_name(first: int, last: int) -> str:
    return f"horovod-timeline-steps-{first}-{last}.json"


def timeline_window_steps(name: str) -> tuple[int, int] | None:
    """(first, last) of a timeline window's file name, None for another file."""
    m = _TIMELINE_WINDOW.search(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def in_shell(name: str) -> str:
    """``name`` in the batch script's run directory, as a double-quoted shell word."""
    return f'"$RUN_DIR/{name}"'


# ------------------------------------------------------------------- the run root
def run_root(output_dir: str, name: str) -> str:
    """``OUTPUT_DIR/NAME`` as the batch script spells it (relative to the submit directory)."""
    return f"{output_dir.rstrip('/')}/{name}"


def slurm_log_pattern(run_root: str, array: bool = False) -> str:
    """The ``#SBATCH --output`` value: Slurm puts the job id where ``%j`` stands (an array's
    element: its array's id and its index, ``%A_%a``, its element id)."""
    return f"{run_root}/{SLURM_LOG.format(job_id='%A_%a' if array else '%j')}"


def shell_run_name(array: bool = False) -> str:
    """The run directory's name in the batch script (a double-quoted shell word)."""
    return SHELL_ELEMENT_NAME if array else SHELL_RUN_NAME


def element_id(array_job_id: str, index: int) -> str:
    """The id Slurm shows for element ``index`` of job array ``array_job_id``, and the name of
    that element's run directory: ``123_4``."""
    return f"{array_job_id}_{index}"


@dataclass(frozen=True)
class RunRoot:
    """``OUTPUT_DIR/NAME``: every run of one job name, and what they share."""
    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def of(cls, output_dir: str | Path, name: str) -> "RunRoot":
        return cls(Path(output_dir) / name)

    def run(self, job_id: str) -> "RunDir":
        return RunDir(self.path / job_id)

    def local(self, stamp: str) -> "RunDir":
        """A run in this process, without Slurm (``hpcsuite.api.run``)."""
        return RunDir(self.path / LOCAL / stamp)

    def slurm_log(self, job_id: str) -> Path:
        return self.path / SLURM_LOG.format(job_id=job_id)

    def staged_script(self, stamp: str) -> Path:
        """The script between writing it and sbatch's job id (then it moves to ``job.sbatch``)."""
        return self.path / f".submit-{stamp}.sbatch"

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS


# ------------------------------------------------------------------- one run
@dataclass(frozen=True)
class RunDir:
    """One job's run directory, ``OUTPUT_DIR/NAME/JOBID``."""
    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @property
    def root(self) -> RunRoot:
        return RunRoot(self.path.parent)

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
        return self.path / ready_name(attempt)

    def ready_mark(self, attempt: int | str, rank: int) -> Path:
        return self.ready(attempt) / ready_mark_name(rank)

    def stop_requested(self, attempt: int | str) -> Path:
        return self.path / stop_requested_name(attempt)

    def failed(self, attempt: int | str) -> Path:
        return self.path / failed_name(attempt)

    def startup(self, attempt: int | str) -> Path:
        return self.path / startup_name(attempt)

    def startup_word(self, attempt: int | str, rank: int) -> Path:
        return self.startup(attempt) / rank_record_name(rank)

    def attempt_file(self, attempt: int | str, kind: str, who: int | str) -> Path:
        return self.startup(attempt) / f"{kind}-{who}.json"   # net-NODE, note-RANK

    def startup_words(self, attempt: int | str) -> list[Path]:
        return sorted(self.startup(attempt).glob(rank_record_name("*")))

    def script_word(self, attempt: int | str, rank: int) -> Path:
        return self.path / script_word_name(attempt, rank)

    def script_words(self, attempt: int | str) -> list[Path]:
        return sorted(self.path.glob(script_word_name(attempt, "*")))

    def script_attempts(self) -> list[int]:
        return [int(p.name.split("-")[1]) for p in self.path.glob(f"{SCRIPT_WORDS}/attempt-*")
                if p.name.split("-")[1].isdigit()]

    def failed_markers(self) -> list[Path]:
        return sorted(self.path.glob(failed_name("*")))

    @staticmethod
    def is_outcome(name: str) -> bool:
        """A file whose appearance means the job has something to say: its results, or a
        failure (``submit --wait`` watches for them)."""
        return name == RESULTS or name.startswith(FAILED)

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
        return self.path / attempt_results_name(attempt)

    def attempt_results_files(self) -> dict[int, Path]:
        """Each attempt's results-attempt-N.json, by attempt number."""
        found = {}
        for path in self.path.glob(attempt_results_name("*")):
            m = _ATTEMPT_RESULTS.match(path.name)
            if m:
                found[int(m.group(1))] = path
        return dict(sorted(found.items()))

    def rank_record(self, rank: int) -> Path:
        return self.path / rank_record_name(rank)

    def monitor_failure(self, rank: int | str) -> Path:
        return self.path / MONITOR / rank_record_name(rank)

    @property
    def logs(self) -> Path:
        return self.path / LOGS

    def rank_log(self, rank: int) -> Path:
        return self.path / rank_log_name(rank)

    @property
    def ledger_dir(self) -> Path:
        return self.path / LEDGER

    def ledger(self, rank: int, attempt: int | str) -> Path:
        return self.path / ledger_name(rank, attempt)

    def ledger_files(self) -> dict[Path, int]:
        """Every rank's ledger file, sorted by name, with the attempt it is of."""
        files = sorted(self.path.glob(ledger_name("*", "*")))
        return {p: int(p.stem.rsplit("-", 1)[1]) for p in files}

    @property
    def tensorboard(self) -> Path:
        """The TensorBoard log directory (``tensorboard --logdir`` it)."""
        return self.path / TENSORBOARD

    def tensorboard_events(self, seconds: float, host: str, pid: int) -> Path:
        return self.path / tensorboard_events_name(seconds, host, pid)

    def tensorboard_files(self) -> list[Path]:
        """The event files, oldest attempt first."""
        return sorted(self.tensorboard.glob(f"{TENSORBOARD_EVENTS}.*"))

    def timeline_window(self, first: int, last: int) -> Path:
        return self.path / timeline_window_name(first, last)

    def timeline_windows(self) -> list[Path]:
        """The timeline windows, by the step each opens at."""
        found = [(steps[0], p) for p in self.path.glob(timeline_window_name("*", "*"))
                 if (steps := timeline_window_steps(p.name))]
        return [p for _, p in sorted(found, key=lambda f: f[0])]

    @property
    def allreduce(self) -> Path:
        return self.path / ALLREDUCE

    @property
    def allreduce_csv(self) -> Path:
        return self.path / ALLREDUCE_CSV

    @property
    def preflight(self) -> Path:
        return self.path / PREFLIGHT

    @property
    def mlflow(self) -> Path:
        return self.path / MLFLOW

    @property
    def mlruns(self) -> Path:
        return self.path / MLRUNS

    # beside it, in the run root
    def slurm_log(self, job_id: str) -> Path:
        return self.root.slurm_log(job_id)

    @property
    def default_checkpoints(self) -> Path:
        """Where the checkpoints go without ``train.checkpoint.dir``: shared by the job name."""
        return self.path.absolute().parent / CHECKPOINTS

    @property
    def default_mlruns(self) -> Path:
        """The MLflow file store without ``train.tracking.mlflow.uri``: shared by the job name."""
        return self.path.absolute().parent / MLRUNS

    @staticmethod
    def template_names() -> dict[str, str]:
        """The names the batch template writes and reads in ``$RUN_DIR`` (its ``rundir``),
        those of an attempt built with the shell's attempt number."""
        return {"env": ENV, "job": JOB, "job_staged": staged_name(JOB, SHELL_PID),
                "attempts": ATTEMPTS,
                "ready": ready_name(SHELL_ATTEMPT),
                "stop_requested": stop_requested_name(SHELL_ATTEMPT),
                "failed": failed_name(SHELL_ATTEMPT)}
