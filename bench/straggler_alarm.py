"""Slow ranks named (issue O, point 1): false alarms on balanced jobs, and a positive control.

On the local Slurm cluster, one job at a time, 2 nodes x 1 rank, torch, mpirun:
  balanced  N jobs (default 10) with nothing slowed, cycling through SIZES (the built-in mlp
            on 784 features at batch 16, 64 and 256 per rank, on 4096 features at batch 256,
            and the built-in resnet on [3, 16, 16] at batch 32), each 1,000-8,000 steps (at least ~10 s), so
            each covers many of the rule's 200-step windows
  slowed    K jobs (default 2), the same model wrapped by a user model that sleeps on rank 1
            in each forward for FRACTION of the own time per step the balanced jobs of that
            size measured (CONTROLS, cycled: +30 % and +100 % on mlp4096-b256; a third, +100 %
            on mlp784-b64, shows the small-step case)
A job raised an alarm when results.json's rank_balance.slow_rank names a rank (the rule of
hpcsuite/runs/stragglers.py, applied by rank 0 at every vote: own time >= 1.25x the others'
median at >= 80 % of the votes covering the last 200 steps, and at least the last 20 votes).

Each job also writes TensorBoard points (train.monitor.tensorboard), which carry each rank's
own time per step at each vote rank 0 charted (about every vote: points at most every 0.2 s,
votes about every 0.25 s). From them, per job: the steps a vote covers, at how many votes the
rule was evaluated (a window of at least 200 steps and 20 votes), the votes at which a rank was
>= 1.25x the other ("behind") and the largest share of behind votes in any evaluated window
(the alarm's margin: 80 % names a rank).

    flock /tmp/e2e.lock .venv/bin/python bench/straggler_alarm.py --private --port 17817 \\
        [-n 10] [-k 2] [--budget 570]

--script runs the same jobs in script mode (issue 42, point 8): the user's own Horovod loop
(SCRIPT: the built-in model, synthetic data, hvd.DistributedOptimizer timed with
run.time_allreduce), rank 1 sleeping before each step's forward on the slowed jobs.

Uses the running local cluster (`hpcsuite cluster up`, SLURM_CONF), or a private one with
--private. Prints one line per job and "balanced: 0 of 10 named a rank", "slowed: ...".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from budget import Budget, cancel_jobs_under  # noqa: E402
from preemption_trials import cli, cluster_env  # noqa: E402

# name: model, input shape, batch per rank, steps, samples
SIZES = {
    "mlp784-b16": ("mlp", [784], 16, 8000, 16384),
    "mlp784-b64": ("mlp", [784], 64, 6000, 16384),
    "mlp784-b256": ("mlp", [784], 256, 4000, 16384),
    "mlp4096-b256": ("mlp", [4096], 256, 1500, 8192),
    "resnet16-b32": ("resnet", [3, 16, 16], 32, 1000, 8192),
}
CONTROLS = (("mlp4096-b256", 0.3), ("mlp4096-b256", 1.0), ("mlp784-b64", 1.0))

NET = """
import os
import time

from hpcsuite import models
from torch import nn


class SlowOnRank1(nn.Module):
    \"\"\"A built-in model that sleeps ``delay`` seconds in each forward on rank 1.\"\"\"

    def __init__(self, inner, delay):
        super().__init__()
        self.inner = inner
        rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "0"))
        self.delay = delay if rank == "1" else 0.0

    def forward(self, x):
        if self.delay:
            time.sleep(self.delay)
        return self.inner(x)


def build(shape, classes, kind="mlp", delay=0.0):
    return SlowOnRank1(models.build(kind, "torch", tuple(shape), classes), delay)
"""

SPEC = """name: {name}
resources: {{nodes: 2, tasks_per_node: 1, time: "00:08:00"}}
train:
  model: {model}
  {model_args}
  data: {{samples: {samples}, shape: {shape}, classes: 10}}
  batch_size: {batch}
  epochs: 100000
  max_steps: {steps}
  monitor: {{tensorboard: true}}
  seed: {seed}
"""


SCRIPT = """import argparse
import time

import horovod.torch as hvd
import numpy as np
import torch

from hpcsuite import api, models

parser = argparse.ArgumentParser()
parser.add_argument("--kind")
parser.add_argument("--shape")
parser.add_argument("--samples", type=int)
parser.add_argument("--delay", type=float)
args = parser.parse_args()
hvd.init()
torch.set_num_threads(1)
run = api.Run(hvd)
shape = tuple(int(s) for s in args.shape.split(","))
torch.manual_seed(run.job.train.seed)
model = models.build(args.kind, "torch", shape, 10)
rng = np.random.default_rng(run.job.train.seed)
x = torch.from_numpy(rng.standard_normal((args.samples, *shape), dtype=np.float32))
y = torch.from_numpy(rng.integers(0, 10, args.samples))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = run.time_allreduce(hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()))
delay = args.delay if hvd.rank() == 1 else 0.0
for batch in run.batches(args.samples):
    ids = torch.from_numpy(batch.ids)
    if delay:
        time.sleep(delay)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x[ids]), y[ids])
    loss.backward()
    optimizer.step()
    run.log(loss=float(loss))
    if run.should_stop():
        break
run.finish(params=api.torch_state(model)["model"])
"""

SCRIPT_SPEC = """name: {name}
resources: {{nodes: 2, tasks_per_node: 1, time: "00:08:00"}}
train:
  backend: torch
  script: slowed.py
  args: [--kind, {model}, --shape, "{shape}", --samples, "{samples}", --delay, "{delay:.6f}"]
  batch_size: {batch}
  epochs: 100000
  max_steps: {steps}
  monitor: {{tensorboard: true}}
  seed: {seed}
"""


def submit(env: dict, work: Path, name: str, size: str, seed: int, delay: float | None,
           script: bool = False) -> dict:
    """One job, waited for; its results.json and run directory (or an error)."""
    model, shape, batch, steps, samples = SIZES[size]
    work.mkdir(parents=True, exist_ok=True)
    if script:
        (work / "slowed.py").write_text(SCRIPT)
        (work / f"{name}.yaml").write_text(SCRIPT_SPEC.format(
            name=name, model=model, shape=",".join(map(str, shape)), samples=samples,
            delay=delay or 0.0, batch=batch, steps=steps, seed=seed))
    elif delay is None:
        model_line, args = model, ""
    else:
        (work / "net.py").write_text(NET)
        model_line, args = "net.py:build", f"model_args: {{kind: {model}, delay: {delay:.6f}}}"
    if not script:
        (work / f"{name}.yaml").write_text(SPEC.format(
            name=name, model=model_line, model_args=args, samples=samples,
            shape=json.dumps(shape), batch=batch, steps=steps, seed=seed))
    try:
        out = cli(env, work, "submit", f"{name}.yaml", "--wait", "--json", timeout=480)
    except subprocess.TimeoutExpired:
        return {"error": "no end within 480 s"}
    try:
        payload = json.loads(out.stdout)
    except ValueError:
        return {"error": f"submit exit {out.returncode}: {(out.stderr or out.stdout).strip()[-300:]}"}
    results = payload.get("results") or {}
    if out.returncode != 0 or results.get("status") != "completed":
        return {"error": f"submit exit {out.returncode}, status {results.get('status')}"}
    return {"results": results, "run_dir": work / "runs" / name / str(payload["job_id"]),
            "job_id": payload["job_id"]}


def own_points(run_dir: Path) -> list[tuple[int, tuple]]:
    """(step, (own s of rank 0, rank 1, ...)) at each charted vote, from TensorBoard."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")   # its reader loads TensorFlow, if there
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hpcsuite.runs.rundir import RunDir

    acc = EventAccumulator(str(RunDir(run_dir).tensorboard), size_guidance={"scalars": 0})
    acc.Reload()
    tags = sorted((t for t in acc.Tags()["scalars"] if t.startswith("ranks/own_ms/rank_")),
                  key=lambda t: int(t.rsplit("_", 1)[1]))
    series = [{e.step: e.value / 1e3 for e in acc.Scalars(t)} for t in tags]
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    return [(step, tuple(s[step] for s in series)) for step in steps]


def margin(points: list[tuple[int, tuple]]) -> dict:
    """The rule replayed on the charted votes: steps per vote, evaluations, behind votes, the
    largest behind share in an evaluated window, and the largest ratio at any vote."""
    from hpcsuite.runs import stragglers as st

    votes = [(step - before, own) for (before, _), (step, own) in zip(points, points[1:])]
    ratios = [max(own_ratios(own)) for _, own in votes]
    behind = [bool(st.behind(own)) for _, own in votes]
    evaluated, worst = 0, 0.0
    for end in range(1, len(votes) + 1):
        window, steps = [], 0
        for k in range(end - 1, -1, -1):          # as finding() takes it: newest first
            if steps >= st.WINDOW_STEPS and len(window) >= st.MIN_VOTES:
                break
            window.append(k)
            steps += votes[k][0]
        if len(window) >= st.MIN_VOTES and steps >= st.WINDOW_STEPS:
            evaluated += 1
            for rank in range(len(votes[0][1])):
                share = sum(any(r == rank for r, _ in st.behind(votes[k][1])) for k in window)
                worst = max(worst, share / len(window))
    per_vote = statistics.median(n for n, _ in votes) if votes else None
    return {"votes": len(votes), "steps_per_vote": per_vote, "evaluated": evaluated,
            "behind": sum(behind), "worst_share": worst,
            "max_ratio": max(ratios) if ratios else None}


def own_ratios(own: tuple) -> list[float]:
    """Each rank's own time over the median of the others' at one vote."""
    out = []
    for rank, mine in enumerate(own):
        others = statistics.median(t for r, t in enumerate(own) if r != rank)
        out.append(mine / others if others > 0 else float("inf"))
    return out


def result_line(kind: str, i: int, size: str, r: dict) -> str:
    """One line for a finished job."""
    if "error" in r:
        return f"{kind} {i + 1} ({size}): FAILED: {r['error']}"
    res, m = r["results"], r["margin"]
    bal = res.get("rank_balance") or {}
    own = "/".join(f"{1e3 * t:.2f}" if t is not None else "-" for t in bal.get("own_s", []))
    wait = "/".join(f"{1e3 * t:.2f}" if t is not None else "-" for t in bal.get("wait_s", []))
    slow = bal.get("slow_rank")
    named = (f"NAMED rank {slow['rank']} on {slow.get('host')}, ratio {slow['ratio']:.2f}, "
             f"others wait {slow.get('others_wait')}, cost {slow.get('cost')}"
             if slow else "named: none")
    armed = "armed" if m["evaluated"] else "never armed"
    return (f"{kind} {i + 1} ({size}{r.get('extra', '')}): job {r['job_id']}, {res['steps']} steps, "
            f"median step {1e3 * res['step_time_s'].get('median', 0):.2f} ms; own ms {own}, "
            f"wait ms {wait}; charted votes {m['votes']}, {m['steps_per_vote']} steps a vote "
            f"({armed}: evaluated at {m['evaluated']}), behind at {m['behind']}, largest behind "
            f"share {100 * m['worst_share']:.0f} %, max ratio {m['max_ratio'] or 0:.2f}; {named}")


def run_one(env, base: Path, kind: str, i: int, size: str, seed: int,
            delay: float | None = None, script: bool = False) -> dict:
    r = submit(env, base / f"{kind}{i}", f"{kind}{i}", size, seed, delay, script)
    if "error" not in r:
        try:
            r["margin"] = margin(own_points(r["run_dir"]))
        except Exception as e:  # noqa: BLE001 - the job's own answer still counts
            r["margin"] = {"votes": 0, "steps_per_vote": None, "evaluated": 0, "behind": 0,
                           "worst_share": 0.0, "max_ratio": None}
            r["note"] = f"TensorBoard unread: {type(e).__name__}: {e}"
    return r


def summary(balanced: list[tuple[str, dict]], slowed: list[tuple[str, float, dict]]) -> None:
    ok = [(s, r) for s, r in balanced if "error" not in r]
    named = [(s, r) for s, r in ok if r["results"]["rank_balance"].get("slow_rank")]
    armed = [(s, r) for s, r in ok if r["margin"]["evaluated"]]
    print(f"balanced: {len(named)} of {len(ok)} named a rank ({len(armed)} of them with steps "
          f"long enough for the rule to be evaluated; {len(balanced) - len(ok)} failed)")
    if armed:
        worst = max(r["margin"]["worst_share"] for _, r in armed)
        print(f"  largest share of behind votes in any evaluated window: {100 * worst:.0f} % "
              f"(80 % names a rank)")
    for size, frac, r in slowed:
        if "error" in r:
            print(f"slowed +{100 * frac:.0f} % ({size}): FAILED")
            continue
        slow = r["results"]["rank_balance"].get("slow_rank")
        own = r["results"]["rank_balance"].get("own_s") or []
        measured = own[1] / own[0] if len(own) > 1 and own[0] and own[1] else float("nan")
        said = (f"named rank {slow['rank']}, ratio {slow['ratio']:.2f}" if slow
                else "NOT named")
        print(f"slowed +{100 * frac:.0f} % ({size}): {said}; own time rank 1 / rank 0 over the "
              f"job {measured:.2f}; {'armed' if r['margin']['evaluated'] else 'never armed'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--balanced", type=int, default=10, help="balanced jobs")
    ap.add_argument("-k", "--slowed", type=int, default=2,
                    help=f"jobs with rank 1 slowed, cycling through {CONTROLS}")
    ap.add_argument("--sizes", default=",".join(SIZES),
                    help=f"balanced sizes to cycle through, comma-separated ({', '.join(SIZES)})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--private", action="store_true", help="start a private cluster")
    ap.add_argument("--port", type=int, default=17817)
    ap.add_argument("--keep", action="store_true", help="keep the jobs' directories")
    ap.add_argument("--script", action="store_true",
                    help="script mode: the user's own Horovod loop (SCRIPT) instead of the managed one")
    Budget.add_argument(ap, 570, "jobs")
    args = ap.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if not sizes or set(sizes) - set(SIZES):
        ap.error(f"--sizes: choose from {', '.join(SIZES)} (got {args.sizes!r})")
    budget = Budget.from_args(args)
    plan = [("balanced", i, sizes[i % len(sizes)], None) for i in range(args.balanced)]
    plan += [("slowed", i, *CONTROLS[i % len(CONTROLS)]) for i in range(args.slowed)]
    base = Path(tempfile.mkdtemp(prefix="hpcsuite-stragglers-"))
    balanced, slowed = [], []
    with budget.watch(), cluster_env(args.port, args.private) as (env, _):
        try:
            for kind, i, size, frac in budget.each(plan):
                delay, extra = None, ""
                if frac is not None:
                    own = [t for s, r in balanced if s == size and "error" not in r
                           for t in r["results"]["rank_balance"].get("own_s") or [] if t]
                    if not own:
                        print(f"slowed {i + 1} ({size}): no balanced job of that size measured "
                              "its own time: skipped", flush=True)
                        continue
                    delay = frac * statistics.median(own)
                    extra = f", rank 1 +{100 * frac:.0f} %: sleeps {1e3 * delay:.2f} ms a step"
                r = run_one(env, base, kind, i, size, args.seed + len(balanced) + len(slowed),
                            delay, args.script)
                r["extra"] = extra
                (balanced.append((size, r)) if frac is None else slowed.append((size, frac, r)))
                print(result_line(kind, i, size, r) + (f" ({r['note']})" if "note" in r else ""),
                      flush=True)
        finally:
            if budget.stopped_by:
                cancel_jobs_under(env, base)
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    budget.report(len(balanced) + len(slowed), len(plan), "jobs")
    summary(balanced, slowed)
    if args.keep:
        print(f"job directories: {base}")
    failed = any("error" in r for _, r in balanced) or any("error" in r for *_, r in slowed)
    return budget.exit_code(1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
