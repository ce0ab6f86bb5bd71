"""End to end on the local Slurm cluster: what each rank shows and which device it gets (issue
T, points 5 and 7). Rank 0's log line ("step N, epoch E, loss X"), in its rank log and through
`hpcsuite logs`, is the step's global mean, the number results.json records; a GPU job with more
ranks per node than GPUs is refused at submit unless the spec says the sharing is meant, and then
both ranks run on the one GPU."""

import json
import os
import re
from pathlib import Path

import pytest

from conftest import run_cli, submit_spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LINE = re.compile(r"rank 0 hpcsuite\.runtime\.session\.loop: step (\d+), epoch \d+, loss ([0-9.]+)")

def test_rank_0s_log_line_is_the_global_mean_loss(observed_job, local_cluster):
    """On the shared observability job (tests/shared_observe.py): 2 ranks, each its own share of
    every step's samples."""
    _, env = local_cluster
    run_dir = observed_job.run_dir
    results = json.loads((run_dir / "results.json").read_text())
    assert results["world_size"] == 2
    logs = run_cli("logs", str(run_dir), "--rank", "0", cwd=observed_job.work, env=env)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    for text in ((run_dir / "logs" / "rank-0.log").read_text(), logs.stdout):
        lines = LINE.findall(text)
        assert lines, text
        for step, loss in lines:
            assert loss == f"{results['loss'][int(step) - 1]:.4f}", (step, loss, results["loss"])


# What a rank sees: no framework, so the ranks start in a second.
SEEN = """import json, os
from pathlib import Path
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["SLURM_PROCID"]
Path(os.environ["HPCSUITE_RUN_DIR"], f"seen-{rank}.json").write_text(
    json.dumps({"visible": os.environ.get("CUDA_VISIBLE_DEVICES")}))
"""

SHARE_SPEC = """name: share-{launcher}
launcher: {launcher}
resources: {{nodes: 1, tasks_per_node: 2, gpus_per_node: 1, partition: debug{more}}}
train: {{script: seen.py}}
"""


@pytest.fixture(scope="module")
def gpu_cluster(wide_cluster):
    """The session's wide cluster (2 GPUs a node) and its profile."""
    from conftest import cancel_all

    yield dict(os.environ, **wide_cluster.client_env())
    cancel_all(wide_cluster)


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_two_ranks_on_one_gpu_are_refused_unless_sharing_is_meant(gpu_cluster, tmp_path, launcher):
    env = gpu_cluster
    (tmp_path / "seen.py").write_text(SEEN)
    (tmp_path / "job.yaml").write_text(SHARE_SPEC.format(launcher=launcher, more=""))
    refused = run_cli("submit", "job.yaml", cwd=tmp_path, env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    error = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "resources.tasks_per_node" in error[0] and \
        "resources.gpus_per_node" in error[0] and "gpu_sharing" in error[0], refused.stderr
    assert "Traceback" not in refused.stderr
    out = submit_spec(env, tmp_path, SHARE_SPEC.format(launcher=launcher,
                                                       more=", gpu_sharing: true"))
    run_dir = Path(tmp_path / out["run_dir"])
    seen = {p.name: json.loads(p.read_text())["visible"] for p in run_dir.glob("seen-*.json")}
    assert seen == {"seen-0.json": "0", "seen-1.json": "0"}, seen
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("rank-*.log"))
    assert logs.count("shared with other ranks of the node: resources.gpu_sharing") == 2, logs


# Script mode: rank r's loss is r + 1 on every step, so rank 0's share (1) is not the mean (1.5).
SHARES = """import horovod.torch as hvd
from hpcsuite import api

hvd.init()
run = api.Run(hvd)
for batch in run.batches(256):
    run.log(loss=hvd.rank() + 1.0)
    if run.should_stop():
        break
run.finish()
"""


def test_script_modes_log_line_progress_and_results_are_the_global_mean(local_cluster, tmp_path):
    _, env = local_cluster
    (tmp_path / "shares.py").write_text(SHARES)
    out = submit_spec(env, tmp_path, "name: shares\nresources: {nodes: 2, tasks_per_node: 1}\n"
                                     "train: {script: shares.py, batch_size: 8, epochs: 1}\n")
    run_dir = tmp_path / out["run_dir"]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["world_size"] == 2 and results["loss"] == [1.5] * 16
    assert json.loads((run_dir / "progress.json").read_text())["loss"] == 1.5
    lines = re.findall(r"rank 0 hpcsuite\.api: step \d+, epoch \d+, loss ([0-9.]+)",
                       (run_dir / "logs" / "rank-0.log").read_text())
    assert lines and set(lines) == {"1.5"}, lines
