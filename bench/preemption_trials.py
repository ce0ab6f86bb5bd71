"""Preemption trials on the local Slurm cluster: a job preempted again and again, counted.

Each trial submits one 2-node training job (requeue on, checkpoints every few steps, the
sample ledger on) and preempts it P times at chosen moments, the way Slurm does before a time
limit or a preemption, by one of two routes (cycled with the moments, or chosen with --routes):
  signal        the warning signal to the batch shell (`scancel --signal=USR1 --batch`), as Slurm
                sends it before a time limit or a preemption with a grace time
  requeue       Slurm's own requeue (`scontrol requeue JOB`): SIGTERM to every process of the
                job with no warning, as PreemptMode=REQUEUE does; Slurm requeues the job
The moments cycle through
  random        a random time (0-3 s) after training began
  during-save   the moment a checkpoint save is seen in progress (its .tmp directory)
  startup       as soon as the requeued attempt's batch script starts, before any rank exists
                (the batch shell holds the signal until every rank can take it)
  after-resume  as soon as the ranks report the resume, in its first steps
With --unsaved N, N more jobs ask Slurm for the warning signal with nothing to save (no
checkpoint keys) and get it once, at random in training or at startup (as soon as the batch
script has made the run directory, before any rank exists): such a trial is clean when the job is not killed by the
signal (COMPLETED), the attempt is recorded as `stopped` at the step results.json ends at, with
no checkpoint, and neither results.json nor `status` claims a save.
The requeued job is started as soon as both nodes are idle again (Slurm otherwise holds a
requeued job for about two minutes). A trial is clean when the job completes, every sample of
every epoch was trained exactly once across all attempts (the committed ledger,
hpcsuite.runs.ledger), the final parameters are identical on all ranks, and the attempt records
show the P preemptions and one completion.

    .venv/bin/python bench/preemption_trials.py [-n 10] [-p 3] [--routes signal,requeue]
        [--backend torch] [--unsaved N] [--budget SECONDS]

Uses the running local cluster (`hpcsuite cluster up`, SLURM_CONF), or starts a private one
with --private. Prints one line per trial, the preemptions and clean trials of each route, and
"k of N clean" (of the trials completed, when
--budget or a stop signal cut the run short; the trial in flight is cancelled).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))      # tests/test_e2e_reliability.py loads this file too

from budget import Budget, cancel_jobs_under  # noqa: E402

MOMENTS = ("random", "during-save", "startup", "after-resume")
ROUTES = ("signal", "requeue")
SPEC = """name: trial
resources: {{nodes: 2, tasks_per_node: 1, time: "00:20:00"}}
train:
  backend: {backend}
  model: mlp
  data: {{samples: {samples}, shape: [1024], classes: 10}}
  batch_size: 32
  epochs: {epochs}
  checkpoint: {{every_steps: 25, keep: 2}}
  preemption: {{signal: USR1, requeue: true}}
  ledger: true
  seed: {seed}
"""


@contextlib.contextmanager
def cluster_env(port: int, private: bool):
    from hpcsuite.site.cluster import LocalCluster, cluster_dir

    running = LocalCluster(cluster_dir())
    conf = os.environ.get("SLURM_CONF") or (str(running.conf) if running.running() else None)
    if conf and not private:
        yield dict(os.environ, SLURM_CONF=conf), running
        return
    root = Path(tempfile.mkdtemp(prefix="hpcsuite-trials-cluster-"))
    cluster = LocalCluster(root, port=port)
    print(f"starting a private cluster in {root} (port {port})", file=sys.stderr)
    try:
        cluster.up(timeout=90)
        yield dict(os.environ, SLURM_CONF=str(cluster.conf), HPCSUITE_CLUSTER_DIR=str(root)), cluster
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


def cli(env: dict, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcsuite", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def state_of(env: dict, cwd: Path, job_id: str) -> dict:
    out = cli(env, cwd, "status", job_id, "--json")
    if out.returncode != 0:
        raise RuntimeError(f"hpcsuite status {job_id}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def steps_alive(job_id: str) -> bool:
    """A step of ``job_id`` (a plain job's id: an array element's steps carry its own) still
    has its slurmstepd on a node (all of the local cluster's nodes are this machine). A node
    set DOWN and resumed reads idle while its step of the lost attempt is still exiting; a job
    started again then never gets its first step: its srun waits for that node forever (seen
    in CI: Slurm's ~2 min hold exists for this)."""
    done = subprocess.run(["pgrep", "-f", rf"^slurmstepd: \[{job_id}\."],
                          capture_output=True)
    return done.returncode == 0


def hurry_requeued(env: dict, cluster, job_id: str, state: dict) -> None:
    """Start a requeued job now that both nodes are idle and its lost attempt's steps have
    exited (not after Slurm's ~2 min hold)."""
    if state["state"] == "PENDING" and state.get("reason") == "BeginTime" \
            and set(cluster.node_states().values()) == {"idle"} and not steps_alive(job_id):
        time.sleep(1)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env,
                       capture_output=True)


def wait_until(predicate, timeout: float, env, cluster, job_id, cwd, poll: float = 0.01) -> bool:
    """Poll ``predicate`` (cheap: files) until true; hurry a requeued job meanwhile."""
    deadline = time.monotonic() + timeout
    checked = 0.0
    while time.monotonic() < deadline:
        if predicate():
            return True
        if time.monotonic() - checked > 1.0:
            checked = time.monotonic()
            state = state_of(env, cwd, job_id)
            if state["state"] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED"):
                return False
            hurry_requeued(env, cluster, job_id, state)
        time.sleep(poll)
    return False


def attempt_lines(log: Path, attempt: int) -> str:
    """The log of ``attempt`` (a requeued job appends to the same file)."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    marker = f"hpcsuite: attempt {attempt} of job" if attempt else ""
    return text[text.find(marker):] if marker and marker in text else ("" if attempt else text)


def preempt_once(env, cluster, work: Path, job_id: str, attempt: int, moment: str,
                 rng: random.Random, route: str = "signal") -> str:
    """Preempt attempt ``attempt`` at ``moment`` by ``route``; what was actually hit."""
    run_dir = work / "runs" / "trial" / job_id
    log = work / "runs" / "trial" / f"slurm-{job_id}.out"
    ckpt = work / "runs" / "trial" / "checkpoints"
    def rank0(text: str) -> bool:
        path = run_dir / "logs" / "rank-0.log"
        if not path.is_file():
            return False
        parts = path.read_text(errors="replace").split(f"attempt {attempt} on")
        return len(parts) > 1 and text in parts[-1]

    if moment == "startup" and attempt:
        hit = wait_until(lambda: f"hpcsuite: attempt {attempt} of job" in
                         (log.read_text(errors="replace") if log.is_file() else ""),
                         300, env, cluster, job_id, work, poll=0.005)
        what = "startup (before the ranks)"
    elif moment == "after-resume" and attempt:
        hit = wait_until(lambda: rank0("resuming from"), 300, env, cluster, job_id, work, poll=0.005)
        what = "after resume"
    else:
        hit = wait_until(lambda: rank0("training:"), 300, env, cluster, job_id, work)
        if moment == "during-save":
            hit = hit and wait_until(lambda: any(ckpt.glob(".tmp-step-*")), 60, env, cluster,
                                     job_id, work, poll=0.0005)
            what = "during a save" if hit else "no save seen"
        else:
            time.sleep(rng.uniform(0, 3))
            what = "random"
    if not hit:
        return f"{moment}: never reached"
    if route == "requeue":
        subprocess.run(["scontrol", "requeue", job_id], env=env, capture_output=True)
    else:
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env,
                       capture_output=True)
    return what


def check(work: Path, job_id: str, samples: int, epochs: int, preemptions: int) -> list[str]:
    from hpcsuite.runs import attempts, ledger
    from hpcsuite.runs.results import Results

    run_dir = work / "runs" / "trial" / job_id
    problems = ledger.exactly_once([run_dir], samples, epochs)
    results = Results.load(run_dir / "results.json")
    if results.status != "completed":
        problems.append(f"final status {results.status}")
    if len(set(results.param_checksums)) != 1 or len(results.param_checksums) != results.world_size:
        problems.append(f"parameters differ across ranks: {results.param_checksums}")
    records = attempts.read_records(run_dir)
    c = attempts.counts(records)
    if (c.preempted, c.completed, c.failed) != (preemptions, 1, 0):
        problems.append(f"attempt records: {c.in_words()} ({[r['outcome'] for r in records]})")
    return problems


def trial(env: dict, cluster, work: Path, preemptions: int, seed: int, backend: str = "torch",
          samples: int = 8000, epochs: int = 24, moments=MOMENTS, routes=("signal",)) -> dict:
    """One job preempted ``preemptions`` times; {clean, problems, moments, routes, seconds}."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "trial.yaml"
    spec.write_text(SPEC.format(backend=backend, samples=samples, epochs=epochs, seed=seed))
    out = cli(env, work, "submit", str(spec))
    if out.returncode != 0:
        return {"clean": False, "problems": [f"submit: {out.stderr.strip()}"], "moments": []}
    job_id = out.stdout.strip()
    hit, used = [], []
    for k in range(preemptions):
        moment = moments[(seed + k) % len(moments)]
        route = routes[(seed + k) % len(routes)]
        if k == 0 and moment in ("startup", "after-resume"):
            moment = "random"          # attempt 0 has no resume before it
        if route == "requeue" and moment == "startup":
            moment = "random"          # Slurm's requeue of a batch script not yet launching: not tried
        used.append(route)
        hit.append(preempt_once(env, cluster, work, job_id, k, moment, rng, route))
        # The next attempt exists once this one recorded its end.
        wait_until(lambda: any(r.get("attempt") == k for r in _records(work, job_id)),
                   300, env, cluster, job_id, work, poll=0.1)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        state = state_of(env, work, job_id)
        if state["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            break
        hurry_requeued(env, cluster, job_id, state)
        time.sleep(1)
    if state["state"] != "COMPLETED":
        problems = [f"job ended {state['state']}"]
    else:
        try:
            problems = check(work, job_id, samples, epochs, preemptions)
        except Exception as e:  # noqa: BLE001 - a damaged record is a finding, not a crash
            problems = [f"{type(e).__name__}: {e}"]
    return {"job_id": job_id, "clean": not problems, "problems": problems, "moments": hit,
            "routes": used, "seconds": time.monotonic() - t0}


# The trials' job with nothing to save: no checkpoint keys, no ledger, Slurm's warning signal.
UNSAVED_SPEC = SPEC.replace("  checkpoint: {{every_steps: 25, keep: 2}}\n", "") \
    .replace("requeue: true", "lead_seconds: 60").replace("  ledger: true\n", "")


def unsaved_trial(env: dict, cluster, work: Path, seed: int, backend: str = "torch",
                  samples: int = 8000) -> dict:
    """One job with nothing to save, given the warning signal once; {clean, problems, ...}."""
    from hpcsuite.runs import attempts
    from hpcsuite.runs.results import Results

    rng = random.Random(seed)
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "trial.yaml"
    spec.write_text(UNSAVED_SPEC.format(backend=backend, samples=samples, epochs=24, seed=seed))
    out = cli(env, work, "submit", str(spec))
    if out.returncode != 0:
        return {"clean": False, "problems": [f"submit: {out.stderr.strip()}"], "moments": []}
    job_id = out.stdout.strip()
    log = work / "runs" / "trial" / f"slurm-{job_id}.out"
    moment = ("random", "startup")[seed % 2]
    if moment == "startup":
        # The run directory is made after the template's trap: the batch script runs and no
        # rank exists yet. (Before its first lines no shell can catch the signal: bash's
        # default action ends it, exit 0:10, which status names.)
        run_dir = work / "runs" / "trial" / job_id
        hit = wait_until(lambda: run_dir.is_dir(), 300, env, cluster, job_id, work, poll=0.005)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, capture_output=True)
        what = "startup (before the ranks)"
    else:
        what = preempt_once(env, cluster, work, job_id, 0, "random", rng)
        hit = "never" not in what
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        state = state_of(env, work, job_id)
        if state["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            break
        time.sleep(1)
    problems = [] if hit else [f"{moment}: never reached"]
    run_dir = work / "runs" / "trial" / job_id
    try:
        if state["state"] != "COMPLETED":
            problems.append(f"job ended {state['state']} (exit {state.get('exit_code')})")
        records = attempts.read_records(run_dir)
        results = Results.load(run_dir / "results.json")
        if [r["outcome"] for r in records] != ["stopped"]:
            problems.append(f"attempt records: {[r['outcome'] for r in records]}")
        elif records[0].get("step") != results.final_step or records[0].get("checkpoint_step") is not None:
            problems.append(f"attempt record {records[0]} against results at step {results.final_step}")
        if results.status != "stopped" or results.checkpoints or results.stop.get("saved") is not False:
            problems.append(f"results: status {results.status}, checkpoints {results.checkpoints}, "
                            f"stop {results.stop}")
        text = cli(env, work, "status", job_id).stdout
        if "checkpoint saved" in text.replace("no checkpoint saved", ""):
            problems.append("status claims a checkpoint")
    except Exception as e:  # noqa: BLE001 - a damaged record is a finding, not a crash
        problems.append(f"{type(e).__name__}: {e}")
    return {"job_id": job_id, "clean": not problems, "problems": problems, "moments": [what],
            "routes": ["unsaved"], "seconds": time.monotonic() - t0}


def _records(work: Path, job_id: str) -> list[dict]:
    from hpcsuite.runs import attempts
    from hpcsuite.errors import UserError

    try:
        return attempts.read_records(work / "runs" / "trial" / job_id)
    except UserError:
        return []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--trials", type=int, default=10)
    ap.add_argument("-p", "--preemptions", type=int, default=3, help="per trial")
    ap.add_argument("--routes", default=",".join(ROUTES),
                    help=f"preemption routes to cycle through, comma-separated ({', '.join(ROUTES)})")
    ap.add_argument("--backend", choices=("torch", "tensorflow"), default="torch")
    ap.add_argument("--unsaved", type=int, default=0, metavar="N",
                    help="then N jobs with nothing to save, each given the warning signal once")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--private", action="store_true", help="start a private cluster")
    ap.add_argument("--port", type=int, default=17117)
    ap.add_argument("--keep", action="store_true", help="keep the trials' directories")
    Budget.add_argument(ap, 1080, "trials")
    args = ap.parse_args(argv)
    routes = tuple(r.strip() for r in args.routes.split(",") if r.strip())
    if not routes or set(routes) - set(ROUTES):
        ap.error(f"--routes: choose from {', '.join(ROUTES)} (got {args.routes!r})")
    budget = Budget.from_args(args)
    by_route = {r: [0, 0, 0] for r in routes}    # preemptions, trials with it, clean ones
    if args.unsaved:
        by_route["unsaved"] = [0, 0, 0]
    base = Path(tempfile.mkdtemp(prefix="hpcsuite-trials-"))
    clean = done = 0
    with budget.watch(), cluster_env(args.port, args.private) as (env, cluster):
        try:
            for i in budget.each(range(args.trials + args.unsaved)):
                if i < args.trials:
                    r = trial(env, cluster, base / f"t{i}", args.preemptions, args.seed + i,
                              args.backend, routes=routes)
                else:
                    r = unsaved_trial(env, cluster, base / f"t{i}", args.seed + i, args.backend)
                clean += r["clean"]
                for route in by_route:
                    n = r.get("routes", []).count(route)
                    by_route[route][0] += n
                    by_route[route][1] += n > 0
                    by_route[route][2] += n > 0 and r["clean"]
                done += 1
                print(f"trial {i + 1}: job {r.get('job_id')}, {'clean' if r['clean'] else 'NOT CLEAN'}"
                      f" in {r.get('seconds', 0):.0f}s; preempted: "
                      f"{', '.join(f'{m} ({w})' for m, w in zip(r['moments'], r.get('routes', [])))}"
                      + (f"; {'; '.join(r['problems'])}" if r["problems"] else ""), flush=True)
        finally:
            if budget.stopped_by:
                cancel_jobs_under(env, base)
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    budget.report(done, args.trials + args.unsaved, "trials")
    for route, (n, trials_with, clean_with) in by_route.items():
        print(f"route {route}: {n} preemptions in {trials_with} trials, {clean_with} of them clean")
    print(f"{clean} of {done} clean ({args.preemptions} preemptions each, "
          f"backend {args.backend})")
    if args.keep:
        print(f"trial directories: {base}")
    return budget.exit_code(0 if clean == done else 1)


if __name__ == "__main__":
    sys.exit(main())
