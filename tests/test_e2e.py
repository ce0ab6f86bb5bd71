"""End to end: the quickstart job through the real local Slurm cluster, OpenMPI and Horovod."""

import json

import pytest

from conftest import SBATCH, run_cli, submit_spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def quickstart(local_cluster, tmp_path_factory):
    """The quickstart, submitted with --wait: (env, its directory, the CompletedProcess). Read
    by the quickstart test and by status and logs of a finished job."""
    cluster, env = local_cluster
    work = tmp_path_factory.mktemp("quickstart")
    proc = run_cli("submit", str(SBATCH / "quickstart.yaml"), "--wait", "--timeout", "600",
                   cwd=work, env=env, timeout=700)
    return env, work, proc


def test_quickstart_trains_on_two_ranks(quickstart):
    env, tmp_path, proc = quickstart
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    run_dirs = list((tmp_path / "runs" / "quickstart").iterdir())
    run_dir = next(d for d in run_dirs if d.is_dir())
    results = json.loads((run_dir / "results.json").read_text())
    assert results["world_size"] == 2
    assert sorted(results["hosts"]) == ["node1", "node2"]      # one rank per virtual node
    assert results["steps"] == 3 * 64                           # 8192 / (2*64) per epoch
    losses = results["loss"]
    assert len(losses) == results["steps"]
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10
    sums = results["param_checksums"]
    assert len(sums) == 2 and sums[0] == sums[1]
    assert results["samples"] == 3 * 8192 and results["samples_per_s"] > 0
    for key in ("torch", "horovod", "mpi", "slurm"):
        assert results["versions"][key], key
    assert "slurm" in results["versions"]["slurm"] and "Open MPI" in results["versions"]["mpi"]
    assert {p.name for p in run_dir.iterdir()} >= {"job.sbatch", "job.json", "submit.json",
                                                   "rank-0.json", "rank-1.json", "results.json"}
    # The batch shell's attempt record and the ranks' records name the same Slurm node (the
    # machine's host name is the same for node1 and node2): hpcsuite/world.py read both.
    [attempt] = [json.loads(l) for l in (run_dir / "attempts.jsonl").read_text().splitlines()]
    ranks = [json.loads((run_dir / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert attempt["host"] == "node1" and ranks[0]["host"] == "node1", (attempt, ranks[0])
    assert ranks[1]["host"] == "node2"
    # What the user is shown: ranks, throughput, loss and where the outputs are.
    assert "2 ranks on" in proc.stdout and "samples/s" in proc.stdout and str(run_dir) in proc.stdout


def test_failing_job_exits_nonzero_with_log_tail(broken_job):
    # A model name the runtime does not know: the job itself fails on the compute nodes.
    env, work, proc = broken_job
    # The job ended on an error in its input: exit 2, that error first.
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ended FAILED: unknown model 'nosuchmodel'" in proc.stderr
    assert "last lines of" in proc.stderr


def test_status_and_logs_of_finished_job(quickstart):
    """On the quickstart's job (issue 52: a job of its own only fed these two commands)."""
    env, work, proc = quickstart
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = next(d.name for d in (work / "runs" / "quickstart").iterdir() if d.is_dir()
                  and d.name.isdigit())
    status = run_cli("status", job_id, "--json", env=env, check=True)     # by id, from anywhere
    assert json.loads(status.stdout)["state"] == "COMPLETED"
    logs = run_cli("logs", job_id, env=env, check=True)
    assert "hpcsuite train: completed at step 192; wrote" in logs.stdout


def test_srun_pmix_across_two_virtual_nodes(local_cluster, tmp_path):
    """srun --mpi=pmix starts the ranks itself; per-node TmpFS keeps the PMIx dirs apart."""
    cluster, env = local_cluster
    results = submit_spec(env, tmp_path, "name: srun2\nlauncher: srun\n"
                          "resources: {nodes: 2, tasks_per_node: 1}\n"
                          "train: {data: {samples: 512}, max_steps: 4}\n")["results"]
    assert results["world_size"] == 2 and sorted(results["hosts"]) == ["node1", "node2"]
    assert len(set(results["param_checksums"])) == 1
