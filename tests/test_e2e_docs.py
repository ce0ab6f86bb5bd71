"""End to end on the local Slurm cluster: what docs/user shows works there.

The job-spec example of docs/user/job-specs.md (every key, `preflight: {fabric: {min_busbw_gbps:
site}}` included) lints against the cluster's profile and Slurm, and runs: its fabric preflight
holds node1-node2 to 80 % of the profile's fabric, and it trains. The quickstart's lines that
submit nothing run as written, and so does the preemption page's preempt-by-hand block.
(tests/test_docs.py checks every block without a cluster.)"""

import json
import re
import shlex

import pytest

import docblocks
from conftest import REPO, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PREP = """name: prep
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train: {data: {kind: synthetic, samples: 256, shape: [32], classes: 10}, max_steps: 5}
"""


def _block(page: str, lang: str = "yaml") -> str:
    return next(b.text for b in docblocks.blocks([REPO / "docs" / "user" / page]) if b.lang == lang)


def test_the_job_specs_example_lints_and_runs_on_the_local_cluster(local_cluster, tmp_path):
    cluster, env = local_cluster
    env = {**env, **cluster.client_env()}      # as `eval "$(hpcsuite cluster env)"` sets it
    text = _block("job-specs.md")
    # `after: [prep, "41:any"]` names the reader's own jobs: a job named prep is submitted
    # here first, and job 41 is that job's id.
    (tmp_path / "prep.yaml").write_text(PREP)
    prep = run_cli("submit", "prep.yaml", "--json", cwd=tmp_path, env=env, check=True)
    prep_id = json.loads(prep.stdout)["job_id"]
    assert '"41:any"' in text
    (tmp_path / "example.yaml").write_text(text.replace('"41:any"', f'"{prep_id}:any"'))
    lint = run_cli("lint", "example.yaml", cwd=tmp_path, env=env)
    assert lint.returncode == 0 and "error" not in lint.stderr, lint.stdout + lint.stderr
    assert "partition" not in lint.stderr and "fabric" not in lint.stderr, lint.stderr
    out = run_cli("submit", "example.yaml", "--wait", "--json", cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    payload = json.loads(out.stdout)
    run_dir = tmp_path / "runs" / "quickstart" / payload["job_id"]
    record = json.loads((run_dir / "preflight.json").read_text())
    assert record["passed"], record
    assert record["fabric"]["required_busbw_Bps"] == pytest.approx(0.2e9)   # 80 % of 0.25 GB/s
    assert payload["results"]["status"] == "completed", payload["results"]
    assert payload["results"]["final_step"] > 0


def _quickstart_lines() -> list[list[str]]:
    """The quickstart's `hpcsuite` lines that submit nothing, optional [parts] dropped."""
    out = []
    for block in docblocks.blocks([REPO / "docs" / "user" / "quickstart.md"]):
        for argv in docblocks.commands(block.text):
            words = [w for w in argv if not (w.startswith("[") or w.endswith("]"))]
            if words[:2] in (["hpcsuite", "render"], ["hpcsuite", "lint"],
                             ["hpcsuite", "config"]) or words[:2] == ["hpcsuite", "submit"] \
                    and "--dry-run" in words:
                out.append(words)
    return out


def test_the_quickstarts_lines_that_submit_nothing_run_as_written(local_cluster):
    cluster, env = local_cluster
    env = {**env, **cluster.client_env()}
    lines = _quickstart_lines()
    assert len(lines) >= 4, lines
    for argv in lines:
        proc = run_cli(*argv[1:], cwd=REPO, env=env, timeout=120)
        assert proc.returncode == 0, f"{shlex.join(argv)}:\n{proc.stdout}{proc.stderr}"
        assert not re.search(r"^(error|warning):", proc.stderr, re.MULTILINE), proc.stderr


def test_the_preemption_pages_block_preempts_a_job_by_hand(preempted_job):
    """docs/user/preemption.md's lines, as written, job 42 being the id submit printed
    (shared_preempt.preempted_job runs the submit and the scancel): the warning signal stops
    the job at a checkpoint, it requeues and completes, and `status` says so."""
    job = preempted_job
    assert job.state["state"] == "COMPLETED", job.state
    status = run_cli(*job.lines[2][1:], cwd=job.work, env=job.env, check=True).stdout
    assert "preempted" in status, status
    logs = run_cli(*job.lines[3][1:], cwd=job.work, env=job.env, check=True).stdout
    assert logs.strip(), logs
