"""hpcsuite.world: the rank's world from whichever launcher started it (a table of the
environments each launcher gives a rank: rank 3 of 4, the second of two on node2)."""

import ast

import pytest

from hpcsuite.world import World, from_env, tasks_on_node

from conftest import REPO

SLURM_JOB = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node2", "SLURM_RESTART_COUNT": "2"}
# under mpirun and mpiexec srun started one daemon per node: its task variables are the daemon's
DAEMON = {"SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
          "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
SRUN_TASK = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4",
             "SLURM_STEP_NUM_TASKS": "4", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}

LAUNCHES = {
    "openmpi": {**DAEMON, "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
    # Open MPI 5's mpirun sets both its own and PMIx's
    "openmpi5": {**DAEMON, "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                 "PMIX_RANK": "3"},
    "hydra": {**DAEMON, "PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
              "MPI_LOCALNRANKS": "2"},
    "pmix": {**SRUN_TASK, "PMIX_RANK": "3"},
    "pmi2": {**SRUN_TASK, "PMI_RANK": "3", "PMI_SIZE": "4", "PMI_FD": "5"},
    "slurm": SRUN_TASK,
}


@pytest.mark.parametrize("started_by", sorted(LAUNCHES))
def test_every_launcher_gives_the_same_world(started_by):
    world = from_env({**SLURM_JOB, **LAUNCHES[started_by]}, hostname="box")
    assert world == World(rank=3, size=4, local_rank=1, local_size=2, node="node2", host="box",
                          job_id="77", attempt=2, started_by=started_by.replace("5", ""))


def test_one_process_outside_any_launcher_is_a_world_of_one():
    world = from_env({}, hostname="laptop")
    assert (world.rank, world.size, world.local_rank, world.local_size) == (0, 1, 0, 1)
    assert (world.node, world.job_id, world.attempt, world.started_by) == ("laptop", None, 0, "none")


def test_the_node_is_slurms_name_not_the_machines():
    """Nodes that share a host (the local cluster) differ only by SLURMD_NODENAME: both
    attempts.jsonl and rank-N.json name it."""
    assert from_env({"SLURMD_NODENAME": "node1"}, hostname="box").node == "node1"
    assert from_env({"SLURMD_NODENAME": ""}, hostname="box").node == "box"


def test_an_array_element_knows_its_index():
    world = from_env({"SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "73"},
                     hostname="h")
    assert (world.job_id, world.array_job_id, world.array_task_id) == ("73", "70", "3")


@pytest.mark.parametrize("spec, node, want", [("2(x3),1", 0, 2), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1),
                                              ("4", 0, 4), ("4", 1, None), ("x", 0, None)])
def test_slurms_tasks_per_node(spec, node, want):
    assert tasks_on_node(spec, node) == want


def test_garbage_in_a_variable_is_not_a_crash():
    world = from_env({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2",
                      "SLURM_RESTART_COUNT": "?"}, hostname="h")
    assert (world.rank, world.size, world.attempt) == (0, 2, 0)


# Slurm's and the launchers' rank variables are read in hpcsuite/world.py alone.
READ_ONLY_THERE = ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_PROCID", "SLURM_LOCALID",
                   "SLURM_RESTART_COUNT", "SLURM_ARRAY_TASK_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                   "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK", "PMI_RANK", "MPI_LOCALRANKID")


def test_no_module_but_world_reads_a_ranks_world_from_the_environment():
    offences = []
    for path in (REPO / "hpcsuite").rglob("*.py"):
        if path.name == "world.py" and path.parent.name == "hpcsuite":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in READ_ONLY_THERE:
                offences.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value}")
    assert not offences, offences
