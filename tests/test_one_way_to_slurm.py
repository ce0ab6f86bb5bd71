"""runner.submit, the one way to Slurm (issue 38), without a cluster: sbatch faked at
slurm.call. A plain job and a sweep's job array are recorded by the same code after sbatch,
and a registry that cannot be written warns but never hides the job id."""

import json
import logging

import pytest

from conftest import slurm_says_its_release
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
    assert said[1].startswith(f"submitted job array 42, but could not record it in "
                              f"{workdir / '.hpcsuite' / 'runs.jsonl'}: ")
    assert len(said) == 2


def _full_disk(monkeypatch, where: str):
    """Every write ``where`` names fails as on a full disk (ENOSPC), after sbatch answered:
    the run directory's mkdir, the script's rename into it, submit.json, or all at once."""
    import errno
    import os
    from pathlib import Path

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    mkdir, replace, write_text = Path.mkdir, os.replace, Path.write_text

    def failing_mkdir(self, *a, **kw):
        if where in ("mkdir", "all") and self.name == "41":
            raise full
        return mkdir(self, *a, **kw)

    def failing_replace(src, dst, *a, **kw):
        if where in ("replace", "all") and str(dst).endswith(".sbatch"):
            raise full
        return replace(src, dst, *a, **kw)

    def failing_write(self, *a, **kw):
        if where in ("submit.json", "all") and self.name in ("submit.json", "profile.json"):
            raise full
        return write_text(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", failing_mkdir)
    monkeypatch.setattr(os, "replace", failing_replace)
    monkeypatch.setattr(Path, "write_text", failing_write)


@pytest.mark.parametrize("where", ["mkdir", "replace", "submit.json", "all"])
def test_a_full_disk_after_sbatch_warns_and_keeps_the_job_id(work, caplog, monkeypatch, where):
    """Slurm has the job once sbatch answered: a write after it that fails (a full or
    over-quota disk) is a warning, and the job id is still what submit returns."""
    workdir, sbatched = work
    request = runner.prepare("job.yaml").request
    _full_disk(monkeypatch, where)
    with caplog.at_level(logging.WARNING, logger="hpcsuite.runner.submit"):
        job = runner.submit(request)
    assert job.job_id == "41" and len(sbatched) == 1
    said = [r.getMessage() for r in caplog.records]
    assert said and said[0].startswith("submitted job 41, but could not ") and \
        "No space left on device" in said[0], said
    assert job.script_path.endswith(".sbatch") and \
        open(job.script_path).read() == request.script        # the script is kept somewhere
    assert registry_lines(workdir)[0]["job_id"] == "41"      # the registry is elsewhere


def test_a_full_disk_after_sbatch_prints_the_id_and_exits_0(work, monkeypatch, caplog):
    from click.testing import CliRunner

    from hpcsuite.cli import main

    sbatch = slurm.call
    answers = {"scontrol": "PartitionName=debug Default=YES MaxNodes=UNLIMITED State=UP\n",
               "sinfo": "node1|1|(null)\n"}

    def call(argv, **kw):         # what Slurm says of the partition, then sbatch
        if slurm_says_its_release(argv):
            return slurm_says_its_release(argv)
        if argv[0] in answers:
            return slurm.Completed(argv, 0, answers[argv[0]], "")
        return sbatch(argv, **kw)
    monkeypatch.setattr(slurm, "call", call)
    _full_disk(monkeypatch, "all")
    result = CliRunner().invoke(main, ["submit", "job.yaml"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "41"
    assert "submitted job 41, but could not move its script into " in caplog.text


def test_a_sweep_arrays_script_that_cannot_be_kept_warns_and_keeps_the_id(work, caplog,
                                                                          monkeypatch):
    workdir, _ = work
    planned = sw.plan_sweep("sweep.yaml", against_slurm=False)
    _full_disk(monkeypatch, "replace")
    with caplog.at_level(logging.WARNING, logger="hpcsuite.runner.submit"):
        _, array_id = sw.run(planned)
    assert array_id == "41"
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("submitted job array 41, but could not ") and \
        "No space left on device" in said[0], said


def test_an_sbatch_timeout_is_its_own_exception_whatever_it_says(work, monkeypatch):
    """The timeout is told by its type (raised by slurm.call), not by its wording: an sbatch
    that failed saying 'did not answer' is not a timeout, one that timed out is whatever its
    message."""
    from hpcsuite.runner.submit import sbatch

    workdir, _ = work
    request = runner.prepare("job.yaml").request
    monkeypatch.undo()                                      # the real slurm.call
    with pytest.raises(slurm.TimedOut, match="did not answer within 0.2s"):
        slurm.call(["sleep", "5"], timeout=0.2)
    for error, hint in [(slurm.TimedOut("sbatch: no reply"), True),
                        (slurm.UserError("sbatch failed (exit 1): the server did not answer "
                                         "the license check"), False)]:
        def call(argv, error=error, **kw):
            raise error
        monkeypatch.setattr(slurm, "call", call)
        staged = workdir / ".submit-1.sbatch"
        with pytest.raises(slurm.UserError) as e:
            sbatch(request, staged)
        assert ("may have been submitted all the same" in str(e.value)) == hint, str(e.value)
        assert not staged.exists()
