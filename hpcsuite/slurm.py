"""The one place hpcsuite runs external programs (sbatch, squeue, scontrol, scancel, sinfo,
sacct, and the local cluster's daemons), plus small pure parsers of their output.

Slurm is found as its own commands find it: ``SLURM_CONF`` or /etc/slurm/slurm.conf (or a
configless setup). Nothing here knows of hpcsuite's local development cluster; a shell reaches
that one through ``eval "$(hpcsuite cluster env)"``.

Every call takes an argv list (never a shell string), has a timeout, and strips ``SBATCH_*``
variables from the environment of ``sbatch`` so a user's shell cannot silently change a job
that ``hpcsuite render`` showed them. Unit tests fake :func:`call` and nothing else.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import dataclass

from .errors import UserError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0
CLIENTS = frozenset({"sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct", "sacctmgr",
                     "srun", "salloc", "sstat"})


class TimedOut(UserError):
    """A program that did not answer within its timeout (it may still have acted: an sbatch
    that timed out may have submitted the job)."""


@dataclass(frozen=True)
class Completed:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


def slurm_env(extra: dict[str, str] | None = None, *, strip_sbatch: bool = False) -> dict[str, str]:
    """The environment Slurm commands run with: the caller's (``SBATCH_*`` removed on request)."""
    env = dict(os.environ)
    if strip_sbatch:
        env = {k: v for k, v in env.items() if not k.startswith("SBATCH_")}
    env.update(extra or {})
    return env


def call(argv: list[str], *, timeout: float = DEFAULT_TIMEOUT, env: dict[str, str] | None = None,
         cwd: str | None = None, check: bool = True) -> Completed:
    """Run ``argv`` and capture its output; a missing program is a UserError, a timeout
    :class:`TimedOut`."""
    log.debug("run %s", argv)
    conf = (env if env is not None else os.environ).get("SLURM_CONF")
    if conf and argv and argv[0] in CLIENTS:
        # Slurm's commands retry a missing slurm.conf for a minute before they give up.
        unusable = conf_problem(conf)
        if unusable:
            raise UserError(unusable)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=env if env is not None else slurm_env(), cwd=cwd,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UserError(f"{argv[0]}: command not found (is Slurm installed and on PATH?)") from None
    except subprocess.TimeoutExpired:
        raise TimedOut(f"{argv[0]} did not answer within {timeout:g}s: {' '.join(argv)}") from None
    done = Completed(list(argv), proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise failure(done, env)
    return done


def conf_problem(conf: str) -> str | None:
    """Why Slurm's commands cannot use the slurm.conf at ``conf`` (None when they can): absent,
    or not readable by this account (Slurm's commands read it as the user who runs them)."""
    try:
        os.stat(conf)
    except PermissionError:
        return (f"SLURM_CONF={conf}: this account cannot reach it (a directory on its path is "
                "closed to it): every account that submits needs to read the cluster's "
                "slurm.conf; ask the cluster's admin (docs/CLUSTER.md, \"Every account\")")
    except OSError:
        pass
    if not os.path.isfile(conf):
        return (f"SLURM_CONF={conf}: no such file (set SLURM_CONF to the cluster's "
                "slurm.conf; for hpcsuite's local cluster: eval \"$(hpcsuite cluster env)\")")
    if not os.access(conf, os.R_OK):
        return (f"SLURM_CONF={conf}: this account cannot read it: every account that submits "
                "needs to read the cluster's slurm.conf; ask the cluster's admin "
                "(docs/CLUSTER.md, \"Every account\")")
    return None


def failure(done: Completed, env: dict[str, str] | None = None) -> UserError:
    """The one-line error for a program that failed: its last line of output, and where Slurm
    looked for its configuration when that was the trouble."""
    detail = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return UserError(f"{done.argv[0]} failed (exit {done.returncode}): "
                     f"{detail[-1] if detail else 'no output'}{_conf_hint(done.stderr, env)}")


def _conf_hint(stderr: str, env: dict[str, str] | None) -> str:
    """When Slurm could not read its configuration: where it looked, and how to point it."""
    if "slurm.conf" not in stderr and "configuration source" not in stderr:
        return ""
    conf = (env if env is not None else os.environ).get("SLURM_CONF")
    where = f"SLURM_CONF={conf}" if conf else "SLURM_CONF is not set"
    return (f" ({where}; set SLURM_CONF to the cluster's slurm.conf; for hpcsuite's local "
            "cluster: eval \"$(hpcsuite cluster env)\")")


def spawn_daemon(argv: list[str], *, env: dict[str, str], log_path: str,
                 cpus: tuple[int, ...] = ()) -> int:
    """Start a daemon that stays in the foreground, detached from us; returns its pid.
    ``cpus``: the cores it (and all it starts) may use; empty: ours."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=pin)
    return proc.pid


# --------------------------------------------------------------------------- parsers

_JOBID = re.compile(r"^(\d+)(?:;\S+)?$")


def parse_sbatch_parsable(stdout: str) -> str:
    """``sbatch --parsable`` prints ``jobid`` or ``jobid;cluster``."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    m = _JOBID.match(line.strip())
    if not m:
        raise UserError(f"sbatch printed no job id: {stdout.strip()!r}")
    return m.group(1)


def parse_scontrol_record(stdout: str) -> dict[str, str]:
    """``scontrol show job -o ID``: one line of ``Key=Value`` pairs; values may hold spaces
    only in the last field we care about rarely, so split on `` Key=`` boundaries."""
    text = stdout.strip()
    if not text:
        return {}
    fields: dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(.*?)(?=\s[A-Za-z][A-Za-z0-9_:/]*=|$)", text):
        fields[m.group(1)] = m.group(2)
    return fields


def parse_jobcomp_line(line: str) -> dict[str, str]:
    """One record of ``jobcomp/filetxt``: space-separated ``Key=Value`` pairs."""
    return parse_scontrol_record(line)


def parse_sinfo_nodes(stdout: str) -> dict[str, str]:
    """``sinfo -h -N -o '%N %T'`` → {node: state}."""
    nodes = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            nodes[parts[0]] = parts[1].rstrip("*~#!%$@^-").lower()
    return nodes


@dataclass(frozen=True)
class Partition:
    """What Slurm says a partition can give one job (``scontrol show partition`` and
    ``sinfo``): its nodes, the per-job node limit, and each node's CPUs and GPUs."""
    name: str
    default: bool
    max_nodes: int | None               # MaxNodes per job; None: UNLIMITED
    nodes: tuple[tuple[int, int], ...]  # (CPUs, GPUs) of each node


def parse_partitions(stdout: str) -> dict[str, dict[str, str]]:
    """``scontrol show partition -o``: one record per line → {name: fields}."""
    out = {}
    for line in stdout.splitlines():
        rec = parse_scontrol_record(line)
        if rec.get("PartitionName"):
            out[rec["PartitionName"]] = rec
    return out


def parse_sinfo_shapes(stdout: str) -> list[tuple[int, int]]:
    """``sinfo -h -N -p P -o '%N|%c|%G'`` (one line per node) → [(CPUs, GPUs)] per node;
    GPUs counted from gres ``gpu[:type]:N[(S:...)]`` entries."""
    shapes = []
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        gpus = 0
        for gres in parts[2].split(","):
            fields = gres.split("(")[0].split(":")
            if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
                gpus += int(fields[-1])
        shapes.append((int(parts[1]), gpus))
    return shapes


def partition(name: str | None) -> Partition | None:
    """The named partition (None: the cluster's default) as Slurm describes it now; None when
    Slurm has no such partition. A Slurm that does not answer is a UserError."""
    done = call(["scontrol", "show", "partition", "-o"], timeout=30)
    records = parse_partitions(done.stdout)
    if name is None:
        name = next((n for n, r in records.items() if r.get("Default") == "YES"), None)
    rec = records.get(name or "")
    if rec is None:
        return None
    nodes = call(["sinfo", "-h", "-N", "-p", name, "-o", "%N|%c|%G"], timeout=30)
    limit = rec.get("MaxNodes", "UNLIMITED")
    return Partition(name, rec.get("Default") == "YES",
                     int(limit) if limit.isdigit() else None,
                     tuple(parse_sinfo_shapes(nodes.stdout)))


def partition_names() -> list[str]:
    return sorted(parse_partitions(call(["scontrol", "show", "partition", "-o"],
                                        timeout=30).stdout))
