"""End to end: how a job ends and what is said of it afterwards. A rank that raises ends the
job at once (the others do not wait for the launcher's kill) and `submit --wait` returns soon
after Slurm has the job ended; `runs` shows the outcome of its attempts beside Slurm's state."""

import json
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# A model whose forward raises on rank 1 at its 40th call (the managed loop, two ranks).
RAISES = """import os, time, torch


class Net(torch.nn.Module):
    def __init__(self, n_in, classes):
        super().__init__()
        self.fc, self.calls = torch.nn.Linear(n_in, classes), 0

    def forward(self, x):
        self.calls += 1
        rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID"))
        if self.calls == 40 and rank == "1":
            open("raised_at", "w").write(repr(time.time()))
            raise RuntimeError("rank 1 gives up")
        return self.fc(x)


def build(input_shape, classes):
    return Net(input_shape[0], classes)
"""

SPEC = """name: raises
resources: {nodes: 2, time: '00:05:00'}
train:
  model: net.py:build
  data: {samples: 100000, shape: [16], classes: 4}
  batch_size: 16
  max_steps: 100000
  monitor: {enabled: true, interval_seconds: 0.2, prometheus_dir: prom}
"""


def _slurm_end(env, job_id: str) -> float:
    """The job's end as Slurm recorded it (whole seconds), as a Unix time."""
    import datetime as dt

    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True,
                         text=True, timeout=30, check=True).stdout
    end = next(w.split("=", 1)[1] for w in out.split() if w.startswith("EndTime="))
    return dt.datetime.fromisoformat(end).timestamp()


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_a_raising_rank_ends_the_job_at_once_and_runs_says_where(local_cluster, tmp_path,
                                                                launcher):
    cluster, env = local_cluster
    (tmp_path / "net.py").write_text(RAISES)
    (tmp_path / "raises.yaml").write_text(SPEC + f"launcher: {launcher}\n")
    proc = subprocess.run([sys.executable, "-m", "hpcsuite", "submit", "raises.yaml", "--wait",
                           "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    returned = time.time()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    job_id = json.loads(proc.stdout)["job_id"]
    raised = float((tmp_path / "raised_at").read_text())
    ended = _slurm_end(env, job_id)
    print(f"\nraise -> Slurm's end {ended - raised:.1f} s (whole seconds); "
          f"raise -> --wait returned {returned - raised:.1f} s; "
          f"Slurm's end -> --wait returned {returned - ended:.1f} s")
    # Before: ~20 s from the raise to the end under either launcher: the survivor, waiting in
    # its allreduce, took no signal until the launcher's SIGKILL (srun: KillWait, 10 s here;
    # mpirun: odls_base_sigkill_timeout, 10 s, twice). Now the survivor ends as soon as the
    # failed rank's report exists, which ends srun's step at once; the batch script ends an
    # mpirun still up a second after the report, so Slurm's end comes at once too, but the
    # job stays COMPLETING (what --wait waits for) while Open MPI's daemon on the other node
    # sleeps out its kill timeout (odls_base_sigkill_timeout, 10 s).
    assert ended - raised < 8, (ended - raised, proc.stderr[-2000:])
    assert returned - ended < (3 if launcher == "srun" else 15), returned - ended
    listed = {r["job_id"]: r for r in json.loads(run_cli("runs", "--json", cwd=tmp_path,
                                                         env=env, check=True).stdout)}
    assert listed[job_id]["state"] == "FAILED"
    assert listed[job_id]["outcome"] == "failed at attempt 0 (exit 1)"
    table = run_cli("runs", cwd=tmp_path, env=env, check=True).stdout
    assert "OUTCOME" in table and "failed at attempt 0 (exit 1)" in table
    # Both ranks' Prometheus textfiles say the job ended, failed: the one that raised and the
    # one its failure ended.
    for rank in (0, 1):
        text = next((tmp_path / "prom").glob(f"hpcsuite-*-*-{job_id}-rank-{rank}.prom")).read_text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["hpcsuite_job_running"].samples[0].value == 0, text
        assert families["hpcsuite_job_ended"].samples[0].labels["status"] == "failed"
        assert families["hpcsuite_job_end_time_seconds"].samples[0].value >= raised
