"""End to end on the local Slurm cluster, 2 ranks: what hpcsuite says of a user's own script
(issue 42 points 5, 6, 7, 11 and the Keras 3 hint). A script that does not compile never
reaches Slurm; one that raises is named in `submit --wait`'s headline (type and message, rank
and node, file:line) with its traceback's last frames, and its log has each rank's report
whole; a script without hpcsuite.api completes and says where its output is; one that never
calls hvd.init() is not passed off as one distributed run; a Keras 3 failure of Horovod's
upstream examples points to the docs. Unit tests: tests/test_script_words.py."""

import json
import re
import subprocess

import pytest

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SPEC = ("name: {name}\nresources: {{nodes: 2, tasks_per_node: 1, time: '00:05:00'}}\n"
        "train: {{backend: {backend}, script: {script}}}\n")


def _submit(env, work, name, script, source, backend="torch"):
    (work / script).write_text(source)
    (work / f"{name}.yaml").write_text(SPEC.format(name=name, script=script, backend=backend))
    return run_cli("submit", f"{name}.yaml", "--wait", cwd=work, env=env, timeout=500)


def _job_id(work, name):
    log = next((work / "runs" / name).glob("slurm-*.out"))
    return log.name[len("slurm-"):-len(".out")], log.read_text()


def test_a_script_that_does_not_compile_never_reaches_slurm(local_cluster, tmp_path):
    _, env = local_cluster
    before = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout
    proc = _submit(env, tmp_path, "syntax", "train.py", "import horovod.torch as hvd\nhvd.init(\n")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr == "error: syntax.yaml: train.script: train.py:2: SyntaxError: '(' was " \
                          "never closed\n", proc.stderr
    after = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout
    assert before == after and not (tmp_path / "runs").exists()


RAISES = '''import glob
import os
import time


def fetch(url):
    raise RuntimeError(f"could not read {url}:\\n<urlopen error [Errno 111] Connection refused>")


rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("SLURM_PROCID"))
while rank == 1 and not glob.glob(os.path.join(os.environ["HPCSUITE_RUN_DIR"], "FAILED-*")):
    time.sleep(0.01)       # rank 0 fails first, rank 1 just after it
fetch(f"http://127.0.0.1:9/shard-{rank}")
'''


def test_a_script_that_raises_is_named_in_the_headline_with_its_last_frames(local_cluster, tmp_path):
    _, env = local_cluster
    proc = _submit(env, tmp_path, "raises", "fetch.py", RAISES)
    job_id, log = _job_id(tmp_path, "raises")
    assert proc.returncode == 1, proc.stdout + proc.stderr + log
    node = re.search(r"hpcsuite train: rank 0 on (\S+) failed:\n", log).group(1)
    lines = proc.stderr.splitlines()
    headline = next(i for i, l in enumerate(lines) if l.startswith("error: "))
    assert lines[headline] == (
        f"error: job {job_id} ended FAILED (exit 1:0): rank 0 on {node}: RuntimeError: could not "
        "read http://127.0.0.1:9/shard-0: <urlopen error [Errno 111] Connection refused> (at "
        "fetch.py:7 in fetch)"), proc.stderr
    shown = lines[headline + 1:]
    assert shown[0] == "Traceback (most recent call last):" and \
        '  File "fetch.py", line 7, in fetch' in shown, proc.stderr
    assert shown[-3:-1] == ["RuntimeError: could not read http://127.0.0.1:9/shard-0:",
                            "<urlopen error [Errno 111] Connection refused>"], proc.stderr
    assert shown[-1].startswith("the whole log: ") and f"(hpcsuite logs {job_id})" in shown[-1]
    assert "runpy" not in proc.stderr and "mpirun" not in proc.stderr and \
        "Primary job" not in proc.stderr, proc.stderr
    # The log: rank 0's report once and whole. Rank 1 raises just after it; its one line (when
    # it gets there before it sees rank 0's marker and ends at once) names the first, not "above".
    assert log.count("Traceback (most recent call last)") == 1, log
    too = [l for l in log.splitlines() if "failed too" in l]
    assert len(too) <= 1 and all(re.fullmatch(
        r"hpcsuite train: rank 1 on \S+ failed too \(<urlopen error \[Errno 111\] Connection "
        r"refused>\); rank 0's failure, the first, is reported in this log and in "
        + rf"\S*/raises/{job_id}/FAILED-attempt-0", line) for line in too), log
    assert "reported above" not in log
    for line in log.splitlines():       # no rank's line run into another's
        assert line.count("hpcsuite train: rank") <= 1, line
    status = run_cli("status", job_id, cwd=tmp_path, env=env, check=True).stdout
    assert f"  error (attempt 0, rank 0 on {node}): RuntimeError: could not read " \
           "http://127.0.0.1:9/shard-0: <urlopen error [Errno 111] Connection refused> (at " \
           "fetch.py:7 in fetch)" in status, status


NO_API = '''import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
print(f"rank {hvd.rank()} of {hvd.size()}: sum {total.item():.0f}", flush=True)
'''

NO_INIT = '''import os
import torch

rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("SLURM_PROCID")
print(f"rank {rank}: trained alone, loss {torch.tensor([0.5]).item()}", flush=True)
'''


def test_a_script_without_hpcsuite_api_completes_and_says_where_its_output_is(local_cluster, tmp_path):
    _, env = local_cluster
    proc = _submit(env, tmp_path, "plain", "plain.py", NO_API)
    job_id, log = _job_id(tmp_path, "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr + log
    said = (f"job {job_id} completed; the script records nothing through hpcsuite.api: its "
            f"output is in `hpcsuite logs {job_id}`")
    assert proc.stdout.splitlines()[-1] == said, proc.stdout
    assert "warning" not in proc.stdout and "rank 1 of 2: sum 2" in log
    status = run_cli("status", job_id, cwd=tmp_path, env=env, check=True).stdout
    assert f"  {said[len(f'job {job_id} '):]}" in status, status
    assert json.loads(run_cli("status", job_id, "--json", cwd=tmp_path, env=env,
                              check=True).stdout)["script"][1]["horovod_size"] == 2
    report = run_cli("report", job_id, cwd=tmp_path, env=env)
    assert report.returncode == 0 and report.stdout == f"{said}; there is nothing to plot\n", \
        report.stdout + report.stderr


def test_a_script_that_never_calls_hvd_init_is_not_a_distributed_run(local_cluster, tmp_path):
    _, env = local_cluster
    proc = _submit(env, tmp_path, "alone", "alone.py", NO_INIT)
    job_id, log = _job_id(tmp_path, "alone")
    assert proc.returncode == 0, proc.stdout + proc.stderr + log
    warning = ("warning: none of the 2 ranks joined a Horovod world (the script never called "
               "hvd.init()): each trained alone as a world of one, not one distributed run")
    assert warning in proc.stdout.splitlines(), proc.stdout
    status = run_cli("status", job_id, cwd=tmp_path, env=env, check=True).stdout
    assert f"  {warning}" in status, status
    assert log.count("never joined a Horovod world (the script never called hvd.init())") == 2, log


KERAS_EXAMPLE = '''import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow.keras as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
opt = tf.optimizers.Adam(0.001 * hvd.size())
# As Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py does:
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
              experimental_run_tf_function=False)
'''


def test_the_upstream_keras_example_under_keras_3_points_to_the_docs(local_cluster, tmp_path):
    _, env = local_cluster
    proc = _submit(env, tmp_path, "keras3", "keras_mnist.py", KERAS_EXAMPLE, backend="tensorflow")
    job_id, log = _job_id(tmp_path, "keras3")
    assert proc.returncode == 1, proc.stdout + proc.stderr + log
    headline = next(l for l in proc.stderr.splitlines() if l.startswith("error: "))
    assert "experimental_run_tf_function" in headline and "(at keras_mnist.py:11 in <module>)" \
        in headline, headline
    assert headline.endswith("; Horovod's TF2/Keras examples do not run under Keras 3 (Horovod "
                             "issue #4290): docs/user/your-code.md#keras-3 says what to change"), headline
    assert "docs/user/your-code.md#keras-3" in log


def test_a_failed_preflight_is_named_in_the_headline(local_cluster, tmp_path):
    _, env = local_cluster
    (tmp_path / "slow.yaml").write_text(
        "name: slow\nresources: {nodes: 2, tasks_per_node: 1, time: '00:05:00'}\n"
        "preflight: {fabric: {min_busbw_gbps: 10000, size_mb: 4}}\n"
        "train: {data: {samples: 512, shape: [16], classes: 4}, batch_size: 16, max_steps: 10}\n")
    proc = run_cli("submit", "slow.yaml", "--wait", cwd=tmp_path, env=env, timeout=500)
    job_id, log = _job_id(tmp_path, "slow")
    assert proc.returncode == 2, proc.stdout + proc.stderr + log
    headline = next(l for l in proc.stderr.splitlines() if l.startswith("error: "))
    assert headline.startswith(f"error: job {job_id} ended FAILED: preflight.fabric: 1 of 1 node "
                               "pair(s) below the 10000 GB/s busbw required: node1-node2 "), headline
