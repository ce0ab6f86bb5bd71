"""GPU requests without a GPU: how a job's GPUs are asked of Slurm (per node as the site asks,
or per task with a task count), the srun binding, the lint refusals for combinations Slurm
versions or launchers treat differently, the header read-back, and which device each local
rank keeps. End to end on a cluster with gres GPUs: tests/test_e2e_gpu.py."""

from pathlib import Path

import pytest

from hpcsuite import runner
from hpcsuite.errors import UserError
from hpcsuite.runtime.rank import placement
from hpcsuite.submit.plan import gpu_options
from hpcsuite.submit.spec import spec_from_dict

PROFILE = str(Path(__file__).resolve().parent.parent / "sbatch" / "profile.yaml")


def job(**resources):
    launcher = resources.pop("launcher", "srun")
    return spec_from_dict({"name": "g", "launcher": launcher,
                           "resources": {"nodes": 2, "tasks_per_node": 2, **resources}}, "t.yaml")


@pytest.mark.parametrize("resources, request_, expected", [
    ({}, "gpus-per-node", []),
    ({"gpus_per_node": 2}, "gpus-per-node", [("gpus-per-node", "2")]),
    ({"gpus_per_node": 2}, "gres", [("gres", "gpu:2")]),
    ({"gpus_per_task": 1}, "gpus-per-node", [("ntasks", "4"), ("gpus-per-task", "1")]),
])
def test_gpu_options(resources, request_, expected):
    assert gpu_options(job(**resources), request_) == expected


@pytest.mark.parametrize("visible, local, per_rank, mine", [
    (["0", "1"], 0, 1, ["0"]), (["0", "1"], 1, 1, ["1"]), (["0", "1", "2", "3"], 1, 2, ["2", "3"]),
    (["3"], 1, 1, ["3"]),                 # Slurm already gave this rank only its own
    (["0", "1"], 3, 1, ["1"]),            # more ranks than GPUs: they wrap (gpu_sharing only)
])
def test_choose(visible, local, per_rank, mine):
    assert placement.choose(visible, local, per_rank) == mine


def test_place_narrows_the_environment_only_for_a_gpu_job():
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert placement.place(job(), 1, env) is None and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    line = placement.place(job(gpus_per_node=2), 1, env)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and "its own of the node's 0,1" in line
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    assert "as Slurm gave it" in placement.place(job(gpus_per_task=1), 1, env)
    assert "no GPU visible" in placement.place(job(gpus_per_node=2), 0, {})
    assert "no GPU visible" in placement.place(job(gpus_per_node=2), 0,
                                               {"CUDA_VISIBLE_DEVICES": "NoDevFiles"})


def prepared(tmp_path, monkeypatch, spec, profile=PROFILE):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(spec)
    return runner.prepare("job.yaml", profile)


@pytest.mark.parametrize("spec, key, words", [
    ("launcher: mpirun\nresources: {partition: gpu, tasks_per_node: 2, gpus_per_task: 1}",
     "resources.gpus_per_task", "with launcher mpirun"),
    ("launcher: srun\nresources: {partition: gpu, gpus_per_task: 1, gpus_per_node: 1}",
     "resources.gpus_per_task", "not both"),
    ("launcher: srun\nresources: {partition: gpu, gpus_per_task: 1, binding: {gpu_bind: closest}}",
     "resources.binding.gpu_bind", "per_task"),
    ("launcher: mpirun\nresources: {partition: gpu, gpus_per_node: 1, binding: {gpu_bind: closest}}",
     "resources.binding.gpu_bind", "srun option"),
    ("launcher: srun\nresources: {partition: gpu, tasks_per_node: 4, gpus_per_task: 2}",
     "resources.gpus_per_task", "8 GPUs per node, but partition 'gpu' has 4"),
])
def test_lint_refuses_gpu_combinations_naming_the_key(tmp_path, monkeypatch, spec, key, words):
    with pytest.raises(runner.LintFailed) as e:
        prepared(tmp_path, monkeypatch, f"name: g\n{spec}\n")
    assert any(f.key == key and words in f.message for f in e.value.errors), e.value.errors


def test_a_gres_site_refuses_gpus_per_task(tmp_path, monkeypatch):
    profile = tmp_path / "site.yaml"
    profile.write_text(Path(PROFILE).read_text() + "gpu_request: gres\n")
    with pytest.raises(runner.LintFailed, match="gpu_request: gres"):
        prepared(tmp_path, monkeypatch, "name: g\nlauncher: srun\nresources: {partition: gpu, "
                 "gpus_per_task: 1}\n", str(profile))


def test_srun_renders_gpu_options_and_binding(tmp_path, monkeypatch):
    script = prepared(tmp_path, monkeypatch, "name: g\nlauncher: srun\nresources: {partition: gpu,"
                      " tasks_per_node: 4, gpus_per_task: 1}\n").request.script
    assert "#SBATCH --ntasks=4\n#SBATCH --gpus-per-task=1\n" in script
    script = prepared(tmp_path, monkeypatch, "name: g\nlauncher: srun\nresources: {partition: gpu,"
                      " tasks_per_node: 4, gpus_per_node: 4, binding: {gpu_bind: 'single:1'}}\n"
                      ).request.script
    assert "#SBATCH --gpus-per-node=4\n" in script and " --gpu-bind=single:1 " in script
    bad = "name: g\nresources: {gpus_per_node: 1, binding: {gpu_bind: 'single:0;id'}}\n"
    with pytest.raises(UserError, match=r"job.yaml: resources.binding.gpu_bind: .* is not valid"):
        prepared(tmp_path, monkeypatch, bad)


def test_a_template_that_drops_the_gpu_request_is_refused(tmp_path, monkeypatch):
    tdir = tmp_path / "templates"
    tdir.mkdir()
    (tdir / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}{% block sbatch %}'
        '#SBATCH --job-name={{ job.name }}\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n'
        '{% for option, value in sbatch_options if option != "gpus-per-node" %}'
        '#SBATCH --{{ option }}={{ value }}\n{% endfor %}'
        '#SBATCH --output={{ paths.log }}\n{% endblock %}')
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("name: g\nresources: {nodes: 2, tasks_per_node: 4, "
                                       "partition: gpu, gpus_per_node: 4}\n")
    with pytest.raises(UserError, match="gpus-per-node"):
        runner.prepare("job.yaml", PROFILE, template_dir=str(tdir))


def test_more_ranks_than_gpus_per_node_is_refused_naming_the_keys_unless_sharing_is_meant(
        tmp_path, monkeypatch):
    spec = ("name: s\nresources: {partition: gpu, tasks_per_node: 2, gpus_per_node: 1%s}\n")
    with pytest.raises(runner.LintFailed) as e:
        prepared(tmp_path, monkeypatch, spec % "")
    text = str(e.value)
    assert "resources.tasks_per_node" in text and "resources.gpus_per_node" in text
    assert "resources.gpu_sharing" in text and text.count("\n") <= 1
    shared = prepared(tmp_path, monkeypatch, spec % ", gpu_sharing: true")
    assert [w.key for w in shared.warnings] == []
    quiet = prepared(tmp_path, monkeypatch, "name: s\nresources: {partition: gpu, "
                     "tasks_per_node: 2, gpus_per_node: 2, gpu_sharing: true}\n")
    assert [w.key for w in quiet.warnings] == ["resources.gpu_sharing"]


def test_no_two_ranks_share_a_device_unless_the_spec_says_so():
    # Two ranks, one GPU: the job.json was not refused at submit (written by hand, an old one).
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    with pytest.raises(UserError, match="resources.gpu_sharing"):
        placement.place(job(gpus_per_node=1), 1, env)
    # Slurm made fewer GPUs visible than the node's ranks need.
    with pytest.raises(UserError, match="local rank 2 would share a GPU"):
        placement.place(job(gpus_per_node=2, tasks_per_node=3), 2, {"CUDA_VISIBLE_DEVICES": "0,1"})
    for local in (0, 1):
        env = {"CUDA_VISIBLE_DEVICES": "0"}
        line = placement.place(job(gpus_per_node=1, gpu_sharing=True), local, env)
        assert env["CUDA_VISIBLE_DEVICES"] == "0" and "shared with other ranks" in line
