"""Weak scaling 1 -> 2 nodes on the local Slurm cluster: hpcsuite against a plain Horovod loop
at the same configuration, and against the no-communication limit, in the same run.

For each per-rank batch (the default study configuration's, then the bigger ones the study
report recommends) and each repeat, back to back, on 1 and on 2 nodes (one rank per node):
  hpcsuite    `hpcsuite submit` of examples/scaling/job.yaml (managed loop, sharded data)
  limit       the same with train.horovod.allreduce=false (no gradient exchange; 2 nodes only,
              one rank has nothing to exchange)
  plain       bench/plain_loop.py, one fixed batch (Horovod's synthetic benchmarks)
  plain+data  bench/plain_loop.py --fresh-data: a new batch every step, gathered by sample ids
              from as many samples in memory as the job's dataset (what a loop that trains on
              data reads; hpcsuite does the same through its sharding layer)
and, only where --kinds names them, two that take hpcsuite's job apart where it and plain+data
differ:
  script      hpcsuite's rendered batch script for the same job under plain `sbatch --wait`
              (no `hpcsuite submit --wait` following the job from the login side)
  train       `hpcsuite train` on the same job.json, launched by the plain loops' script (no
              attempt records, no setting of the rendered script the plain one lacks)
Within a repeat the kinds run back to back, starting with a different one each repeat.
The plain loops run under an sbatch script with the mpirun line hpcsuite renders for this job
(MCA parameters, Horovod settings, and the MPI wait mode: with one core per rank both sides
yield while waiting, as hpcsuite's scripts do; --spin turns it off on both sides).
All report steady-state samples/s with the same warm-up rule. Printed: medians [min-max], the
ratios of the medians, and per repeat the ratios of the jobs that ran back to back.

    .venv/bin/python bench/weak_scaling.py [--backend torch] [--batches 128,512] [-r 7]
        [--nodes 1,2] [--kinds hpcsuite,plain,plain+data,limit,script,train] [--budget SECONDS]

--nodes and --kinds narrow a re-measurement to the points and baselines it is about (a round
of 1 node with hpcsuite and plain+data alone is two jobs instead of three).

Needs the local cluster (`hpcsuite cluster up`); SLURM_CONF is taken from its state. A round is
one batch, node count and repeat (its jobs back to back); the rounds go repeat by repeat over
the points. When --budget or a stop signal cuts the run short, the jobs in flight are cancelled
and the completed rounds are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import product
from pathlib import Path

from budget import Budget, cancel_jobs_under, run_group
from hpcsuite.runner import prepare
from hpcsuite.runs import rundir
from hpcsuite.runs.rundir import RunDir
from hpcsuite.sweep.run import job_json

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
BASE = ROOT / "examples" / "scaling" / "job.yaml"


def cluster_env() -> dict:
    env = dict(os.environ)
    if "SLURM_CONF" not in env:     # the local cluster: start it, take its client settings
        subprocess.run([PY, "-m", "hpcsuite", "cluster", "up"], capture_output=True, check=True)
        out = subprocess.run([PY, "-m", "hpcsuite", "cluster", "env"], capture_output=True,
                             text=True, check=True).stdout
        for line in out.splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0]
    return env


def job_sets(work: Path, backend: str, nodes: int, batch: int, steps: int, allreduce: bool,
             cycle: float, spin: bool = False) -> list[str]:
    """The KEY=VALUE overrides (`--set`) of the hpcsuite job at one point."""
    sets = [f"train.horovod.cycle_time_ms={cycle:g}", f"resources.nodes={nodes}",
            f"train.backend={backend}", f"train.batch_size={batch}",
            f"train.max_steps={steps}", "train.epochs=1000000", f"output_dir={work}/runs",
            f"train.horovod.allreduce={'true' if allreduce else 'false'}"]
    if spin:
        sets.append("env.OMPI_MCA_mpi_yield_when_idle=0")
    return sets


def hpcsuite_run(env, work: Path, *job) -> tuple[float, float]:
    argv = [PY, "-m", "hpcsuite", "submit", str(BASE), "--wait", "--json"]
    argv += [arg for s in job_sets(work, *job) for arg in ("--set", s)]
    done = run_group(argv, capture_output=True, text=True, env=env, cwd=work, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"hpcsuite job failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    r = json.loads(done.stdout)["results"]
    return r["samples_per_s_steady"], r["step_time_s"]["median"]


def request(env, work: Path, *job):
    """What `hpcsuite submit` would submit for the job hpcsuite_run submits (the cluster's site
    profile, the same overrides): its script, run root and resolved job."""
    return prepare(str(BASE), env.get("HPCSUITE_PROFILE"), None, job_sets(work, *job), cwd=work).request


def run_results(run_dir: Path, what: str, done) -> tuple[float, float]:
    try:
        r = json.loads(RunDir(run_dir).results.read_text())
        return r["samples_per_s_steady"], r["step_time_s"]["median"]
    except (OSError, ValueError, KeyError):
        raise SystemExit(f"{what} failed (sbatch exit {done.returncode}; no results in {run_dir}):"
                         f"\n{done.stderr[-2000:]}") from None


def sbatch_wait(env, work: Path, script: Path):
    # Submitted from work, as the hpcsuite jobs are: a cut run cancels the jobs under it.
    return run_group(["sbatch", "--parsable", "--wait", str(script)], capture_output=True,
                     text=True, env=env, cwd=work, timeout=900)


def script_run(env, work: Path, *job) -> tuple[float, float]:
    """hpcsuite's rendered script, submitted and followed by sbatch alone."""
    r = request(env, work, *job)
    script = work / "rendered.sbatch"
    script.write_text(r.script)
    done = sbatch_wait(env, work, script)
    job_id = done.stdout.strip().split(";")[0]
    return run_results(work / r.run_root / job_id, "rendered script", done)


def train_run(env, work: Path, *job) -> tuple[float, float]:
    """`hpcsuite train` on the rendered job.json, under the plain loops' script."""
    run_dir = work / f"train-{time.monotonic_ns()}"
    run_dir.mkdir()
    RunDir(run_dir).job.write_text(job_json(request(env, work, *job).job))
    command = f"-x {rundir.ENV} {PY} -m hpcsuite train --job {RunDir(run_dir).job}"
    _, nodes, _, _, _, cycle, spin = job
    script = plain_script(work, run_dir / "slurm.out", nodes, cycle, spin, command,
                          f"export {rundir.ENV}={run_dir}", env.get("HPCSUITE_PROFILE"))
    return run_results(run_dir, "hpcsuite train under the plain script",
                       sbatch_wait(env, work, script))


PLAIN = """#!/bin/bash
#SBATCH --job-name=plain-weak
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time=00:10:00
#SBATCH --output={out}
export OMP_NUM_THREADS=1 HOROVOD_FUSION_THRESHOLD=67108864 HOROVOD_CYCLE_TIME={cycle:g}
export TF_CPP_MIN_LOG_LEVEL=2
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_mpi_yield_when_idle={yield_}
{export}
mpirun -np {nodes} -npernode 1 --map-by slot --bind-to none --mca pml ob1 --mca btl '^openib' \\
  -x PATH -x OMP_NUM_THREADS -x HOROVOD_FUSION_THRESHOLD -x HOROVOD_CYCLE_TIME -x TF_CPP_MIN_LOG_LEVEL \\
  -x OMPI_MCA_mpi_yield_when_idle \\
  {command}
"""


def profile_env(path: str | None) -> str:
    """``export`` lines for the site profile's `env:` (HPCSUITE_PROFILE), which hpcsuite's
    scripts export too: on a fabric cluster (`cluster up --fabric`) Open MPI's TCP settings,
    which mpirun passes on to the ranks (without them its put protocol carries about 2/3 of
    the link, docs/BENCHMARKS.md "A shaped link between the nodes")."""
    import yaml

    try:
        values = (yaml.safe_load(Path(path).read_text()) or {}).get("env") or {} if path else {}
    except (OSError, yaml.YAMLError, AttributeError):
        values = {}
    return "\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in sorted(values.items()))


def plain_script(work: Path, out: Path, nodes: int, cycle: float, spin: bool, command: str,
                 export: str = "", profile: str | None = None) -> Path:
    """The plain loops' batch script, running ``command`` on every rank, with the site
    profile's environment (``profile``'s, :func:`profile_env`)."""
    export = "\n".join(line for line in (profile_env(profile), export) if line)
    script = work / "plain.sbatch"
    script.write_text(PLAIN.format(nodes=nodes, out=out, cycle=cycle, yield_=0 if spin else 1,
                                   export=export, command=command))
    return script


def plain_run(env, work: Path, backend: str, nodes: int, batch: int, steps: int, shape: int,
              cycle: float, fresh: int | None, spin: bool = False) -> tuple[float, float]:
    out = work / f"plain-{time.monotonic_ns()}.out"
    command = (f"{PY} {ROOT / 'bench' / 'plain_loop.py'} --backend {backend} --model mlp "
               f"--shape {shape} --classes 10 --batch {batch} --steps {steps}"
               + (f" --fresh-data --samples {fresh}" if fresh else ""))
    done = sbatch_wait(env, work, plain_script(work, out, nodes, cycle, spin, command,
                                               profile=env.get("HPCSUITE_PROFILE")))
    text = out.read_text() if out.is_file() else ""
    for line in text.splitlines():
        if line.startswith("{") and "samples_per_s_steady" in line:
            r = json.loads(line)
            return r["samples_per_s_steady"], r["step_median_s"]
    raise SystemExit(f"plain loop failed (sbatch exit {done.returncode}):\n{text[-2000:]}{done.stderr}")


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):9.0f} [{min(values):.0f}-{max(values):.0f}]"


KINDS = ("hpcsuite", "plain", "plain+data", "limit", "script", "train")
DEFAULT_KINDS = KINDS[:4]


def one_round(env, work: Path, a, batch: int, nodes: int, r: int, shape: int,
              samples: int) -> dict[str, tuple[float, float]]:
    """Repeat ``r`` at one batch and node count: each kind's job, back to back."""
    common = (a.backend, nodes, batch, a.steps)
    runs = {
        "hpcsuite": lambda: hpcsuite_run(env, work, *common, True, a.cycle_time, a.spin),
        "plain": lambda: plain_run(env, work, *common, shape, a.cycle_time, None, a.spin),
        "plain+data": lambda: plain_run(env, work, *common, shape, a.cycle_time, samples, a.spin),
        "limit": lambda: hpcsuite_run(env, work, *common, False, a.cycle_time, a.spin),
        "script": lambda: script_run(env, work, *common, True, a.cycle_time, a.spin),
        "train": lambda: train_run(env, work, *common, True, a.cycle_time, a.spin),
    }
    kinds = [k for k in a.kinds if nodes > 1 or k != "limit"]
    # Each repeat starts with another kind: the job that runs first after a switch (of node
    # count or batch) is not always the same one.
    return {kind: runs[kind]() for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]}


def absent(kind: str, nodes: int) -> str:
    """A table cell for a kind with no runs at this point."""
    return "(itself)" if kind == "limit" and nodes == 1 else "(not run)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["torch", "tensorflow"], default="torch")
    ap.add_argument("--batches", default="128,512", help="per-rank batches, comma-separated")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("-r", "--repeats", type=int, default=7)
    ap.add_argument("--cycle-time", type=float, default=1.0,
                    help="HOROVOD_CYCLE_TIME in ms on both sides (hpcsuite's default: 1)")
    ap.add_argument("--spin", action="store_true",
                    help="MPI busy-polls while waiting, on both sides (OpenMPI's default; "
                         "hpcsuite's scripts make ranks with one core yield)")
    ap.add_argument("--nodes", default="1,2", help="node counts, comma-separated (1, 2 or both)")
    ap.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                    help="the kinds to run, comma-separated; hpcsuite always runs (default: "
                         f"{','.join(DEFAULT_KINDS)})")
    Budget.add_argument(ap, 1080, "rounds")
    a = ap.parse_args()
    try:
        a.nodes = sorted({int(n) for n in a.nodes.split(",")})
    except ValueError:
        ap.error(f"--nodes: {a.nodes!r} is not a comma-separated list of node counts")
    if not a.nodes or not set(a.nodes) <= {1, 2}:
        ap.error(f"--nodes: the local cluster has nodes 1 and 2, not {a.nodes}")
    asked = set(a.kinds.split(","))
    if asked - set(KINDS):
        ap.error(f"--kinds: {', '.join(sorted(asked - set(KINDS)))} unknown (one of {', '.join(KINDS)})")
    a.kinds = [k for k in KINDS if k in asked | {"hpcsuite"}]
    budget = Budget.from_args(a)
    env = cluster_env()
    import yaml

    data = yaml.safe_load(BASE.read_text())["train"]["data"]
    shape, samples = data["shape"][0], data["samples"]
    results: dict = {}
    step_ms: dict = {}     # (batch, nodes) -> kind -> each job's median step, ms
    # Repeat by repeat over every point, so a run the budget cuts short has as many repeats of
    # each point (give or take one) rather than all of the first and none of the last.
    rounds = [(b, r, n) for r, b, n in product(range(a.repeats), [int(b) for b in a.batches.split(",")],
                                               a.nodes)]
    done = 0
    with budget.watch(), tempfile.TemporaryDirectory(prefix="weak-") as tmp:
        work = Path(tmp)
        try:
            for batch, r, nodes in budget.each(rounds):
                got = one_round(env, work, a, batch, nodes, r, shape, samples)
                row = results.setdefault((batch, nodes), {k: [] for k in KINDS})
                steps = step_ms.setdefault((batch, nodes), {k: [] for k in KINDS})
                for kind, (rate, step) in got.items():   # a round counts once all its jobs ran
                    row[kind].append(rate)
                    steps[kind].append(step * 1e3)
                done += 1
                print(f"batch {batch} nodes {nodes} repeat {r}: " + ", ".join(
                    f"{k} {v[-1]:.0f}" for k, v in row.items() if v) + " samples/s",
                    file=sys.stderr, flush=True)
        finally:
            if budget.stopped_by:
                cancel_jobs_under(env, work)
    budget.report(done, len(rounds), "rounds")
    print(f"weak scaling, {a.backend}, built-in MLP on {shape}-input samples ({samples} in the "
          f"dataset), one rank per node, {a.steps} steps, cycle time {a.cycle_time:g} ms, "
          f"MPI waits {'spin' if a.spin else 'yield'}, {a.repeats} repeats (samples/s median [min-max])")
    columns = [k for k in KINDS if k in DEFAULT_KINDS or k in a.kinds]
    print(f"{'batch':>5} {'nodes':>5} " + " ".join(f"{k:>24}" for k in columns))
    for (batch, nodes), row in sorted(results.items()):
        print(f"{batch:>5} {nodes:>5} " + " ".join(
            f"{fmt(row[k]) if row[k] else absent(k, nodes):>24}" for k in columns))
    print("median step, ms (each job's median, then median [min-max] over the jobs): where "
          "Horovod's cycle time rounds steps up, these sit near whole cycles")
    for (batch, nodes), row in sorted(step_ms.items()):
        cells = [f"{statistics.median(v):.3f} [{min(v):.2f}-{max(v):.2f}]" if (v := row[k])
                 else absent(k, nodes) for k in columns]
        print(f"{batch:>5} {nodes:>5} " + " ".join(f"{c:>24}" for c in cells))
    print("ratios: of the medians; per repeat: median [min-max] of the ratios of the jobs that "
          "ran back to back")
    for (batch, nodes), row in sorted(results.items()):
        pairs_of = [("hpcsuite", k) for k in KINDS[1:]] + [(k, "plain+data") for k in ("script", "train")]
        for one, other in pairs_of:
            if not row[one] or not row[other]:
                continue
            pairs = [h / o for h, o in zip(row[one], row[other])]
            print(f"batch {batch:>5}, {nodes} node(s): {one + '/' + other:<20} "
                  f"{statistics.median(row[one]) / statistics.median(row[other]):6.3f}   "
                  f"per repeat {statistics.median(pairs):6.3f} [{min(pairs):.3f}-{max(pairs):.3f}]")
    for batch in sorted({b for b, n in results if n == 2 and (b, 1) in results}):
        eff = {k: statistics.median(results[(batch, 2)][k]) / (2 * statistics.median(results[(batch, 1)][k]))
               for k in ("hpcsuite", "plain", "plain+data") if k in a.kinds}
        print(f"batch {batch}: weak-scaling efficiency (2-node / 2 x 1-node) " +
              ", ".join(f"{k} {v:.3f}" for k, v in eff.items()))
    sys.exit(budget.exit_code())


if __name__ == "__main__":
    main()
