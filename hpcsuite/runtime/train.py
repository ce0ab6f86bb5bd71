"""`hpcsuite train`: what every rank runs inside the job.

In order: catch the preemption signals (before the seconds of importing a framework), read the
job, then either the managed loop (:mod:`hpcsuite.runtime.session.loop`) or the user's own script (script mode, with
:mod:`hpcsuite.api`). A mistake in user code ends this rank at once with the user's traceback,
printed by the first rank that fails (the others say one line), so the launcher ends the whole
job in seconds instead of it waiting for a collective until the walltime.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path

from ..errors import UserError, count
from ..runs.attempts import attempt_number
from ..runs.results import mark_failed
from ..runs.rundir import ENV, RunDir
from ..submit.spec import JobSpec
from ..world import current
from .frameworks.managed import make_backend
from .rank import startup
from .observe.lifecycle import Lifecycle
from .rank.job_io import hostname, load_job, publish
from .observe.monitor import end_all
from .rank.placement import place
from .rank.shm import private_shm
from .rank.signals import FLAG, announce_ready
from .rank.userframes import user_site, user_traceback

log = logging.getLogger(__name__)

def main(job_path: str) -> None:
    job = load_job(job_path)
    FLAG.install([job.train.preemption.signal, "TERM"])
    run_dir = Path(os.environ.get(ENV) or Path(job_path).parent)
    world = current()                  # read once: who started this rank, where, in which job
    rank = world.rank
    announce_ready(run_dir, rank)
    log_format = f"%(asctime)s rank {rank} %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=log_format,
                        force=True)   # the CLI configured WARNING level for login-node use
    rank_log(run_dir, rank, log_format)
    # The startup, failure and network watches, started together; stopped together when
    # training is over (runtime/observe/lifecycle.py), which the loop or the script says.
    watch = Lifecycle(run_dir, world, job.train.startup_timeout_seconds, bool(job.train.script),
                      lambda text, code: fail(run_dir, rank, text, code=code)).start()
    try:
        placed = place(job, world.local_rank)     # before a framework sees the GPUs
    except UserError as e:                             # ranks sharing a GPU, not meant
        fail(run_dir, rank, f"error: {e}", code=2)
    if placed:
        log.info("GPU placement: %s", placed)
    shm = private_shm()                            # before MPI starts (Horovod's init)
    if shm:
        log.info("%s", shm)
    try:
        if job.train.script:
            from .script.script import run_script
            run_script(job, run_dir, watch)
        else:
            run_managed(job, run_dir, watch)
    except UserError as e:
        fail(run_dir, rank, f"error: {e}", code=2)
    except SystemExit as e:   # the user's script called sys.exit
        if e.code not in (None, 0):
            fail(run_dir, rank, f"the script exited with {e.code!r}", code=e.code if
                 isinstance(e.code, int) else 1)
    except BaseException as e:  # noqa: BLE001 - user code can raise anything
        fail(run_dir, rank, user_traceback(e), code=1,
             key=getattr(e, "hpcsuite_key", None) or blame_by_frames(job, e), exc=e)
    watch.over()             # stepped or not, training is over (if not said already)
    FLAG.retire()   # done and recorded: a late preemption signal must not fail the job


RANK_LOG = "hpcsuite-rank-log"   # the name of this rank's log handler on the root logger


def rank_log(run_dir: Path, rank: int, log_format: str) -> None:
    """This rank's log records also go to ``logs/rank-N.log`` in the run directory (`hpcsuite
    logs RUN --rank N`); every attempt of a requeued job appends to it."""
    try:
        path = RunDir(run_dir).rank_log(rank)
        path.parent.mkdir(exist_ok=True)
        handler = logging.FileHandler(path)
    except OSError as e:
        log.warning("no rank log in %s: %s", RunDir(run_dir).logs, e.strerror)
        return
    handler.setFormatter(logging.Formatter(log_format))
    handler.set_name(RANK_LOG)      # the root logger holds it: fail() finds it there
    logging.getLogger().addHandler(handler)
    log.info("attempt %s on %s", attempt_number(), hostname())


def run_managed(job: JobSpec, run_dir: Path, watch=startup.OFF) -> None:
    from .session.loop import Trainer

    backend = make_backend(job, watch)
    # No shutdown on an error: the failing rank reports first (fail()), then ends; shutting
    # Horovod down before that would fail the other ranks' collectives with Horovod's own
    # traceback ahead of the real error.
    trainer = Trainer(job, run_dir, backend, watch=watch)
    per_rank, results = trainer.run()
    # Recorded before Horovod shuts down: when Slurm ends the job (scontrol requeue, a
    # preemption without the warning signal) mpirun takes SIGTERM too and exits at once, and
    # the shutdown of ranks it left behind waits for it until Slurm kills them.
    path = finish(run_dir, per_rank, results)
    if results is not None:
        trainer.session.track_results(path, results.status)
    backend.shutdown()


def finish(run_dir: Path, per_rank: dict, results) -> Path | None:
    """Write this rank's record; on rank 0 also results.json and the preemption marker that
    the template's requeue logic reads (returns results.json's path there)."""
    from ..runs.results import write_json_atomic

    write_json_atomic(RunDir(run_dir).rank_record(per_rank["rank"]), per_rank)
    if results is None:
        return None
    results.versions["slurm"] = slurm_version()
    results.versions["python"] = sys.version.split()[0]
    path = publish(run_dir, results)
    print(f"hpcsuite train: {results.status} at step {results.final_step}; wrote {path} "
          f"({results.samples_per_s:.1f} samples/s on {count(results.world_size, 'rank')})", flush=True)
    return path


def slurm_version() -> str | None:
    """``srun --version`` for results.json, or None: training is over by now, so a rank whose
    PATH has no Slurm clients (a container image without them, a machine outside Slurm) or
    whose srun fails still writes its results; the reason is logged."""
    from .. import slurm

    try:
        done = slurm.call(["srun", "--version"], check=False, timeout=10, env=dict(os.environ))
    except (UserError, OSError) as e:
        log.warning("results.json without the Slurm version: %s", e)
        return None
    if done.returncode != 0:
        log.warning("results.json without the Slurm version: srun --version exit %d",
                    done.returncode)
        return None
    return done.stdout.strip() or None


def blame_by_frames(job: JobSpec, exc: BaseException) -> str | None:
    """The spec key whose file raised ``exc`` during training (the model's forward, a loss, a
    dataset's ``ds[ids]``): the innermost traceback frame in a file a spec key names."""
    from .. import usercode

    t = job.train
    refs = [("train.model", t.model), ("train.loss", t.loss), ("train.data.factory", t.data.factory)]
    if t.eval is not None and t.eval.data is not None:
        refs.append(("train.eval.data.factory", t.eval.data.factory))
    files = {}
    for key, text in refs:
        ref = usercode.parse(text) if text else None
        try:
            path = usercode.locate(ref, usercode.search_dirs(t.pythonpath)) if ref else None
        except LookupError:
            path = None
        if path is not None:
            files.setdefault(str(path.resolve()), f"{key} ({text})")
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        try:
            found = files.get(str(Path(frame.filename).resolve()))
        except OSError:
            found = None
        if found:
            return found
    return None


def raised_line(exc: BaseException) -> str:
    """The exception's type (with its module, but a builtin's) and message on one line."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else \
        f"{kind.__module__}.{kind.__qualname__}"
    said = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if said and said[0] == "in user code:":    # TensorFlow's tf.function: its error comes last
        return said[-1] if said[-1].startswith(f"{kind.__name__}: ") else f"{name}: {said[-1]}"
    message = " ".join(" ".join(said).split())
    return f"{name}: {message[:500]}" if message else name


def known_hint(exc: BaseException) -> str | None:
    """Where the docs answer a known failure of users' scripts, or None."""
    from .script.script_hints import hint

    return hint(raised_line(exc))


def fail(run_dir: Path, rank: int, text: str, code: int, key: str | None = None,
         exc: BaseException | None = None) -> None:
    """Report a failure once for the whole job and end this rank now.

    The first rank to fail creates FAILED in the run directory (with its node and, for an
    exception ``exc``, its type and message, the user's file:line and a hint for a known
    one: what ``submit --wait`` and ``status`` say) and prints everything; a rank that fails
    after it prints one line. Each in one write, so that the launcher, which forwards every
    rank's stderr, cannot cut it. ``os._exit``: a clean exit would wait in Horovod's shutdown
    for ranks that are still waiting for this one."""
    head = f"hpcsuite train: rank {rank} on {hostname()} failed" + (f" in {key}" if key else "")
    last = text.strip().splitlines()[-1] if text.strip() else ""
    hint = known_hint(exc) if exc is not None else None
    if hint:
        text = f"{text}\n{hint}"
    marker = RunDir(run_dir).failed(attempt_number())
    first = mark_failed(marker, rank, code, text, node=hostname(),
                        raised=raised_line(exc) if exc is not None else None,
                        at=user_site(exc) if exc is not None else None, hint=hint)
    for handler in logging.getLogger().handlers:   # the rank's own log (not its stderr: below)
        if handler.get_name() == RANK_LOG:
            handler.handle(logging.LogRecord(log.name, logging.ERROR, __file__, 0, "%s:\n%s",
                                             (head, text), None))
    if first:
        say(f"{head}:\n{text}\n")
    else:
        # Its lines may reach the job's log before the first rank's: not "above".
        say(f"{head} too ({last}); {first_failure(marker)} is reported in this log and in "
            f"{marker}\n")
    end_all("failed")         # the Prometheus textfile says the rank ended (train.monitor)
    os._exit(code)


def first_failure(marker: Path) -> str:
    """``rank R's failure, the first,`` from the marker that rank wrote."""
    try:
        first = marker.read_text(errors="replace").partition("\n")[0]
    except OSError:
        first = ""
    return f"{first}'s failure, the first," if first.startswith("rank ") else "the first failure"


def say(text: str) -> None:
    """``text`` to stderr in one write (after what Python buffered), whole lines only."""
    sys.stdout.flush()
    sys.stderr.flush()
    data = text.encode(errors="replace")
    while data:
        try:
            data = data[os.write(2, data):]
        except OSError:
            return
