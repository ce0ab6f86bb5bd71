"""`hpcsuite preflight`: the job's checks before training, run on every rank by the batch script
(the spec's ``preflight``, the same launcher line as training, after ``attempt begin``).

* ``preflight.fabric``: the first rank of each node allreduces ``size_mb`` of float32 with the
  first rank of every other node, one pair at a time per node: every pair for up to
  :data:`PAIRWISE_MAX_NODES` nodes (in rounds of disjoint pairs, the circle method: N-1 rounds
  for N even), each node with its two ring neighbours above that. Each pair is an MPI
  sub-communicator (``comm.Split``) timed the way `hpcsuite bench allreduce` times MPI
  (:func:`hpcsuite.runtime.checks.collective_timing.time_op`: the median run of the slower rank's mean
  per call); busbw = algbw·2(n−1)/n, which for a pair is S/t. A pair below the bar is named; a
  node all of whose pairs (two or more) are below it is named as the likely culprit.
* ``preflight.gpu``: each rank asks NVML about its own GPU (:mod:`hpcsuite.gpuhealth`).

Rank 0 writes ``preflight.json`` in the run directory. When a check fails it also writes the
attempt's FAILED marker (``status`` shows its line) and prints one line naming the slow pairs,
nodes or GPUs; every rank exits 2, so the batch script ends the attempt with exit 2 before
training (``attempt end``: exit 2 is never requeued). MPI over whatever the site's MPI uses
(TCP here); the GPUs' own NCCL path is not measured.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ... import gpuhealth
from ...runs.attempts import attempt_number
from ...runs.results import mark_failed, write_json_atomic
from ...runs.rundir import ENV, RunDir
from ..rank.job_io import load_job

PAIRWISE_MAX_NODES = 16
REPEATS, WARMUP, BUDGET_S = 5, 2, 1.0   # per pair, as bench allreduce: 5 runs, 2 warm-up calls


# ------------------------------------------------------------------- pure: who pairs with whom
def pair_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Every pair of ``n`` nodes, in rounds of disjoint pairs (a round-robin tournament)."""
    if n < 2:
        return []
    seats: list = list(range(n)) + ([None] if n % 2 else [])
    m = len(seats)
    rounds = []
    for _ in range(m - 1):
        pairs = [(seats[i], seats[m - 1 - i]) for i in range(m // 2)]
        rounds.append(sorted(tuple(sorted(p)) for p in pairs if None not in p))
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return rounds


def ring_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Each node with its ring neighbour (i, i+1 mod n), in rounds of disjoint pairs."""
    rounds: list[list[tuple[int, int]]] = []
    for pair in sorted({tuple(sorted((i, (i + 1) % n))) for i in range(n)} if n > 1 else ()):
        for r in rounds:
            if not {pair[0], pair[1]} & {x for p in r for x in p}:
                r.append(pair)
                break
        else:
            rounds.append([pair])
    return rounds


def schedule(n: int) -> tuple[str, list[list[tuple[int, int]]]]:
    if n <= PAIRWISE_MAX_NODES:
        return "pairs", pair_rounds(n)
    return "ring", ring_rounds(n)


def verdict(pairs: list[dict], bar_Bps: float) -> tuple[list[dict], list[str]]:
    """(the pairs below ``bar_Bps``, the nodes all of whose two or more pairs are below it)."""
    slow = [p for p in pairs if p["busbw_Bps"] < bar_Bps]
    by_node: dict[str, list[bool]] = {}
    for p in pairs:
        for node in p["nodes"]:
            by_node.setdefault(node, []).append(p["busbw_Bps"] < bar_Bps)
    culprits = [n for n, marks in by_node.items() if len(marks) >= 2 and all(marks)]
    return slow, culprits


def _gbps(bps: float) -> str:
    x = bps / 1e9
    return f"{x:.3g} GB/s" if x < 1000 else f"{x:.0f} GB/s"


def fabric_line(slow: list[dict], culprits: list[str], bar_Bps: float, total: int) -> str:
    """The one line that names what was too slow."""
    shown = ", ".join(f"{'-'.join(p['nodes'])} {_gbps(p['busbw_Bps'])}" for p in slow[:6])
    more = f" (and {len(slow) - 6} more)" if len(slow) > 6 else ""
    line = (f"preflight.fabric: {len(slow)} of {total} node pair(s) below the "
            f"{_gbps(bar_Bps)} busbw required: {shown}{more}")
    if culprits:
        line += f"; slow node(s): {', '.join(culprits)}"
    return line


def gpu_line(bad: list[dict]) -> str:
    shown = "; ".join(f"rank {g['rank']} on {g['host']}: {g['line']}" for g in bad[:4])
    return f"preflight.gpu: {len(bad)} rank(s) with an unfit GPU: {shown}"


# ------------------------------------------------------------------- measuring (every rank)
def measure_pairs(comm, host: str, size: int, budget_s: float = BUDGET_S) -> dict | None:
    """Time every scheduled node pair's allreduce on the first rank of each node; the pairs
    (on rank 0; None elsewhere) with the schedule's kind and the nodes in order."""
    import numpy as np
    from mpi4py import MPI

    from ...alphabeta import algorithm_bandwidth, bus_bandwidth
    from .collective_timing import time_op

    hosts = comm.allgather(host)
    nodes = list(dict.fromkeys(hosts))
    mine = nodes.index(host)
    leader = hosts.index(host) == comm.rank
    kind, rounds = schedule(len(nodes))
    measured = []
    buf = np.zeros(size // 4, dtype=np.float32)
    for pairs in rounds:
        color = next((i for i, p in enumerate(pairs) if mine in p), None) if leader else None
        sub = comm.Split(MPI.UNDEFINED if color is None else color, comm.rank)
        if sub == MPI.COMM_NULL:
            continue
        timed = time_op(lambda: sub.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM), sub, budget_s,
                        REPEATS, WARMUP)
        if sub.rank == 0:
            t = timed["seconds"]
            measured.append({"nodes": [nodes[i] for i in pairs[color]], "seconds": t,
                             "busbw_Bps": float(bus_bandwidth(size, t, 2)),
                             "algbw_Bps": float(algorithm_bandwidth(size, t)),
                             "iterations": timed["iterations"], "repeats_s": timed["repeats_s"]})
        sub.Free()
    gathered = comm.gather(measured, root=0)
    if comm.rank != 0:
        return None
    return {"schedule": kind, "nodes": nodes, "rounds": len(rounds),
            "pairs": sorted((p for part in gathered for p in part),
                            key=lambda p: [nodes.index(n) for n in p["nodes"]])}


def check_gpu(job, local_rank: int) -> dict:
    """This rank's GPU, through NVML: {host, answers, findings, line}."""
    from ..observe.monitor import nvml_handle
    from ..rank.placement import place, visible_devices

    from ...errors import UserError

    try:
        place(job, local_rank)
    except UserError as e:     # ranks that would share a GPU
        return {"answers": None, "findings": [gpuhealth.Finding(
            gpuhealth.FAIL, "device", str(e)).to_json()], "line": str(e)}
    need = int(job.preflight.gpu_free_gib * gpuhealth.GIB)
    if not visible_devices():
        found = [gpuhealth.Finding(gpuhealth.FAIL, "device", "no GPU visible to this rank")]
        return {"answers": None, "findings": [f.to_json() for f in found],
                "line": found[0].detail}
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            answers = gpuhealth.read(pynvml, nvml_handle(pynvml, "cuda:0"))
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - no driver or library: NVML raises its own types
        found = [gpuhealth.Finding(gpuhealth.FAIL, "nvml", f"NVML does not answer: {e}")]
        return {"answers": None, "findings": [f.to_json() for f in found],
                "line": found[0].detail}
    found = gpuhealth.findings(answers, need, frozenset({os.getpid()}))
    return {"answers": answers, "findings": [f.to_json() for f in found],
            "line": gpuhealth.health_line(answers, found)}


# ------------------------------------------------------------------- the step
def run(job, min_busbw_gbps: float | None, comm) -> tuple[dict | None, list[str]]:
    """Every rank's part; on rank 0 (record, failure lines), elsewhere (None, [])."""
    from ...world import current

    world = current()
    host = world.node
    started = time.perf_counter()
    gpu = check_gpu(job, world.local_rank) if job.preflight.gpu else None
    gpus = comm.gather({"rank": comm.rank, "host": host, **gpu} if gpu else None, root=0)
    hosts = comm.gather(host, root=0)
    fabric = job.preflight.fabric
    pairs = measure_pairs(comm, host, fabric.size_mb << 20) if fabric else None
    if comm.rank != 0:
        return None, []
    lines = []
    record: dict = {"attempt": attempt_number(), "job_id": world.job_id,
                    "ranks": comm.size, "hosts": hosts}
    if pairs is not None:
        bar = min_busbw_gbps * 1e9 if min_busbw_gbps is not None else 0.0
        slow, culprits = verdict(pairs["pairs"], bar)
        record["fabric"] = {**pairs, "size_bytes": fabric.size_mb << 20, "required_busbw_Bps": bar,
                            "busbw_formula": "busbw = S/t * 2(n-1)/n, n = 2 per pair",
                            "slow_pairs": [p["nodes"] for p in slow], "slow_nodes": culprits}
        if slow:
            lines.append(fabric_line(slow, culprits, bar, len(pairs["pairs"])))
    if gpu is not None:
        record["gpu"] = gpus
        bad = [g for g in gpus if any(f["severity"] == gpuhealth.FAIL for f in g["findings"])]
        if bad:
            lines.append(gpu_line(bad))
    record["passed"] = not lines
    record["elapsed_s"] = time.perf_counter() - started
    return record, lines


def write_record(run_dir: Path, record: dict) -> Path:
    path = RunDir(run_dir).preflight
    write_json_atomic(path, record)
    return path


def report_failure(run_dir: Path, lines: list[str]) -> None:
    """The attempt's FAILED marker (what `status` shows) and one line per failed check."""
    mark_failed(RunDir(run_dir).failed(attempt_number()), 0, 2,
                "\n".join(f"error: {line}" for line in lines))
    for line in lines:
        print(f"hpcsuite preflight: {line}", file=sys.stderr, flush=True)


def main(job_path: str, min_busbw_gbps: float | None) -> int:
    """The exit status: 0 when every check passed, 2 when one failed (on every rank)."""
    from ..rank.shm import private_shm

    job = load_job(job_path)
    run_dir = Path(os.environ.get(ENV) or Path(job_path).parent)
    private_shm()                      # before mpi4py starts MPI (nodes sharing a host)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    record, lines = run(job, min_busbw_gbps, comm)
    if record is not None:
        path = write_record(run_dir, record)
        if lines:
            report_failure(run_dir, lines)
        else:
            print(f"hpcsuite preflight: passed ({summary(record)}); wrote {path}", flush=True)
    failed = comm.bcast(bool(lines), root=0)
    return 2 if failed else 0


def summary(record: dict) -> str:
    parts = []
    fabric = record.get("fabric")
    if fabric:
        low = min((p["busbw_Bps"] for p in fabric["pairs"]), default=None)
        parts.append(f"{len(fabric['pairs'])} node pair(s), lowest busbw "
                     f"{_gbps(low) if low is not None else 'n/a (one node)'} "
                     f"(required {_gbps(fabric['required_busbw_Bps'])})")
    if record.get("gpu"):
        parts.append(f"{len(record['gpu'])} GPU(s) healthy")
    return "; ".join(parts)
