"""An earlier attempt's steps still alive on the nodes a requeued attempt was given.

When a node loses its network mid-job, the attempt ends on the other nodes and hpcsuite
requeues it, but the node itself still runs its share of the attempt's step (its orted or
ranks): Slurm forgets the step once it sets the node DOWN and learns of it again only when the
node comes back. Slurm may then start the requeued attempt on that node at once (same job id),
and the kill it sends for the old step a second later takes the new attempt's step with it:
"ORTE has lost communication with a remote daemon", exit 205, a failure the job never made.

So before a requeued attempt after a failure launches its ranks, :func:`wait_until_gone` runs
one small step on every node of the allocation that lists the job's processes there
(``scontrol listpids``), and waits until no earlier step has one. An attempt whose nodes still
hold them after :data:`WAIT_S` is not launched: it is recorded as ``leftover`` (not a failure
of the job's, so not counted against ``max_failures``) and requeued, at most
:data:`MAX_LEFTOVERS` times in a row.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from dataclasses import dataclass

from ..errors import UserError

WAIT_S = 90.0          # Slurm's kill of the old step comes within seconds of the node's return
POLL_S = 2.0
SETTLE_S = 12.0        # a step must outlive Slurm's kill of the old attempt (KillWait and more)
MAX_LEFTOVERS = 3      # leftover attempts in a row before the job stops requeueing for them
# The outcome of an attempt not launched for them: Slurm's cleanup, not the job's failure.
LEFTOVER = "leftover"
# On every node: its name and the probe's own step id, then one `step ID` per step daemon
# (slurmstepd) the node's slurmd still runs for the job (its socket in SlurmdSpoolDir, named
# NODE_JOB.STEP: a step whose tasks are gone but whose daemon still waits on the old srun is
# one too, and Slurm's kill for it takes the job's new steps with it), then `scontrol
# listpids`' table (PID JOBID STEPID LOCALID GLOBALID) of the processes in them.
PROBE = (
    'echo "node $SLURMD_NODENAME $SLURM_STEP_ID"; '
    'spool=$(scontrol show config 2>/dev/null | awk \'$1 == "SlurmdSpoolDir" {print $3}\'); '
    'spool=${spool//%n/$SLURMD_NODENAME}; '
    'for s in "$spool/${SLURMD_NODENAME}_$SLURM_JOB_ID".*; do '
    '[ -S "$s" ] && echo "step ${s##*.}"; done; '
    'scontrol listpids "$SLURM_JOB_ID" "$SLURMD_NODENAME" 2>/dev/null; true')
SPECIAL_STEPS = 4294967290    # and above: the batch script's, the extern and interactive steps


@dataclass(frozen=True)
class Probe:
    answered: set[str]                  # nodes whose probe ran
    leftovers: dict[str, set[str]]      # node -> earlier step ids with a process there


def parse(text: str) -> Probe:
    """The probe's output over every node (``srun --label``: each line behind its task's
    number, as the nodes' lines interleave): which nodes answered, and on each the step ids
    (other than the probe's own, the batch script's and the extern step) with a step daemon
    or a process there."""
    answered: set[str] = set()
    leftovers: dict[str, set[str]] = {}
    lines: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        task, colon, rest = line.partition(":")
        if colon and task.strip().isdigit():
            lines.setdefault(task.strip(), []).append(rest.split())
    for words_of_task in lines.values():
        node, own = None, None
        for words in words_of_task:
            if len(words) == 3 and words[0] == "node":
                node, own = words[1], words[2]
                answered.add(node)
                continue
            if node is None:
                continue
            if len(words) == 2 and words[0] == "step":
                step = words[1]               # a step daemon's socket
            elif len(words) >= 3 and words[0].isdigit():
                step = words[2]               # a process in a step
            else:
                continue                      # the table's header, or noise
            if step.isdigit() and int(step) >= SPECIAL_STEPS:
                continue
            if step.isdigit() and step != own:
                leftovers.setdefault(node, set()).add(step)
    return Probe(answered, leftovers)


def probe(job_id: str, nodes: int, settle: float = 0.0) -> Probe | None:
    """Run the probe as a step on every node of the allocation, after ``settle`` seconds in
    it; None when the step itself failed (a node still cleaning up the job kills it too, or
    did not let it start)."""
    from .. import slurm

    script = f"sleep {settle:g}; {PROBE}" if settle else PROBE
    argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            "--mpi=none", "--kill-on-bad-exit=1", "--quiet", "--label", "bash", "-c", script]
    timeout = 30.0 + settle
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_CPU_BIND", "SLURM_NTASKS", "SLURM_TASKS_PER_NODE"))}
    try:
        done = slurm.call(argv, check=False, timeout=timeout, env=env)
    except UserError:
        return None
    if done.returncode != 0:
        return None
    return parse(done.stdout)


def wait_until_gone(job_id: str, nodes: int, out, wait_s: float | None = None,
                    run_probe=None) -> str | None:
    """Wait until no node of the allocation runs a step of an earlier attempt. None once
    none does; otherwise what is still there (said, and kept in the attempt's record).

    Once a node held one, clean is not enough: the node's slurmd ends the job's steps there
    for a few seconds after the old step is gone (Slurm's kill for the old attempt, which
    takes any step of the job), so the last probe is a step that lives :data:`SETTLE_S` on
    every node first and must come back clean."""
    deadline = time.monotonic() + (WAIT_S if wait_s is None else wait_s)
    run_probe = run_probe or probe
    said = False
    last = "the probe step did not run"
    while True:
        seen = run_probe(job_id, nodes)
        if seen is not None and len(seen.answered) >= nodes and not seen.leftovers and said:
            seen = run_probe(job_id, nodes, SETTLE_S)       # and a step outlives the kill
            if seen is None:
                last = f"a step on the nodes was killed within {SETTLE_S:g} s of its start"
        if seen is not None and len(seen.answered) >= nodes and not seen.leftovers:
            if said:
                out("hpcsuite: the earlier attempt's steps are gone from every node; launching")
            return None
        if seen is not None and seen.leftovers:
            last = "; ".join(f"{n} still runs step{'s' if len(s) > 1 else ''} "
                             f"{', '.join(f'{job_id}.{x}' for x in sorted(s))}"
                             for n, s in sorted(seen.leftovers.items()))
        elif seen is not None:
            last = f"{nodes - len(seen.answered)} node(s) did not answer the probe"
        if not said:
            out(f"hpcsuite: waiting for Slurm to end the earlier attempt's steps ({last})")
            said = True
        if time.monotonic() >= deadline:
            return last
        time.sleep(POLL_S)


def leftovers_in_a_row(records: list[dict]) -> int:
    """How many of the newest attempts in ``records`` were leftovers, back to the last other."""
    latest: dict[int, str] = {}
    for r in records:
        latest[r["attempt"]] = r["outcome"]
    n = 0
    for k in sorted(latest, reverse=True):
        if latest[k] != "leftover":
            break
        n += 1
    return n


def clear_to_launch(run_dir: Path, n: int, records: list[dict], out, failures: tuple[str, ...],
                    append, requeue) -> bool:
    """Before attempt ``n`` launches after one that failed, was lost or found leftovers: wait
    until no node runs an earlier attempt's step. When one still does after the wait, record
    attempt ``n`` as a leftover (``append``) and requeue the job (``requeue``), or, after
    :data:`MAX_LEFTOVERS` in a row, stop. Whether the attempt may launch."""
    from ..world import current

    before = [r["outcome"] for r in records if r["attempt"] == n - 1]
    if not before or before[-1] not in (*failures, LEFTOVER):
        return True                       # after a save or a completion: steps ended cleanly
    job_id = current().job_id
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 0)
    if not job_id or nodes < 1:
        return True                       # outside a Slurm allocation: nothing to ask
    still = wait_until_gone(job_id, nodes, out)
    if still is None:
        return True
    why = f"an earlier attempt's steps were still running: {still}"
    if leftovers_in_a_row(records) >= MAX_LEFTOVERS:
        out(f"hpcsuite: not starting attempt {n}: {why}, after {MAX_LEFTOVERS} attempts that "
            "found the same; ask the cluster's admin about the node")
        append(run_dir, {"attempt": n, "outcome": "not_started", "why": why})
        return False
    out(f"hpcsuite: attempt {n} not launched: {why}; requeueing job {job_id} "
        "(not counted against train.preemption.max_failures)")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # the requeue's TERM must not cut the record
    requeued = requeue(job_id, out)
    append(run_dir, {"attempt": n, "outcome": LEFTOVER, "why": why, "host": current().node,
                     "requeued": requeued})
    return False
