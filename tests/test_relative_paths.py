"""Relative paths mean one thing wherever a command runs (issue 42, points 13 and 14): a
relative train.checkpoint.dir is the submit directory's, for the ranks and for `status` run
from anywhere; a study directory given relative (`study rerun studies/NAME`, as `study --help`
shows it) submits its points from its inputs/ without joining a path to it twice. sbatch is
faked at slurm.call (it checks the script it is given exists where it runs)."""

import json
from pathlib import Path

import pytest

from hpcsuite import runner, slurm
from hpcsuite.runs.attempts import checkpoint_root

JOB = """name: ck
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  model: mlp
  data: {kind: synthetic, samples: 256, shape: [8], classes: 4}
  batch_size: 16
  checkpoint: CHECKPOINT
"""


def job_json(script: str) -> dict:
    """The job.json the rendered script writes into the run directory."""
    text = script.split("<<'HPCSUITE_JOB_JSON'\n", 1)[1].split("\nHPCSUITE_JOB_JSON", 1)[0]
    return json.loads(text)


@pytest.mark.parametrize("checkpoint, kept", [
    ("{every_steps: 5, dir: ckpt}", "{work}/ckpt"),
    ("{every_steps: 5, dir: ../shared/ckpt}", "{work}/../shared/ckpt"),
    ("{every_steps: 0, dir: ckpt}", "{work}/ckpt"),               # resumes from it
    ("{every_steps: 0, resume: false, dir: ckpt}", "ckpt"),      # never used: as written
    ("{every_steps: 5, dir: /scratch/ckpt}", "/scratch/ckpt"),
    ("{every_steps: 5}", None),
])
def test_job_json_names_a_relative_checkpoint_dir_absolute(work, checkpoint, kept):
    (work / "job.yaml").write_text(JOB.replace("CHECKPOINT", checkpoint))
    request = runner.prepare("job.yaml").request
    want = kept.format(work=work) if kept else None
    assert request.job.train.checkpoint.dir == want
    assert job_json(request.script)["train"]["checkpoint"]["dir"] == want


def test_status_elsewhere_reads_the_checkpoint_dir_the_ranks_wrote(work, monkeypatch):
    """The ranks run in the submit directory; `status JOB` may run anywhere: both take the
    checkpoint directory from job.json and find the same one."""
    from hpcsuite.runtime.rank.job_io import load_job

    (work / "job.yaml").write_text(JOB.replace("CHECKPOINT", "{every_steps: 5, dir: ckpt}"))
    request = runner.prepare("job.yaml").request
    run_dir = work / "runs" / "ck" / "7"
    run_dir.mkdir(parents=True)
    (run_dir / "job.json").write_text(json.dumps(job_json(request.script)))
    job = load_job(str(run_dir / "job.json"))
    assert checkpoint_root(job, run_dir) == work / "ckpt"
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert checkpoint_root(job, run_dir) == work / "ckpt"


def test_a_relative_cwd_gives_an_absolute_work_directory(work):
    (work / "project").mkdir()
    (work / "project" / "job.yaml").write_text(JOB.replace("CHECKPOINT", "{every_steps: 5}"))
    request = runner.prepare("project/job.yaml", cwd=Path("project")).request
    assert request.workdir == str(work / "project")


STUDY = """name: tiny
base: job.yaml
axes: {nodes: [1]}
repeats: 1
warmup_steps: 1
steps: 3
limit: false
allreduce_bench: false
"""


@pytest.fixture
def sbatch(monkeypatch):
    """sbatch faked: it runs in ``cwd`` and must find the script there, as the real one does
    ("sbatch: error: Unable to open file ..."); job ids from 41."""
    ids = iter(range(41, 100))
    given = []

    def call(argv, **kw):
        if argv[0] != "sbatch" or "--version" in argv:   # the versions a study records
            done = slurm.Completed(argv, 127, "", f"{argv[0]}: not on this machine")
            if kw.get("check", True):
                raise slurm.failure(done)
            return done
        script = Path(kw["cwd"]) / argv[-1]
        assert script.is_file(), f"sbatch: error: Unable to open file {argv[-1]} (in {kw['cwd']})"
        given.append((argv, kw["cwd"]))
        return slurm.Completed(argv, 0, f"{next(ids)}\n", "")
    monkeypatch.setattr(slurm, "call", call)
    return given


def test_study_rerun_and_run_of_a_relative_study_directory_submit_from_its_inputs(work, sbatch):
    """`study rerun studies/NAME` and `study run studies/NAME` from the directory holding
    studies/: each point's script is found by sbatch, and its run directory is the study's."""
    from hpcsuite.runs.rundir import RunRoot
    from hpcsuite.study import points, run

    (work / "job.yaml").write_text(JOB.replace("CHECKPOINT", "{every_steps: 0}"))
    (work / "study.yaml").write_text(STUDY)
    made = points.create("study.yaml", None, None, ask_tools=False)
    assert made.path == work / "studies" / "tiny"
    said = []
    for sd in (points.StudyDir(Path("studies/tiny")),
               points.rerun(Path("studies/tiny"), None)):
        assert sd.path.is_absolute() and sd.path.parent == work / "studies"
        run.step(sd, None, said.append)
        (point,) = sd.points()
        entry = sd.state()[point.id]
        assert entry["status"] == "submitted"
        argv, cwd = sbatch[-1]
        assert cwd == str(sd.workdir)
        assert Path(argv[-1]).parent == sd.runs / point.job_name
        run_dir = sd.run_dir(point, entry["job_id"])
        assert (run_dir / "job.sbatch").is_file() and (run_dir / "submit.json").is_file()
        assert RunRoot(sd.runs / point.job_name).run(entry["job_id"]).path == run_dir
    assert [line.split(" as job ")[1] for line in said] == ["41", "42"]
