"""The local cluster's shape and config files: slurm.conf, slurmdbd.conf, the TaskProlog and the
cluster's site profile, each a pure function of its directory, port and host.

``cluster.LocalCluster`` owns where the files go and the daemons that read them; this module
owns what they say: the nodes, the partitions, and the ports laid out from slurmctld's.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError

MAX_NODES = 64              # `cluster up --nodes N`: 2 <= N <= 64 virtual nodes


def node_names(count: int = 2) -> tuple[str, ...]:
    """node1 .. node<count>."""
    return tuple(f"node{i}" for i in range(1, count + 1))


NODES = node_names(2)        # the default cluster, and the test suite's
PARTITION = "debug"
# A second partition on the same nodes: what a site's partition lock keeps jobs out of (tests).
OTHER_PARTITION = "other"
CLUSTER_NAME = "hpcsuite"
DB_OFFSET, DBD_OFFSET = 3, 4  # MariaDB and slurmdbd on slurmctld's port + 3 and + 4


def node_port(port: int, index: int) -> int:
    """The slurmd port of node ``index`` (0-based): node1 and node2 on slurmctld's port + 1 and
    + 2 (as ever), node3 and later after slurmdbd's, from + 5 on."""
    return port + index + 1 if index < 2 else port + DBD_OFFSET + index - 1
DB_NAME, DB_USER = "slurm_acct_db", "slurm"

# Jobs on this cluster run as root (it is started by root and SlurmUser=root); OpenMPI's
# mpirun refuses root unless told. slurmd runs this before every task, the batch script
# included, and adds what it prints to the task's environment: the allowance is the
# cluster's, not something every site's template has to carry.
TASK_PROLOG = """#!/bin/sh
# Written by `hpcsuite cluster up`: the local cluster's TaskProlog.
if [ "$(id -u)" = 0 ]; then
  echo "export OMPI_ALLOW_RUN_AS_ROOT=1"
  echo "export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
fi
"""


LOOPBACK = ("127.0.0.1", {n: "127.0.0.1" for n in NODES})


def render_conf(root: Path, port: int, host: str, munge_socket: Path, accounting: bool,
                gpus: int = 0, addrs: tuple[str, dict[str, str]] = LOOPBACK) -> str:
    """slurm.conf: everything under ``root``, slurmctld on ``port``, the nodes on ``host``;
    ``gpus`` per node declared to Slurm as gres (:func:`render_gres_conf`); ``addrs``:
    slurmctld's address and each node's, in order (loopback, or a fabric's namespaces): the
    nodes are its keys."""
    r = root
    ctl, nodes = addrs
    lines = [
        "# Written by `hpcsuite cluster up`; regenerated on every start.",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={host}({ctl})",
        f"SlurmctldPort={port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={r}/state",
        f"SlurmdSpoolDir={r}/spool/%n",
        f"SlurmctldPidFile={r}/run/slurmctld.pid",
        f"SlurmdPidFile={r}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={r}/log/slurmctld.log",
        f"SlurmdLogFile={r}/log/slurmd-%n.log",
        # Per-node TmpFS: PMIx puts its per-step app dir there, and two virtual nodes
        # sharing /tmp collide on it (see docs/CLUSTER.md).
        f"TmpFS={r}/tmp/%n",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        # A node an admin (or a test) sets DOWN stays down until RESUME, as a lost node does
        # until someone brings it back; one that stopped answering returns when it registers.
        # With 2, a DOWN node whose slurmd still answered came back at once, while its
        # requeued job was being placed on it again: the job ran with the node IDLE and
        # its steps never started.
        "ReturnToService=1",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=2",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={r}/log/jobcomp.txt",
        f"TaskProlog={r}/etc/task_prolog.sh",
        "MinJobAge=3600",
        "KillWait=10",
        "InactiveLimit=0",
        "SlurmdTimeout=60",
        "MessageTimeout=20",
        "PlugStackConfig=/dev/null",
    ]
    if accounting:
        lines += _accounting_lines(port, munge_socket, ctl)
    if gpus:
        lines.append("GresTypes=gpu")
    lines += _node_and_partition_lines(port, host, gpus, nodes)
    return "\n".join(lines) + "\n"


def _accounting_lines(port: int, munge_socket: Path, ctl: str) -> list[str]:
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={ctl}",     # sacct on a node (a fabric's) reaches it there
        f"AccountingStoragePort={port + DBD_OFFSET}",
        # The munge socket for talking to slurmdbd (AuthInfo covers only the cluster).
        f"AccountingStoragePass={munge_socket}",
        # MaxRSS and CPU time per step, sampled every second: Slurm keeps only what
        # its samples saw (the last one, as a step ends, finds its processes gone), so
        # with 5 s a job of 4 or 5 seconds had no MaxRSS at all.
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=task=1",
    ]


def _node_and_partition_lines(port: int, host: str, gpus: int,
                              addrs: dict[str, str]) -> list[str]:
    # With GPUs, a node has a core per GPU, so one rank per GPU fits (on this machine's cores).
    shape = f"CPUs={gpus} Gres=gpu:{gpus}" if gpus else "CPUs=1"
    nodes = list(addrs)
    lines = [f"NodeName={n} NodeHostname={host} NodeAddr={addrs[n]} "
             f"Port={node_port(port, i)} {shape} State=UNKNOWN" for i, n in enumerate(nodes)]
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    lines.append(f"PartitionName={OTHER_PARTITION} Nodes={','.join(nodes)} Default=NO "
                 "MaxTime=INFINITE State=UP")
    return lines


def declared(conf: Path) -> tuple[int | None, int]:
    """(nodes, GPUs per node) a slurm.conf written by :func:`render_conf` declares; (None, 0)
    when there is none."""
    import re

    try:
        text = conf.read_text()
    except OSError:
        return None, 0
    gpus = re.search(r" Gres=gpu:(\d+)", text)
    return (sum(l.startswith("NodeName=") for l in text.splitlines()) or None,
            int(gpus.group(1)) if gpus else 0)


def gpu_devices(root: Path, node: str, gpus: int) -> list[Path]:
    """The device files of ``node``'s GPUs: plain files the cluster makes under its own
    directory (Slurm hands them out by index; nothing under /dev is touched)."""
    return [root / "dev" / node / f"nvidia{i}" for i in range(gpus)]


def make_device(path: Path) -> None:
    """A character device file for a GPU Slurm hands out: slurmd accepts only devices in
    gres.conf, and takes their numbers for its device cgroup. /dev/null's numbers: what a
    rank opening it would reach is harmless (the cluster has task/none, no device cgroup)."""
    import stat

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_char_device():
        return
    path.unlink(missing_ok=True)
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as e:
        raise UserError(f"{path}: cannot make the device file a GPU of the local cluster needs "
                        f"({e.strerror}); `cluster up --gpus` needs root") from None


def render_gres_conf(root: Path, gpus: int, nodes: tuple[str, ...] = NODES) -> str:
    """gres.conf: each node's GPUs, by their device files."""
    lines = ["# Written by `hpcsuite cluster up --gpus N`; regenerated on every start."]
    for n in nodes:
        lines += [f"NodeName={n} Name=gpu File={f}" for f in gpu_devices(root, n, gpus)]
    return "\n".join(lines) + "\n"


def render_dbd_conf(root: Path, port: int, host: str, munge_socket: Path,
                    db_password: str, addr: str = "127.0.0.1") -> str:
    """slurmdbd.conf: slurmdbd on ``addr``:``port`` + DBD_OFFSET (the controller's address),
    its MariaDB on 127.0.0.1:``port`` + DB_OFFSET."""
    r = root
    return "\n".join([
        "# Written by `hpcsuite cluster up`; regenerated on every start.",
        "AuthType=auth/munge",
        f"AuthInfo=socket={munge_socket}",
        f"DbdAddr={addr}",
        f"DbdHost={host}",
        f"DbdPort={port + DBD_OFFSET}",
        "SlurmUser=root",
        f"PidFile={r}/run/slurmdbd.pid",
        f"LogFile={r}/log/slurmdbd.log",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={port + DB_OFFSET}",
        f"StorageUser={DB_USER}",
        f"StoragePass={db_password}",
        f"StorageLoc={DB_NAME}",
    ]) + "\n"


# The link between the nodes, as the profile names it (render_profile says where it comes from).
FABRIC_BANDWIDTH_GBPS, FABRIC_LATENCY_US = 0.25, 10.0
FABRIC_SOURCE = ("nominal: TCP over loopback between the two virtual nodes on one machine, "
                 "set low: MPI measured 1.7-2.1 GB/s there idle, 0.55 GB/s with other jobs on "
                 "its two cores")


def node_shape(gpus: int = 0, count: int = 2) -> str:
    """The nodes in words, as slurm.conf declares them (a core per GPU with GPUs)."""
    cores = gpus or 1
    text = f"{'two' if count == 2 else count} {cores}-core nodes"
    return text + (f" with {gpus} GPU{'s' if gpus > 1 else ''} each" if gpus else "")


def render_profile(gpus: int = 0, flavour: str | None = None, fabric: str | None = None,
                   nodes: int = 2) -> str:
    """The local cluster's site profile: its partitions, its fabric and the partition a job
    without one goes to, as a site describes its own; ``flavour``: the ``mpi.flavour`` of the
    MPI on this machine when it is not the default (Open MPI 4), as on Debian 13 (Open MPI 5);
    ``fabric``: the rate its nodes' links are shaped to (``cluster up --fabric``); ``nodes``:
    how many (``cluster up --nodes``)."""
    shape = f"cpus_per_node: {gpus}, gpus_per_node: {gpus}" if gpus else "cpus_per_node: 1"
    which = f"  flavour: {flavour}   # the MPI on this machine (mpirun --version)\n" if flavour else ""
    parts = "\n".join(f"  {p}: {{{shape}}}" for p in (PARTITION, OTHER_PARTITION))
    return ("# Written by `hpcsuite cluster up`: the site profile of the local development\n"
            f"# cluster ({node_shape(gpus, nodes)} on this machine). `hpcsuite cluster env` points\n"
            "# HPCSUITE_PROFILE here.\n"
            "name: local\n"
            "contact: hpcsuite cluster (docs/CLUSTER.md)\n"
            "mpi:\n"
            f"{which}"
            f"  nodes_share_host: true   # {'node1 and node2 are' if nodes == 2 else 'its nodes are'} one machine: each its own MPI segments\n"
            f"partitions:\n{parts}\n"
            f"# Slurm's default partition ({PARTITION}), named so a job without one is checked\n"
            "# against it (and lint does not warn that none is set).\n"
            f"defaults: {{resources: {{partition: {PARTITION}}}}}\n"
            + _fabric_lines(fabric))


# Open MPI's default TCP BTL flags less put (and hetero-rdma, which only qualifies put).
TCP_BTL_FLAGS = "send,inplace,need-ack,need-csum"


def _fabric_lines(rate: str | None) -> str:
    """The profile's ``fabric:``: the shaped links' rate, or loopback's nominal figure."""
    if rate is not None:
        from .fabric import gbytes

        return ("# Each node in a network namespace of its own, on a veth link shaped to\n"
                f"# {rate} both ways (tbf): MPI's busbw for large messages comes close to it.\n"
                "# `hpcsuite cluster fabric RATE` changes the links, not this line: the\n"
                "# profile says what the site was built with, and preflight.fabric checks it.\n"
                f"fabric: {{bandwidth: {gbytes(rate):.6g}, latency: {FABRIC_LATENCY_US}, "
                f"source: \"cluster up --fabric {rate}: tbf-shaped veth links\"}}\n"
                "# Open MPI's TCP BTL sends a large message by its emulated RDMA put, whose\n"
                "# control messages queue behind the data already in the same connection: an\n"
                "# allreduce (data both ways at once) got ~2/3 of the link. Plain send/receive\n"
                "# fragments (no put) got 92-96 % (docs/BENCHMARKS.md). What a TCP site sets\n"
                "# for mpirun and srun alike:\n"
                f"env: {{OMPI_MCA_btl_tcp_flags: \"{TCP_BTL_FLAGS}\"}}\n")
    return ("# TCP over loopback between node1 and node2. Nominal, not measured, and low:\n"
            "# MPI's busbw at 16 MiB was 1.7-2.1 GB/s on an idle machine (docs/BENCHMARKS.md)\n"
            "# and 0.55 GB/s with other jobs on its two cores, so preflight.fabric's\n"
            "# min_busbw_gbps: site (80 %: 0.2 GB/s) fails a broken link, not a busy one.\n"
            "# `hpcsuite bench allreduce --nodes 2` measures it.\n"
            f"fabric: {{bandwidth: {FABRIC_BANDWIDTH_GBPS}, latency: {FABRIC_LATENCY_US}, "
            f"source: \"{FABRIC_SOURCE}\"}}\n")
