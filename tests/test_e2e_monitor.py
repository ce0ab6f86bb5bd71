"""End to end: a job with train.monitor yields a utilisation series, Prometheus textfiles that
prometheus_client's parser reads, and `hpcsuite report` plots."""

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_monitored_job_records_utilisation_and_prometheus(local_cluster, tmp_path, backend):
    cluster, env = local_cluster
    (tmp_path / "mon.yaml").write_text(
        f"name: mon\nresources: {{nodes: 2, time: '00:05:00'}}\n"
        f"train: {{backend: {backend}, data: {{samples: 4096, shape: [32]}}, batch_size: 32, "
        "epochs: 1000, max_steps: 1200, monitor: {enabled: true, interval_seconds: 0.2, "
        "prometheus_dir: prom}}\n")
    out = run_cli("submit", "mon.yaml", "--wait", "--json", cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    payload = json.loads(out.stdout)
    results = payload["results"]
    series = results["utilisation"]
    assert len(series) == 2 and all(len(s) >= 2 for s in series)
    for rank_series in series:
        assert rank_series[-1]["step"] == 1200
        assert max(s["cpu_percent"] for s in rank_series) > 10
        assert all(s["rss_bytes"] > 50 * 2**20 for s in rank_series)
    for rank in (0, 1):
        text = (tmp_path / "prom" / f"hpcsuite-{payload['job_id']}-rank-{rank}.prom").read_text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        step = families["hpcsuite_step"].samples[0]
        assert step.labels["rank"] == str(rank) and 0 < step.value <= 1200
        assert step.labels["host"] in ("node1", "node2")
    plots = run_cli("report", "mon", cwd=tmp_path, env=env, check=True).stdout.split()
    assert sorted(p.rsplit("/", 1)[1] for p in plots) == ["loss.png", "throughput.png",
                                                          "utilisation.png"]
    for p in plots:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
