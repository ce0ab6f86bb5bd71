"""Dependencies (`after`, `submit --after`): parsing, resolution against the registry and a
faked Slurm, the --dependency header and its read-back. The chain through real Slurm is in
tests/test_e2e_after.py."""

from pathlib import Path

import pytest

from hpcsuite import runner
from hpcsuite.errors import UserError
from hpcsuite.runner import after
from hpcsuite.runs import jobs, registry
from hpcsuite.submit.plan import dependency

SBATCH = Path(__file__).resolve().parent.parent / "sbatch"
PROFILE = str(SBATCH / "profile.yaml")


def state(job_id, name):
    return jobs.JobState(job_id, name, "0:0", None, None, None)


@pytest.mark.parametrize("text, expected", [
    ("12", ("12", "ok")), ("12:any", ("12", "any")), ("train-a:notok", ("train-a", "notok")),
    ("train-a", ("train-a", "ok")), ("a.b:ok", ("a.b", "ok"))])
def test_split(text, expected):
    assert after.split(text) == expected


@pytest.mark.parametrize("name, condition, expected", [
    ("RUNNING", "ok", None), ("PENDING", "notok", None),
    ("COMPLETED", "ok", True), ("COMPLETED", "any", True), ("COMPLETED", "notok", False),
    ("FAILED", "ok", False), ("FAILED", "any", True), ("FAILED", "notok", True),
    ("TIMEOUT", "ok", False), ("CANCELLED", "notok", True)])
def test_satisfied(name, condition, expected):
    assert after.satisfied(state("1", name), condition) is expected


def test_dependency_groups_conditions_in_order():
    assert dependency(["12:ok", "13:ok", "14:any", "15:notok"]) == \
        "afterok:12:13,afterany:14,afternotok:15"
    with pytest.raises(UserError, match="not resolved to a job id"):
        dependency(["train-a:ok"])


def _registered(tmp_path, name, job_id):
    registry.record(tmp_path, {"job_id": job_id, "name": name,
                               "run_dir": str(tmp_path / "runs" / name / job_id)})


def test_resolve_names_from_the_registry_and_checks_slurm(tmp_path):
    _registered(tmp_path, "train", "40")
    _registered(tmp_path, "train", "41")          # the latest run of the name wins
    _registered(tmp_path, "prep", "30")
    states = {"41": state("41", "RUNNING"), "30": state("30", "COMPLETED"),
              "7": state("7", "PENDING")}
    pending, notes = after.job_ids_to_wait_for(["train", "prep:ok", "7:any"], tmp_path, query=states.__getitem__)
    assert pending == ["41:ok", "7:any"]
    assert notes == ["job 30 already completed (COMPLETED): nothing to wait for"]


def test_resolve_refuses_what_can_never_hold_or_is_unknown(tmp_path):
    _registered(tmp_path, "train", "41")
    failed = {"41": state("41", "FAILED")}
    with pytest.raises(UserError, match=r"spec.yaml: after: train: job 41 ended FAILED, so the "
                                        r"condition 'ok' \(it completed\) can never hold"):
        after.job_ids_to_wait_for(["train"], tmp_path, query=failed.__getitem__, source="spec.yaml: after")
    with pytest.raises(UserError, match="--after: nosuch: no run 'nosuch'"):
        after.job_ids_to_wait_for(["nosuch"], tmp_path, source="--after", query=failed.__getitem__)

    def unknown(job_id):
        raise UserError(f"job {job_id} is not known to Slurm (no record)")
    with pytest.raises(UserError, match="--after: 99: job 99 is not known to Slurm"):
        after.job_ids_to_wait_for(["99"], tmp_path, source="--after", query=unknown)


def test_resolve_without_slurm_only_maps_names(tmp_path):
    _registered(tmp_path, "train", "41")
    assert after.job_ids_to_wait_for(["train:any", "5"], tmp_path, ask_slurm=False) == (["41:any", "5:ok"], [])


def test_prepare_renders_the_dependency_and_records_the_resolved_after(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _registered(tmp_path, "train", "41")
    (tmp_path / "job.yaml").write_text("name: ev\nafter: [train, 7]\n")    # 7: a bare job id
    prepared = runner.prepare("job.yaml", PROFILE, after=("52:any",))
    assert "#SBATCH --dependency=afterok:41:7,afterany:52\n" in prepared.request.script
    assert prepared.request.job.after == ["41:ok", "7:ok", "52:any"]
    assert '"after": ["41:ok", "7:ok", "52:any"]' in prepared.request.script   # job.json: ids


@pytest.mark.parametrize("bad", ["a b", "12:maybe", ":ok", "x" * 70, "12;rm", "-1"])
def test_prepare_refuses_a_bad_after_naming_where(tmp_path, monkeypatch, bad):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("name: ev\n")
    with pytest.raises(UserError, match=r"^--after: .* is not valid: JOB, JOB:ok"):
        runner.prepare("job.yaml", PROFILE, after=(bad,))
    (tmp_path / "job.yaml").write_text(f"name: ev\nafter: [{bad!r}]\n")
    with pytest.raises(UserError) as e:
        runner.prepare("job.yaml", PROFILE)
    assert "after" in str(e.value) and "job.yaml" in str(e.value)


def test_the_header_read_back_holds_the_dependency(tmp_path, monkeypatch):
    """A template that drops or changes the dependency is refused, as any requested option."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("name: ev\nafter: ['41:any']\n")
    tdir = tmp_path / "templates"
    tdir.mkdir()
    (tdir / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}{% block sbatch %}'
        '#SBATCH --job-name={{ job.name }}\n#SBATCH --dependency=afterok:1\n'
        '#SBATCH --output={{ paths.log }}\n{% endblock %}')
    with pytest.raises(UserError, match="dependency"):
        runner.prepare("job.yaml", PROFILE, template_dir=str(tdir))
