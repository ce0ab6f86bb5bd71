"""`hpcsuite lint` and the checks render and submit run."""

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.submit.values import walltime_seconds
from hpcsuite.submit.lint import lint
from hpcsuite.submit.site_profile import Partition, SiteProfile
from hpcsuite.submit.spec import spec_from_dict

from conftest import SBATCH

PROFILE = SiteProfile(partitions={"cpu": Partition(cpus_per_node=4, max_time="01:00:00"),
                                  "gpu": Partition(cpus_per_node=32, gpus_per_node=4)})


def findings(**resources):
    job = spec_from_dict({"name": "x", "resources": resources}, "t")
    return {(f.level, f.key): f.message for f in lint(job, PROFILE)}


def test_clean_job_has_no_findings():
    assert findings(partition="cpu", tasks_per_node=2, cpus_per_task=2) == {}


def test_unknown_partition_is_an_error_with_close_match():
    msg = findings(partition="cpus")[("error", "resources.partition")]
    assert 'unknown partition \'cpus\' (did you mean "cpu"?)' in msg


def test_more_cpus_than_the_partition_has():
    msg = findings(partition="cpu", tasks_per_node=3, cpus_per_task=2)[("error", "resources.tasks_per_node")]
    assert "3 ranks x 2 CPUs = 6 CPUs per node, but partition 'cpu' has 4" in msg


def test_gpu_rank_mismatch_is_a_warning():
    f = findings(partition="gpu", gpus_per_node=4, tasks_per_node=2)
    assert ("warning", "resources.tasks_per_node") in f


def test_too_many_gpus_and_too_long():
    f = findings(partition="cpu", gpus_per_node=1, time="02:00:00")
    assert ("error", "resources.gpus_per_node") in f and ("error", "resources.time") in f


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("10:00", 600), ("01:00:00", 3600),
                                           ("1-00", 86400), ("2-01:30:00", 178200)])
def test_walltime_formats(text, seconds):
    assert walltime_seconds(text) == seconds


def test_render_stops_on_lint_error_and_prints_warnings(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\nresources: {partition: cpu, tasks_per_node: 128}\n")
    profile = str(SBATCH / "profile.yaml")
    result = CliRunner().invoke(main, ["render", str(spec), "--profile", profile])
    assert result.exit_code == 2
    assert "resources.tasks_per_node: 128 ranks x 1 CPUs = 128 CPUs per node" in result.output
    spec.write_text("name: x\nresources: {partition: gpu, gpus_per_node: 4, tasks_per_node: 2}\n")
    result = CliRunner().invoke(main, ["render", str(spec), "--profile", profile])
    assert result.exit_code == 0 and f"warning: {spec}: resources.tasks_per_node" in result.output


def test_lint_command(tmp_path):
    profile = str(SBATCH / "profile.yaml")
    ok = CliRunner().invoke(main, ["lint", str(SBATCH / "quickstart.yaml"), "--profile", profile])
    assert ok.exit_code == 0 and ok.output.strip().endswith("quickstart.yaml: ok")
    bad = CliRunner().invoke(main, ["lint", str(SBATCH / "quickstart.yaml"), "--profile", profile,
                                    "--set", "resources.partition=nope"])
    assert bad.exit_code == 2 and "unknown partition 'nope'" in bad.output


def train_findings(train, time="00:30:00"):
    job = spec_from_dict({"name": "x", "resources": {"time": time}, "train": train}, "t")
    return {(f.level, f.key): f.message for f in lint(job, SiteProfile())}


def test_checkpoints_with_the_time_limit_watch_turned_off_warn():
    f = train_findings({"checkpoint": {"every_steps": 10}, "preemption": {"lead_seconds": 0}})
    assert "loses everything since its last checkpoint" in f[("warning", "train.preemption.lead_seconds")]
    assert not train_findings({"checkpoint": {"every_steps": 10}})     # the default: a signal at 30 s
    assert not train_findings({"checkpoint": {"every_steps": 10}, "preemption": {"lead_seconds": 60}})


def test_walltime_shorter_than_one_checkpoint_interval():
    f = train_findings({"checkpoint": {"every_minutes": 45}, "preemption": {"lead_seconds": 60}})
    assert "shorter than one checkpoint interval" in f[("warning", "train.checkpoint.every_minutes")]


def test_requeue_needs_checkpoints_and_lead_must_fit():
    assert ("error", "train.preemption.requeue") in train_findings({"preemption": {"requeue": True}})
    f = train_findings({"checkpoint": {"every_steps": 5},
                        "preemption": {"lead_seconds": 600}}, time="00:05:00")
    assert ("error", "train.preemption.lead_seconds") in f


def test_what_a_partition_can_never_give_is_named_by_key():
    from hpcsuite import slurm
    from hpcsuite.submit.lint import cluster_findings
    from hpcsuite.submit.spec import spec_from_dict

    assert slurm.parse_sinfo_shapes("a|64|gpu:a100:4(S:0-1)\nb|32|gpu:2,tmpfs:1\nc|16|(null)\n"
                                    "junk\n") == [(64, 4), (32, 2), (16, 0)]
    recs = slurm.parse_partitions("PartitionName=gpu Default=NO MaxNodes=2 Nodes=a,b\n"
                                  "PartitionName=cpu Default=YES MaxNodes=UNLIMITED Nodes=c\n")
    assert recs["gpu"]["MaxNodes"] == "2" and recs["cpu"]["Default"] == "YES"
    part = slurm.Partition("gpu", False, 2, ((64, 4), (32, 2), (16, 0)))

    def keys(**resources):
        job = spec_from_dict({"name": "x", "resources": {"partition": "gpu", **resources}}, "x.yaml")
        return [(f.key, f.message) for f in cluster_findings(job, part)]

    assert keys(nodes=2, gpus_per_node=2, tasks_per_node=2) == []
    assert keys(nodes=3)[0][0] == "resources.nodes" and "MaxNodes" in keys(nodes=3)[0][1]
    assert keys(nodes=2, gpus_per_node=4, tasks_per_node=4) == [
        ("resources.nodes", "2 nodes, but partition 'gpu' has 1 node with 4 CPUs and 4 GPUs")]
    assert keys(gpus_per_node=8, tasks_per_node=8)[0][0] == "resources.gpus_per_node"
    assert keys(tasks_per_node=1, cpus_per_task=65)[0][0] == "resources.cpus_per_task"
    job = spec_from_dict({"name": "x", "resources": {"partition": "gpux"}}, "x.yaml")
    (f,) = cluster_findings(job, None, ["cpu", "gpu"])
    assert f.key == "resources.partition" and 'did you mean "gpu"' in f.message


def test_model_args_need_a_user_builder(tmp_path):
    from hpcsuite.submit.lint import lint
    from hpcsuite.submit.site_profile import SiteProfile
    from hpcsuite.submit.spec import spec_from_dict

    job = spec_from_dict({"name": "m", "train": {"model": "mlp", "model_args": {"h": 1}}}, "t")
    assert [(f.key, f.level) for f in lint(job, SiteProfile(), tmp_path)
            if f.key == "train.model_args"] == [("train.model_args", "error")]


def _lint_in(tmp_path, text, monkeypatch):
    """`hpcsuite lint job.yaml` in ``tmp_path`` with ``text`` as the spec."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(text)
    return CliRunner().invoke(main, ["lint", "job.yaml", "--no-slurm"])


def test_a_model_beside_a_script_is_refused_naming_both(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print('hi')\n")
    result = _lint_in(tmp_path, "name: s\ntrain: {script: train.py, model: resnet}\n", monkeypatch)
    assert result.exit_code == 2, result.output
    assert "error: job.yaml: train.model: 'resnet' is ignored in script mode: train.script " \
           "'train.py' builds its own model" in result.output
    # The built-in default is not a key the user set: a script alone is clean.
    alone = _lint_in(tmp_path, "name: s\ntrain: {script: train.py}\n", monkeypatch)
    assert alone.exit_code == 0 and "train.model" not in alone.output, alone.output


def test_a_key_written_one_level_too_high_says_where_it_goes(tmp_path, monkeypatch):
    result = _lint_in(tmp_path, "name: s\ntracking: {mlflow: {}}\n", monkeypatch)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "job.yaml: tracking: unknown key (it goes under train: train.tracking); valid keys:" \
        in result.output
    nested = _lint_in(tmp_path, "name: s\ntrain: {every_steps: 5}\n", monkeypatch)
    assert "train.every_steps: unknown key (it goes under checkpoint: " \
           "train.checkpoint.every_steps)" in nested.output
    # A plain misspelling keeps its close match.
    typo = _lint_in(tmp_path, "name: s\ntrian: {}\n", monkeypatch)
    assert 'trian: unknown key (did you mean "train"?)' in typo.output


def test_a_script_name_in_the_wrong_case_gets_a_did_you_mean(tmp_path, monkeypatch):
    (tmp_path / "Train.py").write_text("print('hi')\n")
    result = _lint_in(tmp_path, "name: s\ntrain: {script: train.py}\n", monkeypatch)
    assert result.exit_code == 2
    assert 'train.script: train.py: no such file (in ' in result.output
    assert '(did you mean "Train.py"?)' in result.output


def test_a_warning_signal_with_nothing_to_save_warns():
    f = train_findings({"preemption": {"signal": "USR1", "lead_seconds": 60}})
    assert "nothing to save" in f[("warning", "train.preemption.lead_seconds")]
    assert "training is lost" in f[("warning", "train.preemption.lead_seconds")]
    f = train_findings({"script": "train.py", "preemption": {"lead_seconds": 60}})
    assert "run.save()" in f[("warning", "train.preemption.lead_seconds")]
    assert not train_findings({"preemption": {"signal": "USR1"}})   # no signal asked: no warning
