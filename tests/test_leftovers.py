"""An earlier attempt's steps still on a node (issue 51, point 14): the probe's output read,
the wait, and a requeued attempt that finds them recorded as a leftover, never a failure."""

import json

import pytest

from hpcsuite.runs import attempts, leftovers

# `scontrol listpids JOB NODE` under the probe's own line, as Slurm 22.05 prints it
NODE1 = """node node1 3
step 3
step 4294967291
step 4294967292
PID      JOBID    STEPID   LOCALID GLOBALID
4101     79       3        0       0
4090     79       batch    -       -
4088     79       extern   -       -
"""
NODE2_OLD = """node node2 3
PID      JOBID    STEPID   LOCALID GLOBALID
5120     79       0        0       1
5133     79       0        -       -
5201     79       3        0       1
"""


def labelled(task: int, text: str) -> str:
    return "".join(f"{task}: {line}\n" for line in text.splitlines())


def interleaved(a: str, b: str) -> str:
    """Two tasks' lines as srun --label may print them: one of each in turn."""
    la, lb = a.splitlines(keepends=True), b.splitlines(keepends=True)
    return "".join(x + y for x, y in zip(la, lb)) + "".join(la[len(lb):] + lb[len(la):])


def test_the_probe_names_an_earlier_steps_processes_and_nothing_else():
    seen = leftovers.parse(interleaved(labelled(0, NODE1), labelled(1, NODE2_OLD)))
    assert seen.answered == {"node1", "node2"}
    assert seen.leftovers == {"node2": {"0"}}
    clean = leftovers.parse(labelled(0, NODE1) +
                            labelled(1, "node node2 3\nPID JOBID STEPID LOCALID GLOBALID\n"))
    assert clean.answered == {"node1", "node2"} and clean.leftovers == {}
    # a step daemon whose tasks are gone, still waiting on the old srun: a leftover too
    waiting = leftovers.parse(labelled(1, "node node2 3\nstep 0\nstep 3\n") + labelled(0, NODE1))
    assert waiting.leftovers == {"node2": {"0"}}
    assert leftovers.parse("srun: error: something\n").answered == set()
    assert leftovers.parse(NODE1).answered == set()     # unlabelled: not the probe's


def test_the_wait_ends_once_every_node_answers_without_leftovers(monkeypatch):
    monkeypatch.setattr(leftovers, "POLL_S", 0)
    old = leftovers.parse(labelled(0, NODE1) + labelled(1, NODE2_OLD))
    answers = iter([None, old, leftovers.parse(labelled(0, NODE1))])
    said = []
    # node2 killed the probe, then still ran step 0, then did not answer: never clear
    assert leftovers.wait_until_gone("79", 2, said.append, wait_s=0.5,
                                     run_probe=lambda j, n, settle=0: next(answers, None)) is not None
    clean = leftovers.parse(labelled(0, NODE1) + labelled(1, "node node2 4\n"))
    # node2 still runs step 0; then none; then the step that waits is killed (Slurm's kill of
    # the old attempt takes it); then none, and a step that lived SETTLE_S came back clean
    answers = iter([(0, old), (0, clean), (leftovers.SETTLE_S, None), (0, clean),
                    (leftovers.SETTLE_S, clean)])
    asked = []

    def run(j, n, settle=0):
        want, seen = next(answers)
        asked.append(settle)
        assert settle == want
        return seen

    said = []
    assert leftovers.wait_until_gone("79", 2, said.append, wait_s=30, run_probe=run) is None
    assert "node2 still runs step 79.0" in said[0] and "gone from every node" in said[-1]
    assert asked == [0, 0, leftovers.SETTLE_S, 0, leftovers.SETTLE_S]
    # a clean first probe launches at once: no step that waits
    asked.clear()
    answers = iter([(0, clean)])
    assert leftovers.wait_until_gone("79", 2, said.append, wait_s=30, run_probe=run) is None
    assert asked == [0]


class _Job:
    class train:
        class preemption:
            max_failures = 1

        class checkpoint:
            enabled = False


@pytest.fixture
def in_slurm(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_JOB_ID", "79")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    monkeypatch.setattr(leftovers, "WAIT_S", 0)
    monkeypatch.setattr(leftovers, "POLL_S", 0)
    requeued = []
    monkeypatch.setattr(attempts, "_requeue", lambda job_id, out: requeued.append(job_id) or True)
    monkeypatch.setattr(leftovers.signal, "signal", lambda *a: None)
    (tmp_path / "attempts.jsonl").write_text(json.dumps(
        {"attempt": 0, "outcome": "failed", "exit": 1, "requeued": True}) + "\n")
    return tmp_path, requeued


def test_a_requeued_attempt_that_finds_leftovers_is_requeued_and_no_failure(in_slurm,
                                                                          monkeypatch):
    run_dir, requeued = in_slurm
    monkeypatch.setattr(leftovers, "probe", lambda j, n, settle=0:
                        leftovers.parse(labelled(0, NODE1) + labelled(1, NODE2_OLD)))
    said = []
    assert attempts.begin(run_dir, _Job, out=said.append) == 1
    (first, second) = attempts.read_records(run_dir)
    assert second["outcome"] == "leftover" and second["requeued"] is True
    assert "node2 still runs step 79.0" in second["why"]
    assert requeued == ["79"]
    assert attempts.counts([first, second]).failed == 1       # the budget of 1 is not spent
    assert any("not counted against train.preemption.max_failures" in s for s in said)


def test_a_clean_allocation_launches_and_a_save_is_never_probed(in_slurm, monkeypatch):
    run_dir, requeued = in_slurm
    asked = []
    monkeypatch.setattr(leftovers, "wait_until_gone",
                        lambda *a, **k: asked.append(a) or None)
    assert attempts.begin(run_dir, _Job, out=lambda s: None) == 0
    assert len(asked) == 1 and not requeued
    (run_dir / "attempts.jsonl").write_text(json.dumps(
        {"attempt": 0, "outcome": "preempted", "exit": 0, "requeued": True}) + "\n")
    assert attempts.begin(run_dir, _Job, out=lambda s: None) == 0
    assert len(asked) == 1                 # after a save: not asked


def test_leftovers_in_a_row_stop_the_job(in_slurm, monkeypatch):
    run_dir, requeued = in_slurm
    monkeypatch.setenv("SLURM_RESTART_COUNT", "4")
    lines = [{"attempt": 0, "outcome": "failed"}] + \
        [{"attempt": k, "outcome": "leftover"} for k in (1, 2, 3)]
    (run_dir / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    monkeypatch.setattr(leftovers, "wait_until_gone", lambda *a, **k: "node2 still runs step 79.0")
    said = []
    assert attempts.begin(run_dir, _Job, out=said.append) == 1
    assert attempts.read_records(run_dir)[-1]["outcome"] == "not_started" and not requeued
    assert "after 3 attempts" in said[-1]
