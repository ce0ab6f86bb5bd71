"""End to end: the loss a user sees while a job runs (progress.json, which `status` and
`submit --wait` print) is the global mean loss of its step on every rank, the number results.json
records for that step, on 2 ranks, for both backends, padded last steps included."""

import json
import time
from pathlib import Path

import pytest

from conftest import run_cli
from shared_observe import OBSERVED_EPOCHS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# 1000 samples, 2 ranks x 64: 8 steps an epoch, the last one padded (104 real samples of 128).
SPEC = """name: live-{backend}
resources: {{nodes: 2, tasks_per_node: 1}}
train:
  backend: {backend}
  model: mlp
  data: {{samples: 1000, shape: [16], classes: 4}}
  batch_size: 64
  epochs: {epochs}
  lr: 0.05
"""


def follow(env, work: Path, spec_text: str) -> tuple[Path, dict, list[dict]]:
    """Submit, read progress.json while the job runs; (run directory, results.json, every
    progress record seen, by step)."""
    (work / "job.yaml").write_text(spec_text)
    proc = run_cli("submit", "job.yaml", "--json", cwd=work, env=env, check=True)
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    seen: dict[int, dict] = {}
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not (run_dir / "results.json").is_file():
        try:
            p = json.loads((run_dir / "progress.json").read_text())
            seen[p["step"]] = p
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    results = json.loads((run_dir / "results.json").read_text())
    final = json.loads((run_dir / "progress.json").read_text())
    seen[final["step"]] = final
    return run_dir, results, [seen[k] for k in sorted(seen)]


@pytest.mark.parametrize("backend,epochs", [("torch", OBSERVED_EPOCHS), ("tensorflow", 40)])
def test_live_loss_is_the_global_mean_of_its_step(request, local_cluster, tmp_path, backend,
                                                  epochs):
    """torch: the shared observability job (tests/shared_observe.py), the same 8 steps an epoch
    with a tenth of its samples held out; tensorflow: a job of its own."""
    _cluster, env = local_cluster
    if backend == "torch":
        job = request.getfixturevalue("observed_job")
        name, run_dir, seen = job.name, job.run_dir, list(job.seen)
        results = json.loads((run_dir / "results.json").read_text())
    else:
        name = f"live-{backend}"
        run_dir, results, seen = follow(env, tmp_path, SPEC.format(backend=backend, epochs=epochs))
    assert results["status"] == "completed" and results["world_size"] == 2
    loss = results["loss"]
    assert len(loss) == results["final_step"] == 8 * epochs
    # the last progress is the last step, a padded one
    assert seen[-1]["step"] == results["final_step"]
    with_loss = [p for p in seen if p.get("loss") is not None]
    assert len(with_loss) >= 2, f"progress seen only at steps {[p['step'] for p in seen]}"
    for p in with_loss:
        assert p["loss"] == pytest.approx(loss[p["step"] - 1], rel=1e-6), \
            f"step {p['step']}: live {p['loss']} vs results.json {loss[p['step'] - 1]}"
    # status prints the same number, asked by job id from any directory
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    deadline = time.monotonic() + 120            # results.json comes just before the job ends
    while True:
        shown = json.loads(run_cli("status", results["job_id"], "--json", cwd=elsewhere,
                                   env=env, check=True).stdout)
        if shown["state"] == "COMPLETED" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert shown["name"] == name and shown["run_dir"] == str(run_dir)
    assert shown["progress"]["loss"] == pytest.approx(loss[-1], rel=1e-6)
    assert "None" not in json.dumps(shown)
    text = run_cli("status", results["job_id"], cwd=elsewhere, env=env, check=True).stdout
    assert text.startswith(f"job {results['job_id']} ({name}): COMPLETED")
    assert f"loss {loss[-1]:.4f}" in text


def test_max_steps_alone_is_not_capped_at_one_epoch(local_cluster, tmp_path):
    _cluster, env = local_cluster
    spec = SPEC.format(backend="torch", epochs=1).replace("  epochs: 1\n", "  max_steps: 20\n")
    assert "epochs" not in spec
    _run_dir, results, _seen = follow(env, tmp_path, spec)
    # 8 steps an epoch: 20 steps run into a third epoch
    assert results["status"] == "completed" and results["final_step"] == 20
    assert results["cursor"]["epoch"] == 2 and results["epochs"] == 3


def test_a_job_slurm_can_never_start_is_refused_or_ends_the_wait(local_cluster, tmp_path):
    """More nodes than the partition has: refused before sbatch. A time limit over the
    partition's (which hpcsuite does not know without a site profile): Slurm queues it with
    PartitionTimeLimit, `status` says why and `submit --wait` ends with exit 2."""
    import subprocess

    from hpcsuite.runs import jobs
    from hpcsuite.site.slurm_conf import OTHER_PARTITION

    _cluster, env = local_cluster
    spec = SPEC.format(backend="torch", epochs=1) + f"  max_steps: 2\n"
    spec = spec.replace("resources: {nodes: 2, tasks_per_node: 1}",
                        f"resources: {{nodes: 3, tasks_per_node: 1, partition: {OTHER_PARTITION}}}")
    (tmp_path / "job.yaml").write_text(spec)
    refused = run_cli("submit", "job.yaml", cwd=tmp_path, env=env)
    assert refused.returncode == 2 and refused.stderr.startswith(
        f"error: job.yaml: resources.nodes: 3 nodes, but partition '{OTHER_PARTITION}' has 2 "), \
        refused.stderr
    assert not (tmp_path / "runs").exists()              # nothing reached sbatch

    scontrol = ["scontrol", "update", f"PartitionName={OTHER_PARTITION}"]
    subprocess.run([*scontrol, "MaxTime=1"], env=env, check=True)
    try:
        (tmp_path / "job.yaml").write_text(spec.replace("nodes: 3", "nodes: 2").replace(
            "tasks_per_node: 1,", "tasks_per_node: 1, time: '00:05:00',"))
        waited = run_cli("submit", "job.yaml", "--wait", cwd=tmp_path, env=env, timeout=300)
        assert waited.returncode == 2, waited.stdout + waited.stderr
        last = waited.stderr.strip().splitlines()[-1]
        # Slurm 22.05 says PartitionConfig here (newer ones PartitionTimeLimit): both are final
        reason = next((r for r in ("PartitionTimeLimit", "PartitionConfig") if r in last), None)
        assert last.startswith("error: job ") and reason and \
            f"can never start: {reason}: {jobs.NEVER_STARTS[reason]}" in last, waited.stderr
        job_id = last.split()[2]
        # Slurm may change its mind between the two final reasons (PartitionConfig at the
        # wait's end, PartitionTimeLimit a moment later): `status` explains whichever it gives.
        status = run_cli("status", job_id, cwd=tmp_path, env=env, check=True).stdout
        assert "PENDING" in status and any(f"({r}: {jobs.NEVER_STARTS[r]})" in status for r in
                                           ("PartitionTimeLimit", "PartitionConfig")), status
        run_cli("cancel", job_id, cwd=tmp_path, env=env, check=True)
    finally:
        subprocess.run([*scontrol, "MaxTime=INFINITE"], env=env, check=True)
