"""What hpcsuite costs as the rank count grows: the same managed job, the same hpcsuite.api
script and the same plain Horovod script at N = 2, 4, 8, 16 and 32 ranks, one rank a node.

    .venv/bin/python bench/scale.py [--nodes 2,4,8,16,32] [--modes managed,script,plain]
        [--port 18600] [--stall 60] [--steps 40] [--out scale.json [--append]] [--keep DIR]
    .venv/bin/python bench/scale.py --compare before.json --out after.json   # fits side by side
    .venv/bin/python bench/scale.py --report after.json [--compare before.json]  # no run

A job takes about stall + 30 s + 1.5 s a rank here (2 cores): all of N = 2..16 about 25 min,
N = 32 about 4 min a mode. --append adds the N and modes run now to --out's rows (and fits
them all), so a long series can be run in parts: --nodes 2,4,8, then 16, then --nodes 32
--modes managed, ...; --keep copies each job's run directory, step times and strace output.

For each N a private cluster of N nodes starts in a temporary directory on --port (the nodes
pinned to this machine's cores in turn, as `cluster up --nodes N` does) and each mode's job is
submitted to it through the CLI of the Python that runs this file (`hpcsuite submit`, with the
cluster's site profile), one after the other:
  managed  the managed loop: the built-in mlp, synthetic data, train.loss scale_loss.py:per_sample
  script   bench/user_code/scale_script.py through hpcsuite.api (batches, log, stop votes, finish)
  plain    bench/user_code/scale_plain.py: horovod.torch alone, no hpcsuite.api: the baseline
all the same tiny MLP (32 -> 64 -> 64 -> 10), batch 64, one torch thread a rank, --steps steps.
Every step on every rank passes through scale_loss.py, which writes the step's wall time to a
file outside the run directory and, at step --steps/2, sleeps --stall seconds on every rank (a
long checkpoint save). Per N and mode:
  a. submit -> RUNNING: from the CLI's start to squeue's first RUNNING (polled every 0.25 s);
  b. RUNNING -> every rank's first log line (`hpcsuite train` started) and -> the first step
     on every rank (the last rank's);
  c. the median step (the gaps between step starts from the 4th on, the stall's left out),
     before and after the stall apart, and its ratio to plain's at that N (separate jobs: on
     a shared 2-core machine a few tens of percent are noise; bench/step_overhead.py compares
     loops in one process);
  d. the last step's start (the last rank's) -> results.json written, -> every rank's
     `hpcsuite train` returned (its net-R.done), -> the job leaves RUNNING (batch script ended);
  e. bytes and files in the run directory (Slurm's log beside it not counted);
  f. during the stall, --window seconds from --delay s into it (past the network watch's 20 s):
     every rank process attached with `strace -f` (their threads and whatever they start),
     and every connect, open/openat, stat-like call (stat, lstat, newfstatat, statx, access,
     faccessat), getdents64 and execve COUNTED, per second, with the most frequent paths and
     addresses; the ranks' Slurm RPCs are their connects to a Slurm daemon's port; sdiag's
     per-message counts over the window are kept too (every RPC slurmctld took, the bench's
     own sdiag left out);
  g. results.json's bytes.
Every figure is fitted as a + b·N + c·N² (numpy least squares; a line over two N) with its
residuals. The baseline is twofold: plain at the same N for (c), and N = 2 (every test's
cluster) for the growth. A job is bounded (--job-timeout, default stall + 240 s + 10 s a rank);
one that runs past it is cancelled and reported, and the bench goes on. The cluster is always
taken down. Needs root, strace, and the ports from --port to --port + N + 4 free.
strace (ptrace) stops the ranks at every system call, Horovod's idle loop's too, which slows
them during the window: the counts are exact, the rates those of slowed ranks. A rank's network
listener is published with every non-loopback address of its host, so another local cluster's
--fabric bridge, while it exists, is one more address every probe tries (net_addrs, printed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np

import hpcsuite
from hpcsuite.site.cluster import LocalCluster

USER_CODE = Path(__file__).resolve().parent / "user_code"
CLI = Path(sys.executable).parent / "hpcsuite"     # the product of the Python running this
MODES = ("managed", "script", "plain")
TRACED = ("connect", "open", "openat", "stat", "lstat", "newfstatat", "statx", "access",
          "faccessat", "faccessat2", "getdents64", "execve")
KINDS = {"connect": ("connect",), "open": ("open", "openat"),
         "stat": ("stat", "lstat", "newfstatat", "statx", "access", "faccessat", "faccessat2"),
         "getdents": ("getdents64",), "execve": ("execve",)}
# (key, label) of every figure fitted over N
FIGURES = (("submit_to_running_s", "a. submit -> RUNNING (s)"),
           ("running_to_ranks_up_s", "b. RUNNING -> every rank's first log line (s)"),
           ("running_to_first_step_s", "b. RUNNING -> first step on every rank (s)"),
           ("step_ms", "c. median step (ms)"),
           ("step_ms_pre", "c. median step before the stall (ms)"),
           ("step_ms_post", "c. median step after the stall (ms)"),
           ("step_ratio", "c. step / plain's step"),
           ("last_step_to_results_s", "d. last step -> results.json written (s)"),
           ("last_step_to_ranks_done_s", "d. last step -> every rank's train returned (s)"),
           ("last_step_to_end_s", "d. last step -> job end (s)"),
           ("run_dir_bytes", "e. run directory (bytes)"),
           ("run_dir_files", "e. run directory (files)"),
           ("stall_connect_per_s", "f. connects/s"),
           ("stall_open_per_s", "f. opens/s"),
           ("stall_stat_per_s", "f. stats/s"),
           ("stall_getdents_per_s", "f. getdents64/s"),
           ("stall_execve_per_s", "f. execve/s"),
           ("stall_rank_rpc_per_s", "f. Slurm RPCs/s from the ranks"),
           ("stall_sdiag_rpc_per_s", "f. Slurm RPCs/s, all (sdiag)"),
           ("results_json_bytes", "g. results.json (bytes)"))


class Timeout(Exception):
    """The job ran past its bound in the phase named."""


# ------------------------------------------------------------------ the jobs
def spec_text(mode: str, n: int, steps: int) -> str:
    head = (f"name: scale-{mode}\n"
            f"resources: {{nodes: {n}, tasks_per_node: 1, cpus_per_task: 1, time: '00:30:00'}}\n")
    if mode == "managed":
        return head + ("train:\n  backend: torch\n  model: mlp\n  loss: scale_loss.py:per_sample\n"
                       "  data: {kind: synthetic, samples: 8192, shape: [32], classes: 10}\n"
                       f"  batch_size: 64\n  max_steps: {steps}\n")
    if mode == "script":
        return head + ("train: {backend: torch, script: scale_script.py, batch_size: 64, "
                       f"max_steps: {steps}}}\n")
    return head + f"train: {{backend: torch, script: scale_plain.py, args: [--steps, '{steps}']}}\n"


def prepare(work: Path, mode: str, n: int, steps: int, stall: float) -> Path:
    """The job's submit directory: the spec, the user code and scale_loss's settings."""
    work.mkdir(parents=True)
    for path in USER_CODE.glob("scale_*.py"):
        shutil.copy(path, work / path.name)
    (work / "scale_config.json").write_text(json.dumps(
        {"steps_dir": str(work / "steps"), "stall_step": steps // 2, "stall_seconds": stall}))
    (work / "job.yaml").write_text(spec_text(mode, n, steps))
    return work / "job.yaml"


def squeue_state(env: dict, job_id: str) -> str:
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env,
                          capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or "GONE"


def step_lines(steps_dir: Path) -> dict[int, list[str]]:
    out = {}
    for path in steps_dir.glob("rank-*.txt"):
        out[int(path.stem.split("-")[1])] = path.read_text().splitlines()
    return out


def rank_pids(run_dir: Path) -> list[int]:
    """The ranks' processes (tests/conftest.py's rank_pids): not mpirun's, which names the file too."""
    pattern = f"^\\S*python\\S* -m hpcsuite train --job {run_dir}/job.json"
    done = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def run_job(mode: str, n: int, args, env: dict, base: Path, slurm_ports: set[int]) -> dict:
    spec = prepare(base / mode, mode, n, args.steps, args.stall)
    bound = args.job_timeout or args.stall + 240 + 10 * n
    row: dict = {"n": n, "mode": mode, "state": None, "error": None,
                 "load_at_submit": os.getloadavg()[0]}   # the machine is shared: how busy
    t0 = time.time()
    done = subprocess.run([str(CLI), "submit", spec.name, "--json"], cwd=spec.parent, env=env,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        row["error"] = f"submit exit {done.returncode}: {done.stderr.strip()[-400:]}"
        return row
    sub = json.loads(done.stdout)
    job_id, run_dir = sub["job_id"], Path(sub["run_dir"])
    row.update(job_id=job_id, submit_cli_s=time.time() - t0)
    deadline, phase = t0 + bound, "pending"
    try:
        state = squeue_state(env, job_id)
        while state in ("PENDING", "CONFIGURING"):
            if time.time() > deadline:
                raise Timeout(phase)
            time.sleep(0.25)
            state = squeue_state(env, job_id)
        t_running = time.time()
        row["submit_to_running_s"] = t_running - t0
        phase = "waiting for the stall on every rank"
        stall_at = None
        while stall_at is None and state == "RUNNING":
            lines = step_lines(spec.parent / "steps")
            marks = [float(x.split()[1]) for ls in lines.values() for x in ls if x.startswith("stall")]
            if len(marks) == n:
                stall_at = max(marks)
                break
            if time.time() > deadline:
                raise Timeout(phase)
            time.sleep(0.5)
            state = squeue_state(env, job_id)
        if stall_at is not None:
            row["stall"] = count_stall(run_dir, stall_at, args, env, slurm_ports)
        phase = "waiting for the end"
        while state in ("RUNNING", "PENDING", "CONFIGURING"):
            if time.time() > deadline:
                raise Timeout(phase)
            time.sleep(0.5)
            state = squeue_state(env, job_id)
        t_end = time.time()
        while state == "COMPLETING" and time.time() < deadline:   # the nodes free for the next job
            time.sleep(0.5)
            state = squeue_state(env, job_id)
        row["completing_s"] = time.time() - t_end
    except Timeout as e:
        subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=30)
        row["error"] = f"timed out after {bound:.0f} s ({e}); cancelled"
        end_by = time.time() + 60
        while squeue_state(env, job_id) != "GONE" and time.time() < end_by:
            time.sleep(1)
        t_end = None
    gather(row, run_dir, spec.parent / "steps", t_running if "submit_to_running_s" in row else None,
           t_end, env)
    return row


def gather(row: dict, run_dir: Path, steps_dir: Path, t_running, t_end, env: dict) -> None:
    """The figures a job left: its step times, logs, run directory, status."""
    lines = step_lines(steps_dir)
    times = {r: [float(x) for x in ls if x[0].isdigit()] for r, ls in lines.items()}
    row["ranks_stepped"] = sum(1 for t in times.values() if t)
    row["steps_seen"] = min((len(t) for t in times.values()), default=0)
    starts = [first_log_time(run_dir / "logs" / f"rank-{r}.log") for r in range(row["n"])]
    if t_running is not None and times and all(times.values()) and len(times) == row["n"]:
        row["running_to_first_step_s"] = max(t[0] for t in times.values()) - t_running
        row["first_step_spread_s"] = (max(t[0] for t in times.values())
                                      - min(t[0] for t in times.values()))
        if all(starts):
            row["running_to_ranks_up_s"] = max(starts) - t_running
        for key, part in (("step_ms", None), ("step_ms_pre", "pre"), ("step_ms_post", "post")):
            per_rank = [s for s in (step_median(t, part) for t in times.values()) if s is not None]
            row[key] = 1000 * statistics.median(per_rank) if per_rank else None
        last = max(t[-1] for t in times.values())
        if t_end is not None:
            row["last_step_to_end_s"] = t_end - last
        if (run_dir / "results.json").is_file():
            row["last_step_to_results_s"] = (run_dir / "results.json").stat().st_mtime - last
        done = [p.stat().st_mtime for p in run_dir.glob("startup/attempt-0/net-*.done")]
        if len(done) == row["n"]:      # each rank's `hpcsuite train` returned (netwatch.finished)
            row["last_step_to_ranks_done_s"] = max(done) - last
    files = [p for p in run_dir.rglob("*") if p.is_file()] if run_dir.is_dir() else []
    row["run_dir_files"] = len(files)
    row["run_dir_bytes"] = sum(p.stat().st_size for p in files)
    addrs = [len(json.loads(p.read_text()).get("addrs") or [])
             for p in run_dir.glob("startup/attempt-0/net-*.json")]
    row["net_addrs"] = max(addrs, default=0)     # the addresses each peer's listener is tried on
    results = run_dir / "results.json"
    row["results_json_bytes"] = results.stat().st_size if results.is_file() else 0
    status = subprocess.run([str(CLI), "status", row["job_id"], "--json"], env=env,
                            capture_output=True, text=True, timeout=120,
                            cwd=run_dir.parent.parent.parent)
    try:
        st = json.loads(status.stdout)
        row["state"] = st.get("state")
        said = st.get("error") or "; ".join(st.get("errors") or [])
        row["error"] = "; ".join(x for x in (row["error"], said) if x) or None
    except ValueError:
        row["state"] = f"status exit {status.returncode}: {status.stderr.strip()[-200:]}"


def first_log_time(path: Path) -> float | None:
    try:
        first = path.read_text(errors="replace").split("\n", 1)[0]
        return datetime.strptime(first[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except (OSError, ValueError):
        return None


def step_median(times: list[float], part: str | None = None) -> float | None:
    """A rank's median step: the gaps between step starts from the 4th on, the stall's left
    out; ``part`` "pre" or "post": only those before or after the stall."""
    gaps = [b - a for a, b in zip(times[3:], times[4:])]
    if not gaps:
        return None
    typical = statistics.median(gaps)
    stall = max(range(len(gaps)), key=gaps.__getitem__)
    if part is not None and gaps[stall] > max(10 * typical, 1.0):
        gaps = gaps[:stall] if part == "pre" else gaps[stall + 1:]
    kept = [g for g in gaps if g < max(10 * typical, 1.0)]
    return statistics.median(kept) if kept else None


# ------------------------------------------------------------------ the stall
def count_stall(run_dir: Path, stall_at: float, args, env: dict, slurm_ports: set[int]) -> dict:
    """strace every rank for the window inside the stall; sdiag before and after."""
    window = min(args.window, args.stall - args.delay - 2)
    time.sleep(max(0.0, stall_at + args.delay - time.time()))
    pids = rank_pids(run_dir)
    threads = sum(len(os.listdir(f"/proc/{p}/task")) for p in pids if os.path.isdir(f"/proc/{p}"))
    trace = run_dir.parent / f"strace-{run_dir.name}.txt"        # beside the run directory
    before = sdiag_counts(env)
    argv = ["strace", "-f", "-qq", "-s", "200", "-o", str(trace), "-e", "trace=" + ",".join(TRACED)]
    for p in pids:
        argv += ["-p", str(p)]
    t0 = time.time()
    tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(window)
    finally:
        tracer.send_signal(signal.SIGINT)
        _, err = tracer.communicate(timeout=60)
    seconds = time.time() - t0
    after = sdiag_counts(env)
    sdiag = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    sdiag = {k: v for k, v in sdiag.items() if v and k != "REQUEST_STATS_INFO"}
    text = trace.read_text(errors="replace") if trace.exists() else ""
    counted = parse_strace(text.replace(str(run_dir), "RUN"), slurm_ports)
    out = {"seconds": seconds, "from_stall_s": t0 - stall_at, "pids": len(pids),
           "threads": threads, "sdiag": sdiag, "strace_err": err.decode(errors="replace")[-300:],
           **counted}
    out["per_s"] = {k: v / seconds for k, v in counted["counts"].items()}
    out["rank_rpc_per_s"] = counted["slurm_connects"] / seconds
    out["sdiag_rpc_per_s"] = sum(sdiag.values()) / seconds
    return out


CALL = re.compile(r"^(\d+)\s+(\w+)\((.*)$")
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
PORT = re.compile(r"sin6?_port=htons\((\d+)\)")
ADDR = re.compile(r'(?:inet_addr\("([^"]+)"\)|sun_path="([^"]*)")')


def parse_strace(text: str, slurm_ports: set[int]) -> dict:
    """Counts by kind and by call, the most frequent targets of each kind (digits folded to #),
    and the connects to a Slurm daemon's port (slurmctld, slurmd, slurmdbd). A call split by
    another thread (<unfinished ...>, then <... resumed>) counts once, at its start."""
    calls: dict[str, int] = {}
    targets: dict[str, dict[str, int]] = {k: {} for k in KINDS}
    rpcs = 0
    kind_of = {c: k for k, cs in KINDS.items() for c in cs}
    for line in text.splitlines():
        m = CALL.match(line)
        if not m or m.group(2) not in kind_of:
            continue
        name, rest = m.group(2), m.group(3)
        calls[name] = calls.get(name, 0) + 1
        kind = kind_of[name]
        if kind == "connect":
            port, addr = PORT.search(rest), ADDR.search(rest)
            where = (addr.group(1) or addr.group(2)) if addr else "?"
            target = f"{where}:{port.group(1)}" if port else where
            if port and int(port.group(1)) in slurm_ports:
                rpcs += 1
        else:
            q = QUOTED.search(rest)
            target = q.group(1) if q else "?"
            if name == "newfstatat" and target == "":
                target = "(fstat of a descriptor)"
        target = re.sub(r"\d+", "#", target)
        targets[kind][target] = targets[kind].get(target, 0) + 1
    counts = {k: sum(calls.get(c, 0) for c in cs) for k, cs in KINDS.items()}
    top = {k: sorted(t.items(), key=lambda kv: -kv[1])[:8] for k, t in targets.items() if t}
    return {"counts": counts, "calls": calls, "top": top, "slurm_connects": rpcs}


def sdiag_counts(env: dict) -> dict[str, int]:
    done = subprocess.run(["sdiag"], env=env, capture_output=True, text=True, timeout=30)
    text = done.stdout.split("by message type", 1)[-1].split("by user", 1)[0]
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^\s+(\w+)\s+\(\s*\d+\)\s+count:(\d+)", text, re.M)}


# ------------------------------------------------------------------ one N
def measure(n: int, args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix=f"hpcsuite-scale-{n}-") as d:
        base = Path(d)
        cluster = LocalCluster(base / "cluster", port=args.port, nodes=n)
        env = dict(os.environ, **cluster.client_env(), HPCSUITE_CLUSTER_DIR=str(base / "cluster"),
                   HPCSUITE_SITE_DIR=str(base / "site"), XDG_CONFIG_HOME=str(base / "xdg"),
                   XDG_CACHE_HOME=str(base / "cache"))
        rows = []
        try:
            cluster.up(timeout=60 + 3 * n)
            for mode in args.modes:
                print(f"  N={n} {mode} ...", file=sys.stderr, flush=True)
                ports = {p for name, p in cluster.ports().items() if name != "mariadbd"}
                row = run_job(mode, n, args, env, base, ports)
                print(f"  N={n} {mode}: {row.get('state')} {row.get('error') or ''}",
                      file=sys.stderr, flush=True)
                rows.append(row)
                if args.keep:
                    keep_traces(base / mode, Path(args.keep) / f"n{n}-{mode}")
        finally:
            cluster.down()
    for r in rows:
        stall = r.get("stall")
        if stall:
            for kind, rate in stall["per_s"].items():
                r[f"stall_{kind}_per_s"] = rate
            r["stall_rank_rpc_per_s"] = stall["rank_rpc_per_s"]
            r["stall_sdiag_rpc_per_s"] = stall["sdiag_rpc_per_s"]
    return rows


def step_ratios(rows: list[dict]) -> None:
    """Each row's median step over plain's at the same N (rows of several runs: --append)."""
    plain = {r["n"]: r["step_ms"] for r in rows if r["mode"] == "plain" and r.get("step_ms")}
    for r in rows:
        r.pop("step_ratio", None)
        if r.get("step_ms") and r["n"] in plain:
            r["step_ratio"] = r["step_ms"] / plain[r["n"]]


def keep_traces(work: Path, dest: Path) -> None:
    """The job's run directory (its logs) and strace's output, for a look afterwards."""
    dest.mkdir(parents=True, exist_ok=True)
    if (work / "steps").is_dir():
        shutil.copytree(work / "steps", dest / "steps", dirs_exist_ok=True)
    for path in (work / "runs").glob("*/*"):
        if path.is_dir():
            shutil.copytree(path, dest / path.name, dirs_exist_ok=True)
        else:
            shutil.copy(path, dest / path.name)


# ------------------------------------------------------------------ fits and tables
def fit(ns: list[int], ys: list[float]) -> dict:
    """a + b·N + c·N² by least squares (a line through two N, a constant through one)."""
    degree = min(2, len(ns) - 1)
    x = np.array(ns, dtype=float)
    basis = np.stack([x ** k for k in range(degree + 1)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, np.array(ys, dtype=float), rcond=None)
    coef = list(coef) + [0.0] * (2 - degree)
    resid = [float(y - (coef[0] + coef[1] * n + coef[2] * n * n)) for n, y in zip(ns, ys)]
    return {"ns": ns, "ys": ys, "coef": [float(c) for c in coef], "residuals": resid}


def fits(rows: list[dict]) -> dict:
    out: dict = {}
    for mode in MODES:
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["n"])
        for key, _ in FIGURES:
            pts = [(r["n"], r[key]) for r in mine if isinstance(r.get(key), (int, float))]
            if pts:
                out.setdefault(mode, {})[key] = fit([p[0] for p in pts], [p[1] for p in pts])
    return out


def poly(coef: list[float]) -> str:
    return f"{coef[0]:.4g} {coef[1]:+.4g}·N {coef[2]:+.4g}·N²"


TIMES = [("submit_to_running_s", "a sub>run", "{:.2f}"),
         ("running_to_ranks_up_s", "b run>log", "{:.2f}"),
         ("running_to_first_step_s", "b run>step", "{:.2f}"), ("step_ms", "c step ms", "{:.2f}"),
         ("step_ms_pre", "c pre ms", "{:.2f}"), ("step_ms_post", "c post ms", "{:.2f}"),
         ("step_ratio", "c /plain", "{:.2f}"), ("last_step_to_results_s", "d results", "{:.2f}"),
         ("last_step_to_ranks_done_s", "d ranks", "{:.2f}"), ("last_step_to_end_s", "d end", "{:.2f}"),
         ("load_at_submit", "load", "{:.1f}")]
FILES_STALL = [("run_dir_bytes", "e bytes", "{:d}"), ("run_dir_files", "e files", "{:d}"),
               ("results_json_bytes", "g results", "{:d}"),
               ("stall_connect_per_s", "f conn/s", "{:.1f}"),
               ("stall_open_per_s", "f open/s", "{:.1f}"), ("stall_stat_per_s", "f stat/s", "{:.1f}"),
               ("stall_getdents_per_s", "f dents/s", "{:.2f}"),
               ("stall_execve_per_s", "f exec/s", "{:.2f}"),
               ("stall_rank_rpc_per_s", "f rpc/s", "{:.2f}"),
               ("stall_sdiag_rpc_per_s", "f sdiag/s", "{:.2f}")]


def print_rows(rows: list[dict]) -> None:
    """Two tables: the times (a-d, s and ms) and the files and the stall's rates (e-g)."""
    for cols, tail in ((TIMES, True), (FILES_STALL, False)):
        print(f"{'N':>3} {'mode':>8} " + " ".join(f"{label:>10}" for _, label, _ in cols)
              + ("  state" if tail else ""))
        for r in rows:
            cells = [f"{form.format(r[key]):>10}" if r.get(key) is not None else f"{'-':>10}"
                     for key, _, form in cols]
            line = f"{r['n']:>3} {r['mode']:>8} " + " ".join(cells)
            if tail:
                line += f"  {r.get('state')}" + (f"  {r['error']}" if r.get("error") else "")
            print(line)
        print()


def print_stalls(rows: list[dict]) -> None:
    for r in rows:
        s = r.get("stall")
        if not s:
            continue
        print(f"N={r['n']} {r['mode']}: {s['seconds']:.1f} s window from {s['from_stall_s']:.1f} s "
              f"into the stall, {s['pids']} ranks, {s['threads']} threads, "
              f"{r.get('net_addrs')} address(es) a listener; calls {s['calls']}; "
              f"sdiag {s['sdiag']}")
        for kind, top in s["top"].items():
            print(f"    {kind}: " + ", ".join(f"{t} x{c}" for t, c in top[:5]))


def print_fits(fitted: dict) -> None:
    for mode, figs in fitted.items():
        for key, label in FIGURES:
            f = figs.get(key)
            if f:
                res = " ".join(f"{x:+.3g}" for x in f["residuals"])
                print(f"{mode:>8} {label:<46} {poly(f['coef']):<36} residuals {res}")


def print_compare(old: dict, new: dict) -> None:
    print(f"{'mode':>8} {'figure':<46} {'old fit':<36} {'new fit':<36} values old -> new by N")
    for mode in MODES:
        for key, label in FIGURES:
            a, b = old.get(mode, {}).get(key), new.get(mode, {}).get(key)
            if not (a or b):
                continue
            vals = []
            for n in sorted(set((a or {}).get("ns", [])) | set((b or {}).get("ns", []))):
                va = dict(zip(a["ns"], a["ys"])).get(n) if a else None
                vb = dict(zip(b["ns"], b["ys"])).get(n) if b else None
                vals.append(f"{n}: {fmt(va)} -> {fmt(vb)}")
            print(f"{mode:>8} {label:<46} {poly(a['coef']) if a else '-':<36} "
                  f"{poly(b['coef']) if b else '-':<36} " + "; ".join(vals))


def fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="2,4,8,16,32")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--port", type=int, default=18600)
    ap.add_argument("--stall", type=float, default=60.0, help="seconds every rank sleeps mid-run")
    ap.add_argument("--steps", type=int, default=40, help="steps a job trains (the stall at half)")
    ap.add_argument("--delay", type=float, default=25.0, help="the window opens this far into the stall")
    ap.add_argument("--window", type=float, default=30.0, help="seconds the ranks are traced")
    ap.add_argument("--job-timeout", type=float, default=None)
    ap.add_argument("--out", default=None, help="every raw figure and the fits, as JSON")
    ap.add_argument("--append", action="store_true",
                    help="keep --out's rows of the N and modes not run now, and fit them all")
    ap.add_argument("--compare", default=None, help="an earlier --out: both fits side by side")
    ap.add_argument("--report", default=None, help="print this --out's tables; run nothing")
    ap.add_argument("--keep", default=None, help="copy each job's run directory and strace here")
    args = ap.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    if set(args.modes) - set(MODES):
        sys.exit(f"--modes: {sorted(set(args.modes) - set(MODES))}; valid: {', '.join(MODES)}")
    if args.report:
        data = json.loads(Path(args.report).read_text())
    else:
        if os.geteuid() != 0 or not shutil.which("strace"):
            sys.exit("bench/scale.py starts local clusters and attaches strace: run it as root, "
                     "with strace installed")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench/scale.py: terminated"))
        print(f"hpcsuite from {Path(hpcsuite.__file__).parent}, CLI {CLI}; {os.cpu_count()} cores; "
              f"{args.steps} steps, stall {args.stall:g} s at step {args.steps // 2}; "
              f"window {args.window:g} s from {args.delay:g} s into it", flush=True)
        rows = []
        if args.append and args.out and Path(args.out).is_file():
            rows = json.loads(Path(args.out).read_text())["rows"]
        for n in sorted({int(x) for x in args.nodes.split(",")}):
            try:
                fresh = measure(n, args)
            except Exception as e:  # noqa: BLE001 - a cluster that did not come up: said, next N
                print(f"  N={n}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                fresh = [{"n": n, "mode": m, "state": None, "error": f"{type(e).__name__}: {e}"}
                         for m in args.modes]
            done = {(r["n"], r["mode"]) for r in fresh}
            rows = [r for r in rows if (r["n"], r["mode"]) not in done] + fresh
            rows.sort(key=lambda r: (r["n"], MODES.index(r["mode"])))
            step_ratios(rows)
            data = {"hpcsuite": str(Path(hpcsuite.__file__).parent), "args": vars(args),
                    "rows": rows, "fits": fits(rows)}
            if args.out:
                Path(args.out).write_text(json.dumps(data, indent=1))
    print_rows(data["rows"])
    print()
    print_stalls(data["rows"])
    print()
    print_fits(data["fits"])
    if args.compare:
        print()
        print_compare(json.loads(Path(args.compare).read_text())["fits"], data["fits"])


if __name__ == "__main__":
    main()
