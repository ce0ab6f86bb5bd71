"""End to end: a job with train.monitor yields a utilisation series, Prometheus textfiles that
prometheus_client's parser reads, and `hpcsuite report` plots. The torch cases read the shared
observability job (tests/shared_observe.py: every observer on at once); the TensorFlow cases
run jobs of their own."""

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import run_cli
from shared_observe import submitted

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MONITORED_TF = (
    "name: mon\nresources: {nodes: 2, time: '00:05:00'}\n"
    "train: {backend: tensorflow, data: {samples: 4096, shape: [32]}, batch_size: 32, "
    "epochs: 1000, max_steps: 1200, monitor: {enabled: true, interval_seconds: 0.2, "
    "prometheus_dir: prom}}\n")


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_monitored_job_records_utilisation_and_prometheus(request, local_cluster, tmp_path,
                                                          backend):
    cluster, env = local_cluster
    job = request.getfixturevalue("observed_job") if backend == "torch" else \
        submitted(env, tmp_path, "mon", MONITORED_TF, steps=1200)
    payload = job.payload
    results = payload["results"]
    assert results["precision_seen"]["compute_dtype"] == "float32"      # the default, fp32
    series = results["utilisation"]
    assert len(series) == 2 and all(len(s) >= 2 for s in series)
    for rank_series in series:
        assert rank_series[-1]["step"] == job.steps
        assert max(s["cpu_percent"] for s in rank_series) > 10
        assert all(s["rss_bytes"] > 50 * 2**20 for s in rank_series)
    # CPU ranks: no GPU energy, and no GPU line in status or report
    assert results["energy_j_per_rank"] == [] and results["energy_j"] is None
    status = run_cli("status", job.name, cwd=job.work, env=env, check=True).stdout
    assert "results: completed" in status and "GPU" not in status
    for rank in (0, 1):
        prom = f"hpcsuite-*-*-{payload['job_id']}-rank-{rank}.prom"
        text = next((job.work / "prom").glob(prom)).read_text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        step = families["hpcsuite_step"].samples[0]
        # The file's last write is the end: the final step, and the job said ended.
        assert step.labels["rank"] == str(rank) and step.value == job.steps
        assert step.labels["host"] in ("node1", "node2")
        assert families["hpcsuite_job_running"].samples[0].value == 0
        assert families["hpcsuite_job_ended"].samples[0].labels["status"] == "completed"
        assert families["hpcsuite_job_end_time_seconds"].samples[0].value > 0
    # Every plot report draws, and no GPU finding; its other lines (the torch job's timeline
    # window and TensorBoard files) are the timeline and TensorBoard tests'.
    report = run_cli("report", job.name, "--out", str(tmp_path / "plots"), cwd=job.work, env=env,
                     check=True).stdout
    plots = [line for line in report.splitlines() if line.endswith(".png")]
    assert "GPU" not in report
    assert sorted(p.rsplit("/", 1)[1] for p in plots) == ["loss.png", "throughput.png",
                                                          "utilisation.png"]
    for p in plots:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


TIMELINE_TF = (
    "name: tl\nresources: {nodes: 2, time: '00:05:00'}\n"
    "train: {backend: tensorflow, data: {samples: 4096, shape: [32]}, batch_size: 32, "
    "epochs: 1000, max_steps: 300, monitor: {timeline_start_step: 100, timeline_steps: 50}}\n")


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_a_timeline_window_is_copied_next_to_the_results(request, local_cluster, tmp_path,
                                                         backend):
    """train.monitor.timeline_steps: Horovod records steps 100-150 only, on rank 0's node-local
    disk; the file lands in the run directory and `hpcsuite report` reads it. (The torch job's
    other observers add no allreduce, and its validation sums are an allgather.)"""
    cluster, env = local_cluster
    job = request.getfixturevalue("observed_job") if backend == "torch" else \
        submitted(env, tmp_path, "tl", TIMELINE_TF)
    run_dir = job.run_dir
    assert "HOROVOD_TIMELINE=DYNAMIC" in (run_dir / "job.sbatch").read_text()
    window = run_dir / "horovod-timeline-steps-100-150.json"
    events = json.loads(window.read_text())
    names = {e.get("name") for e in events}
    assert "NEGOTIATE_ALLREDUCE" in names and "MPI_ALLREDUCE" in names
    assert sorted(p.name for p in run_dir.glob("horovod-timeline*")) == [window.name]
    # The window holds 50 steps' allreduces of each gradient tensor, not the whole run's
    # (300 steps, 960 for torch). (Not the ranks' stop votes, a tensor of their own allreduced
    # every ~0.25 s.)
    votes = {e["pid"] for e in events if e.get("ph") == "M" and
             "hpcsuite.poll" in str((e.get("args") or {}).get("name", ""))}
    per_tensor: dict = {}
    for e in events:
        if e.get("name") == "ALLREDUCE" and e.get("ph") == "B" and e["pid"] not in votes:
            per_tensor[e["pid"]] = per_tensor.get(e["pid"], 0) + 1
    assert per_tensor and all(45 <= n <= 55 for n in per_tensor.values()), per_tensor
    report = run_cli("report", job.name, "--out", str(tmp_path / "plots"), cwd=job.work, env=env,
                     check=True).stdout
    assert "Horovod timeline, steps 100-150, per step" in report and "MPI_ALLREDUCE" in report


def test_a_timeline_window_in_script_mode(local_cluster, tmp_path):
    """The same window from a user's own Horovod loop (hpcsuite.api: run.log() counts steps)."""
    cluster, env = local_cluster
    (tmp_path / "loop.py").write_text(
        "import horovod.torch as hvd, torch\n"
        "from hpcsuite import api\n"
        "hvd.init(); torch.set_num_threads(1)\n"
        "run = api.Run(hvd)\n"
        "x = torch.ones(1000)\n"
        "for batch in run.batches(4096):\n"
        "    if batch.last_in_step:\n"
        "        hvd.allreduce(x, name='grad')\n"
        "        run.log(loss=1.0)\n"
        "run.finish()\n")
    (tmp_path / "s.yaml").write_text(
        "name: tls\nresources: {nodes: 2, time: '00:05:00'}\n"
        "train: {script: loop.py, batch_size: 32, epochs: 2, "
        "monitor: {timeline_start_step: 20, timeline_steps: 30}}\n")
    out = run_cli("submit", "s.yaml", "--wait", "--json", cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    run_dir = tmp_path / json.loads(out.stdout)["run_dir"]
    events = json.loads((run_dir / "horovod-timeline-steps-20-50.json").read_text())
    grads = [e for e in events if e.get("name") == "ALLREDUCE" and e.get("ph") == "B"]
    assert 25 <= len(grads) <= 35
