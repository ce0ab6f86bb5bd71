"""Failures outside the ranks say why (issue 51, point 11): a checkpoint directory the job
could not write is refused at submit; an attempt that could not start says what stopped it
in `status`; a log Slurm could not open (its 0:53) is said as that, never as a signal."""

import json
import os
import subprocess

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.errors import UserError
from hpcsuite.runner.status import error_rank, error_said, exit_words, reported_error
from hpcsuite.runs.ownership import check_before_submit
from hpcsuite.runs.rundir import RunDir
from hpcsuite.submit.spec import spec_from_dict


def job(directory):
    return spec_from_dict({"name": "a", "train": {"checkpoint": {"every_steps": 5,
                                                                 "dir": str(directory)}}}, "t")


def test_a_checkpoint_dir_under_a_file_is_refused_at_submit(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"train.checkpoint.dir cannot be written \(.*/file is "
                                        r"not a directory\)"):
        check_before_submit(job(tmp_path / "file" / "ck"), tmp_path)
    check_before_submit(job(tmp_path / "new" / "ck"), tmp_path)      # creatable: fine


@pytest.fixture
def read_only(tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_a_checkpoint_dir_on_a_read_only_filesystem_is_refused_at_submit(tmp_path, read_only):
    with pytest.raises(UserError, match=r"ro/ck: train.checkpoint.dir cannot be written \(.*/ro "
                                        r"is on a read-only filesystem\); the job would fail"):
        check_before_submit(job(read_only / "ck"), tmp_path)


def test_an_attempt_that_could_not_start_says_why_in_status(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    run = tmp_path / "run"
    run.mkdir()
    RunDir(run).job.write_text(json.dumps(job(tmp_path / "file" / "ck").to_dict()))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    result = CliRunner().invoke(main, ["attempt", "begin", "--run-dir", str(run)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.output.startswith("error: attempt 0 could not start: ") and "/file/ck" in \
        result.output, result.output
    said = reported_error(run)
    assert error_rank(said).startswith("the batch script on ")
    assert error_said(said).startswith("attempt 0 could not start: ") and "Not a directory" in \
        error_said(said), said


def test_a_log_slurm_could_not_open_is_said_as_that():
    said = exit_words("0:53", "/scratch/runs/a/slurm-7.out")
    assert said.startswith("exit 0:53: the batch script never started: Slurm could not open its "
                           "log /scratch/runs/a/slurm-7.out; the job's user must be able to")
    assert "killed" not in said
    assert exit_words("0:15") == "exit 0:15 (the batch script was killed by SIGTERM)"


def test_status_shows_each_failed_attempts_cause_and_leads_with_none_after_completion(tmp_path):
    """Issue 51, points 14 and 16: a requeued job that completed led `status` with attempt
    0's error; a second failure's cause was not shown at all."""
    from hpcsuite.runner.status import StatusRecord, reported_errors
    from hpcsuite.runs.jobs import JobState
    from hpcsuite.runs.results import mark_failed

    mark_failed(RunDir(tmp_path).failed(0), 1, 205, "error: ORTE has lost communication",
                node="node2")
    mark_failed(RunDir(tmp_path).failed(1), 0, 1, "error: the ranks on node2 are gone",
                node="node1")
    errors = reported_errors(tmp_path)
    assert [e["attempt"] for e in errors] == [0, 1]
    records = [{"attempt": 0, "outcome": "failed"}, {"attempt": 1, "outcome": "failed"},
               {"attempt": 2, "outcome": "completed"}]
    done = JobState("7", "COMPLETED", "0:0", None, None, None)
    text = "\n".join(StatusRecord(job_id="7", state=done, run_dir=tmp_path, records=records,
                                  error=errors[-1], errors=errors).lines())
    assert "  attempt 0 failed (rank 1 on node2): ORTE has lost communication" in text, text
    assert "  attempt 1 failed (rank 0 on node1): the ranks on node2 are gone" in text, text
    assert "error (attempt" not in text
    failed = JobState("7", "FAILED", "1:0", None, None, None)
    text = "\n".join(StatusRecord(job_id="7", state=failed, run_dir=tmp_path, records=records[:2],
                                  error=errors[-1], errors=errors).lines())
    assert "  attempt 0 failed (rank 1 on node2)" in text
    assert "  error (attempt 1, rank 0 on node1): the ranks on node2 are gone" in text, text


def test_lint_recognises_study_and_sweep_files(tmp_path, monkeypatch):
    """Issue 51, point 16: `hpcsuite lint STUDY.yaml` said "base: unknown key"."""
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("name: b\ntrain: {data: {samples: 256}}\n")
    (tmp_path / "study.yaml").write_text("name: s\nbase: base.yaml\naxes: {nodes: [1, 2]}\n")
    (tmp_path / "sweep.yaml").write_text("name: w\nbase: base.yaml\naxes: {train.lr: [0.1, 0.2]}\n")
    runner = CliRunner()
    for name, kind in (("study.yaml", "study"), ("sweep.yaml", "sweep")):
        result = runner.invoke(main, ["lint", name, "--no-slurm"])
        assert result.exit_code == 0, result.output
        assert f"{name}: {kind} file ok; linting its base spec base.yaml" in result.output
        assert "unknown key" not in result.output
    (tmp_path / "bad.yaml").write_text("name: s\nbase: base.yaml\naxes: {nodez: [1, 2]}\n")
    result = runner.invoke(main, ["lint", "bad.yaml", "--no-slurm"])
    assert result.exit_code == 2 and "axes.nodez" in result.output, result.output
