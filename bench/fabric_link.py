"""The local cluster's shaped link (`cluster up --fabric RATE`, issue 44): what MPI and Horovod
carry across it, and what a job does when it drops.

    .venv/bin/python bench/fabric_link.py busbw [--rates 100mbit,250mbit,1gbit] [--budget S]
    .venv/bin/python bench/fabric_link.py blips [--trials 10] [--down 5] [--budget S]

Each run starts a private fabric cluster in a temporary directory (--port, default 17417) and
stops it afterwards.

busbw: per rate, one `hpcsuite bench allreduce --nodes 2` (4 and 16 MiB) with the profile's
Open MPI TCP settings (btl_tcp_flags without put), and one with Open MPI's defaults (put); the
table gives each one's MPI and Horovod busbw at 16 MiB as a share of the rate, the ratio the
issue's bar (within 15 %) reads.

blips: per trial, a 2-node job trains; once it reaches step 1500 node2's link goes down for
--down seconds and comes back. The table says whether the job survived (completed, in one
attempt), how long training paused (the largest gap between progress steps seen by the
poller), or how it ended; the summary counts each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from budget import Budget, cancel_jobs_under

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "hpcsuite"]
PUT_FLAGS = "send,put,inplace,need-ack,need-csum,hetero-rdma"   # Open MPI 4.1's default


@contextlib.contextmanager
def fabric_cluster(port: int, rate: str):
    from hpcsuite.site.cluster import LocalCluster

    root = Path(tempfile.mkdtemp(prefix="hpcsuite-bench-fabric-"))
    cluster = LocalCluster(root, port=port, accounting=False, fabric=rate)
    print(f"starting a fabric cluster ({rate}) in {root} (port {port})", file=sys.stderr)
    env = {k: v for k, v in os.environ.items() if k != "HPCSUITE_PROFILE"}
    env.update(cluster.client_env(), HPCSUITE_CLUSTER_DIR=str(root),
               XDG_CONFIG_HOME=str(root / "xdg"))
    try:
        cluster.up(timeout=90)
        yield cluster, env, root
    finally:
        try:
            cancel_jobs_under(env, root)
        finally:
            cluster.down()
            shutil.rmtree(root, ignore_errors=True)


def cli(*args, env, cwd, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def busbw(args, budget: Budget) -> int:
    from hpcsuite.site.fabric import rate_bps

    rows = []
    with budget.watch():
        for rate in budget.each(args.rates.split(",")):
            with fabric_cluster(args.port, rate) as (_, env, root):
                for label, sets in (("no put (profile)", []),
                                    ("put (Open MPI default)",
                                     ["--set", f"env.OMPI_MCA_btl_tcp_flags={PUT_FLAGS}"])):
                    work = root / label.split()[0]
                    work.mkdir()
                    done = cli("bench", "allreduce", "--nodes", "2", "--sizes", "4M,16M",
                               "--budget", "2", *sets, env=env, cwd=work)
                    if done.returncode != 0:
                        print(done.stdout + done.stderr, file=sys.stderr)
                        continue
                    report = json.loads(next(work.rglob("allreduce.json")).read_text())
                    large = report["points"][-1]
                    link = rate_bps(rate) / 8
                    rows.append((rate, label, large["mpi_busbw"] / link,
                                 large["horovod_busbw"] / link))
    print(f"{'rate':>8}  {'Open MPI TCP':24} {'MPI busbw/rate':>15} {'Horovod busbw/rate':>19}"
          "  (16 MiB, 2 nodes)")
    for rate, label, mpi, hvd in rows:
        print(f"{rate:>8}  {label:24} {mpi:15.3f} {hvd:19.3f}")
    budget.report(len({r[0] for r in rows}), len(args.rates.split(",")), "rates")
    return budget.exit_code()


BLIP = """name: blip
resources: {{nodes: 2, tasks_per_node: 1, time: "00:10:00"}}
train:
  data: {{samples: 100000, shape: [32], classes: 10}}
  batch_size: 32
  max_steps: {steps}
  checkpoint: {{every_steps: 500}}
"""


def blips(args, budget: Budget) -> int:
    rows = []
    with budget.watch(), fabric_cluster(args.port, args.rate) as (cluster, env, root):
        f = cluster.fabric
        for trial in budget.each(range(args.trials)):
            work = root / f"trial-{trial}"
            work.mkdir()
            (work / "blip.yaml").write_text(BLIP.format(steps=args.steps))
            out = cli("submit", "blip.yaml", "--json", env=env, cwd=work)
            job = json.loads(out.stdout)["job_id"]
            progress = work / "runs" / "blip" / job / "progress.json"
            seen, cut, gap, last = [], None, 0.0, None
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                try:
                    step = json.loads(progress.read_text())["step"]
                except (OSError, ValueError, KeyError):
                    step = None
                now = time.monotonic()
                if step is not None and step != last:
                    if cut is not None and seen:
                        gap = max(gap, now - seen[-1])
                    seen.append(now)
                    last = step
                if cut is None and step is not None and step >= 1500:
                    f.set_link("node2", False)
                    cut = now
                    time.sleep(args.down)
                    f.set_link("node2", True)
                state = json.loads(cli("status", job, "--json", env=env, cwd=work).stdout)
                if state["state"] not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
                    break
                time.sleep(0.25)
            attempts = [json.loads(l) for l in
                        (work / "runs" / "blip" / job / "attempts.jsonl").read_text().splitlines()]
            survived = state["state"] == "COMPLETED" and len(attempts) == 1
            failed = work / "runs" / "blip" / job / "FAILED-attempt-0"
            why = failed.read_text().splitlines()[-2][:90] if failed.is_file() else ""
            rows.append((trial, state["state"], len(attempts), gap, survived, why))
            cluster.resume_unresponsive("node2")
    print(f"node2's link down for {args.down:g} s at step 1500 of {args.steps}, "
          f"{args.rate}, 2 nodes")
    print(f"{'trial':>5} {'state':10} {'attempts':>8} {'longest pause':>14}  outcome")
    for trial, state, n, gap, survived, why in rows:
        print(f"{trial:5d} {state:10} {n:8d} {gap:13.1f}s  "
              f"{'survived' if survived else 'ended: ' + why}")
    ok = sum(r[4] for r in rows)
    if rows:
        print(f"survived {ok} of {len(rows)}; median longest pause "
              f"{statistics.median(r[3] for r in rows):.1f} s")
    budget.report(len(rows), args.trials, "trials")
    return budget.exit_code()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["busbw", "blips"])
    ap.add_argument("--port", type=int, default=17417)
    ap.add_argument("--rates", default="100mbit,250mbit,1gbit")
    ap.add_argument("--rate", default="250mbit", help="blips: the link's rate")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--down", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=6000)
    Budget.add_argument(ap, 1080, "rates or trials")
    args = ap.parse_args()
    budget = Budget.from_args(args)
    return busbw(args, budget) if args.what == "busbw" else blips(args, budget)


if __name__ == "__main__":
    sys.exit(main())
