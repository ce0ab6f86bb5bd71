"""End to end: `hpcsuite doctor` against the real local cluster."""

import json
import time

import pytest

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_doctor_passes_on_the_local_cluster(local_cluster, tmp_path):
    cluster, env = local_cluster
    env = {**env, **cluster.client_env()}      # as `eval "$(hpcsuite cluster env)"` sets it
    started = time.monotonic()
    proc = run_cli("doctor", "--json", cwd=tmp_path, env=env, timeout=600)
    print(f"doctor took {time.monotonic() - started:.1f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert set(checks) >= {"slurm", "slurm-rules", "accounting", "pmi", "mpi", "horovod",
                           "infiniband", "network", "gpus", "fabric", "compute"}
    # The cluster's profile names its fabric, a nominal figure and said so, and the bar a job's
    # preflight.fabric (min_busbw_gbps: site) holds each node pair to.
    fabric = checks["fabric"]
    assert fabric["status"] == "pass" and fabric["detail"].startswith(
        "site profile: 0.25 GB/s, 10 us per step between nodes; one flat ring (nominal: TCP over "
        "loopback"), fabric
    assert fabric["detail"].endswith("site asks 0.2 GB/s busbw of each node pair (80%)"), fabric
    # What it waits for, on stderr (stdout is the JSON), the slow checks side by side.
    assert proc.stderr.startswith("doctor: waiting for Horovod's build"), proc.stderr
    assert "doctor: compute: done after" in proc.stderr, proc.stderr
    assert checks["accounting"]["status"] == "pass"         # slurmdbd of the local cluster
    assert all(c["status"] != "fail" for c in checks.values()), checks
    assert "debug (up)" in checks["slurm"]["detail"]
    # The Slurm it met, read from sbatch --version and scontrol show config, and the rules of
    # later releases applied to the profile's own scripts (none applies to 22.05).
    rules = checks["slurm-rules"]
    assert rules["status"] == "pass" and rules["detail"].startswith(
        "Slurm 22.05.8; PreemptMode OFF, TaskPlugin task/none, MpiDefault none; the profile's "
        "scripts (mpirun, srun): no rule of Slurm 23.02-26.05 fires"), rules
    assert checks["mpi"]["detail"] == "Open MPI 4.1.4 (mpirun --version)", checks["mpi"]
    assert "PyTorch" in checks["horovod"]["detail"] and "MPI" in checks["horovod"]["detail"]
    assert "GPU build: no CUDA, no NCCL" in checks["horovod"]["detail"]     # a CPU build here
    # The probe ran on a compute node of the cluster, with the frameworks the ranks import.
    compute = checks["compute"]["detail"]
    assert "torch 2." in compute and "tensorflow 2." in compute and "horovod 0.28.1" in compute


def test_doctor_fails_with_a_hint_when_the_launchers_pmi_is_missing(local_cluster, tmp_path):
    cluster, env = local_cluster
    profile = tmp_path / "profile.yaml"
    profile.write_text("mpi: {srun_mpi: pmix_v9}\npartitions: {debug: {}, gpu: {gpus_per_node: 4}}\n")
    proc = run_cli("doctor", "--profile", str(profile), "--no-compute", cwd=tmp_path, env=env,
                   timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    pmi = next(i for i, l in enumerate(lines) if l.startswith("FAIL pmi"))
    assert "srun --mpi=pmix_v9" in lines[pmi] and "set mpi.srun_mpi" in lines[pmi + 1]
    assert any(l.startswith("FAIL slurm") and "gpu" in l for l in lines)      # no such partition
    assert any(l.startswith("FAIL horovod") and "no NCCL" in l for l in lines)
    # A profile without a fabric: doctor says what min_busbw_gbps: site cannot do there.
    assert any(l.startswith("WARN fabric") and "names no fabric" in l for l in lines), lines
    assert "Traceback" not in proc.stderr


def test_lint_against_the_local_slurm_reads_its_release_and_applies_its_rules(local_cluster,
                                                                               tmp_path):
    """`lint --slurm` asks the cluster its release (22.05.8) and applies the rules of later ones
    to the rendered script: a job one of them would change (--cpu-bind=rank, ignored from
    24.11: tests/test_slurm_rules.py) is clean on 22.05."""
    cluster, env = local_cluster
    env = {**env, **cluster.client_env()}
    spec = tmp_path / "job.yaml"
    spec.write_text("name: rules\nlauncher: srun\nresources: {nodes: 1, tasks_per_node: 1, "
                    "partition: debug, time: '00:05:00', binding: {cpu_bind: rank}}\n"
                    "train: {backend: torch, data: {kind: synthetic, samples: 64, shape: [8]}}\n")
    proc = run_cli("lint", str(spec), "--slurm", cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == f"{spec}: ok" and "warning" not in proc.stderr, proc.stderr
    # A spec doctor is given: its own script is the one the rules read.
    proc = run_cli("doctor", str(spec), "--no-compute", "--json", cwd=tmp_path, env=env,
                   timeout=300)
    rules = next(c for c in json.loads(proc.stdout) if c["name"] == "slurm-rules")
    assert rules["status"] == "pass" and "the profile's scripts (srun)" in rules["detail"], rules
