"""CLI behaviour through Click's runner and fake Slurm calls: exit codes, messages, JSON."""

import json

import pytest
from click.testing import CliRunner

from hpcsuite import slurm
from hpcsuite.cli import main

from conftest import SBATCH, slurm_says_its_release

QUICK = str(SBATCH / "quickstart.yaml")
PROFILE = str(SBATCH / "profile.yaml")


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_render_prints_golden_script():
    result = invoke("render", QUICK, "--profile", PROFILE)
    assert result.exit_code == 0
    assert result.output == (SBATCH / "quickstart.sbatch").read_text()


def test_render_json():
    data = json.loads(invoke("render", QUICK, "--profile", PROFILE, "--json").output)
    assert data["sbatch_argv"] == ["sbatch", "--parsable"] and data["script"].startswith("#!/bin/bash")


def test_bad_spec_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrain: {epoch: 2}\n")
    result = invoke("render", str(bad))
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f'error: {bad}: train.epoch: unknown key (did you mean "epochs"?); valid keys: '
        "args, backend, batch_size, checkpoint, data, epochs, eval, grad_accumulation, horovod, "
        "ledger, loss, lr, max_steps, model, model_args, monitor, optimizer, precision, preemption, pythonpath, "
        "schedule, script, seed, startup_timeout_seconds, tracking"]


def test_bad_profile_exit_2(tmp_path):
    prof = tmp_path / "site.yaml"
    prof.write_text("pyton: python3\n")
    result = invoke("render", QUICK, "--profile", str(prof))
    assert result.exit_code == 2 and f"{prof}: pyton: unknown key" in result.output


def test_unknown_option_exit_2():
    assert invoke("render", QUICK, "--frobnicate").exit_code == 2


def test_dry_run_does_not_call_sbatch(monkeypatch):
    monkeypatch.setattr(slurm, "call", lambda *a, **k: pytest.fail("sbatch called"))
    result = invoke("submit", QUICK, "--profile", PROFILE, "--dry-run")
    assert result.exit_code == 0 and "# sbatch --parsable <script>" in result.output


PARTITIONS = ("PartitionName=debug AllowGroups=ALL Default=YES MaxNodes=UNLIMITED "
              "Nodes=node[1-2] TotalCPUs=8 TotalNodes=2\n")
NODES = "node1|4|(null)\nnode2|4|(null)\n"


def partition_answer(argv):
    """What scontrol/sinfo say of a 2-node partition `debug` (4 CPUs a node), and what the
    local cluster's Slurm 22.05 says of itself (submit applies its release's rules), or None."""
    if argv[0] == "scontrol" and argv[1:3] == ["show", "partition"]:
        return slurm.Completed(argv, 0, PARTITIONS, "")
    if slurm_says_its_release(argv):
        return slurm_says_its_release(argv)
    if argv[0] == "sinfo":
        return slurm.Completed(argv, 0, NODES, "")
    return None


def test_submit_records_run_directory(tmp_path, monkeypatch):
    calls = []

    def fake_call(argv, **kw):
        if partition_answer(argv):
            return partition_answer(argv)
        calls.append((argv, kw))
        return slurm.Completed(argv, 0, "4242\n", "")

    monkeypatch.setattr(slurm, "call", fake_call)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SBATCH_PARTITION", "sneaky")
    result = invoke("submit", QUICK, "--profile", PROFILE)
    assert result.exit_code == 0 and result.output.strip() == "4242"
    argv, kw = calls[0]
    assert argv[:2] == ["sbatch", "--parsable"]
    assert not any(k.startswith("SBATCH_") for k in kw["env"])
    run_dir = tmp_path / "runs" / "quickstart" / "4242"
    assert (run_dir / "job.sbatch").read_text() == (SBATCH / "quickstart.sbatch").read_text()
    assert json.loads((run_dir / "submit.json").read_text())["job_id"] == "4242"
    assert not list((tmp_path / "runs" / "quickstart").glob(".submit-*"))


def test_sbatch_failure_is_exit_2_and_leaves_nothing(tmp_path, monkeypatch):
    def fake_call(argv, **kw):
        from hpcsuite.errors import UserError
        if partition_answer(argv):
            return partition_answer(argv)
        raise UserError("sbatch failed (exit 1): sbatch: error: invalid partition specified: debug")

    monkeypatch.setattr(slurm, "call", fake_call)
    monkeypatch.chdir(tmp_path)
    result = invoke("submit", QUICK, "--profile", PROFILE)
    assert result.exit_code == 2 and "invalid partition" in result.output
    assert not list((tmp_path / "runs" / "quickstart").iterdir())


def test_status_bad_job_id():
    result = invoke("status", "12;rm")
    assert result.exit_code == 2 and "job id must be a number" in result.output


def test_status_parses_scontrol(monkeypatch):
    line = ("JobId=17 JobName=quickstart UserId=root(0) JobState=RUNNING Reason=None "
            "ExitCode=0:0 WorkDir=/tmp/w StdOut=/tmp/w/runs/quickstart/slurm-17.out")
    monkeypatch.setattr(slurm, "call", lambda argv, **k: slurm.Completed(argv, 0, line, ""))
    result = invoke("status", "17", "--json")
    data = json.loads(result.output)
    assert data["state"] == "RUNNING" and data["stdout"].endswith("slurm-17.out")


def test_help_explains_every_command():
    for cmd in ("render", "submit", "status", "logs", "cancel", "train", "cluster"):
        result = invoke(cmd, "--help")
        assert result.exit_code == 0 and "Usage:" in result.output


def test_completion_scripts_and_template_name_completion(tmp_path):
    import os
    import subprocess
    import sys

    script = invoke("completion", "bash").output
    assert "_HPCSUITE_COMPLETE" in script and "complete " in script
    env = dict(os.environ, _HPCSUITE_COMPLETE="bash_complete", COMP_WORDS="hpcsuite templates which ho",
               COMP_CWORD="3")
    out = subprocess.run([sys.executable, "-m", "hpcsuite"], env=env, capture_output=True, text=True)
    assert "plain,horovod" in out.stdout


def test_submit_refuses_what_the_partition_can_never_give(tmp_path, monkeypatch):
    sbatch = []

    def fake_call(argv, **kw):
        if partition_answer(argv):
            return partition_answer(argv)
        sbatch.append(argv)
        return slurm.Completed(argv, 0, "1\n", "")

    monkeypatch.setattr(slurm, "call", fake_call)
    monkeypatch.chdir(tmp_path)
    for setting, key in [("resources.nodes=3", "resources.nodes: 3 nodes, but partition 'debug' has 2"),
                         ("resources.tasks_per_node=5", "resources.tasks_per_node: 5 ranks x 1 CPUs"),
                         ("resources.gpus_per_node=1", "resources.gpus_per_node: 1 GPU per node")]:
        result = invoke("submit", QUICK, "--profile", PROFILE, "--set", setting)
        assert result.exit_code == 2, result.output
        assert f"error: {QUICK}: {key}" in result.output
        assert len([l for l in result.output.splitlines() if l.startswith("error:")]) == 1
    assert not sbatch                                        # nothing reached sbatch
    assert invoke("submit", QUICK, "--profile", PROFILE, "--dry-run",
                  "--set", "resources.nodes=3").exit_code == 0   # a dry run asks no Slurm


def test_a_closed_pipe_ends_quietly():
    """`hpcsuite ... | head`: the reader left; no `error: Broken pipe`, no traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "hpcsuite", "templates", "show", "horovod"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                         # before it writes a byte
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err
