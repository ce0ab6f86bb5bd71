"""runner.submit, the one way to Slurm (issue 38), without a cluster: sbatch faked at
slurm.call. A plain job and a sweep's job array are recorded by the same code after sbatch,
and a registry that cannot be written warns but never hides the job id."""

import json
import logging

import pytest

from hpcsuite import runner, slurm
from hpcsuite.sweep import run as sw

BASE = """name: base
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00", partition: debug}
train:
  model: mlp
  data: {kind: synthetic, samples: 256, shape: [8], classes: 4}
  batch_size: 16
"""
PROFILE = """name: test
partitions: {debug: {cpus_per_node: 1, max_time: "01:00:00"}}
sweep_max_parallel: 3
"""
SWEEP = "name: grid\nbase: job.yaml\naxes:\n  train.seed: [1, 2]\n"


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A project with a job, a sweep of it and a site profile; sbatch answers 41, then 42."""
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "profile.yaml").write_text(PROFILE)
    (tmp_path / "job.yaml").write_text(BASE)
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    monkeypatch.chdir(tmp_path)
    ids = iter(["41", "42"])
    sbatched = []

    def call(argv, **kw):
        assert argv[0] == "sbatch", argv
        sbatched.append(argv)
        return slurm.Completed(argv, 0, next(ids) + "\n", "")
    monkeypatch.setattr(slurm, "call", call)
    return tmp_path, sbatched


def registry_lines(workdir):
    path = workdir / ".hpcsuite" / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_job_and_a_sweep_array_are_recorded_the_same_way(work):
    workdir, sbatched = work
    job = runner.submit(runner.prepare("job.yaml").request)
    sd, array_id = sw.run(sw.plan_sweep("sweep.yaml", against_slurm=False))
    assert (job.job_id, array_id) == ("41", "42") and len(sbatched) == 2
    plain, array = registry_lines(workdir)
    assert plain["job_id"] == "41" and "array" not in plain
    assert array["job_id"] == "42" and array["array"]["indices"] == [0, 1]
    assert sd.submissions()[0]["array_job_id"] == "42"
    assert job.script_path == plain["script"] and sd.script("42").is_file()


def test_a_registry_that_cannot_be_written_hides_no_job_id(work, caplog):
    workdir, _ = work
    (workdir / ".hpcsuite").write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="hpcsuite.runner.submit"):
        job = runner.submit(runner.prepare("job.yaml").request)
        _, array_id = sw.run(sw.plan_sweep("sweep.yaml", against_slurm=False))
    assert (job.job_id, array_id) == ("41", "42")
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"submitted job 41, but could not record it in "
                              f"{workdir / '.hpcsuite' / 'runs.jsonl'}: ")
    assert said[1].startswith("submitted job array 42, but could not record it: ")
    assert len(said) == 2
