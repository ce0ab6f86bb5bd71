"""The run registry, batched job queries and spaced-out waiting (Slurm faked at slurm.call)."""

import json
import multiprocessing

import pytest

from hpcsuite.runs import jobs, registry
from hpcsuite import slurm
from hpcsuite.errors import UserError


def _append(args):
    workdir, i = args
    registry.record(workdir, {"job_id": str(1000 + i), "name": f"job{i % 3}",
                              "run_dir": f"{workdir}/runs/job/{1000 + i}", "pad": "x" * 9000})


def test_fifty_concurrent_submits_leave_fifty_whole_records(tmp_path):
    # Records longer than a pipe buffer: only the lock keeps them whole.
    with multiprocessing.get_context("fork").Pool(10) as pool:
        pool.map(_append, [(str(tmp_path), i) for i in range(50)])
    runs = registry.load(tmp_path)
    assert sorted(int(r["job_id"]) for r in runs) == list(range(1000, 1050))
    assert all(len(r["pad"]) == 9000 and r["submitted_at"] for r in runs)


def test_find_by_job_id_name_and_run_dir(tmp_path):
    for i in range(3):
        run_dir = tmp_path / "runs" / "a" / str(10 + i)
        run_dir.mkdir(parents=True)
        registry.record(tmp_path, {"job_id": str(10 + i), "name": "a", "run_dir": str(run_dir)})
    assert registry.find(tmp_path, "11")["job_id"] == "11"
    assert registry.find(tmp_path, "a")["job_id"] == "12"          # a name: its latest run
    assert registry.find(tmp_path, str(tmp_path / "runs/a/10/"))["job_id"] == "10"
    assert registry.find(tmp_path, "b") is None
    assert registry.load(tmp_path / "elsewhere") == []


def test_damaged_registry_names_file_and_line(tmp_path):
    registry.record(tmp_path, {"job_id": "1", "name": "a", "run_dir": "/r/1"})
    with open(registry.path_in(tmp_path), "a") as f:
        f.write('{"job_id": "2", "na\n')
    with pytest.raises(UserError, match=r"runs.jsonl:2: not a run record"):
        registry.load(tmp_path)


def test_query_many_is_one_squeue_call_with_jobcomp_for_the_forgotten(monkeypatch, tmp_path):
    comp = tmp_path / "jobcomp.txt"
    comp.write_text("JobId=7 UserId=root(0) JobState=COMPLETED StartTime=2026-11-23T10:00:00 "
                    "EndTime=2026-11-23T11:02:03 WorkDir=/w ExitCode=0:0\n")
    calls = []

    def fake(argv, **kw):
        calls.append(argv)
        if argv[0] == "squeue":
            return slurm.Completed(argv, 0, "8|RUNNING|1:02|None\n9|PENDING|0:00|Priority\n", "")
        if argv[0] == "sacct":
            return slurm.Completed(argv, 1, "", "sacct: error: Slurm accounting storage is disabled")
        return slurm.Completed(argv, 0, f"JobCompLoc = {comp}\n", "")

    monkeypatch.setattr(slurm, "call", fake)
    states = jobs.query_many(["7", "8", "9", "10"])
    assert [c[0] for c in calls].count("squeue") == 1
    squeue = next(c for c in calls if c[0] == "squeue")
    assert "-j" in squeue and "7,8,9,10" in squeue
    assert states["8"].state == "RUNNING" and states["8"].elapsed == "1:02"
    assert states["9"].reason == "Priority"
    assert states["7"].state == "COMPLETED" and states["7"].elapsed == "01:02:03"
    assert "10" not in states


def test_wait_asks_slurm_rarely_and_at_once_when_results_appear(monkeypatch, tmp_path):
    """Slurm polls back off (1 s, 1.5 s, ... up to 15 s); the run directory is looked at every
    second and a results file appearing brings the next Slurm poll forward."""
    clock = {"t": 0.0}
    monkeypatch.setattr(jobs.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(jobs.time, "sleep", lambda s: clock.__setitem__("t", clock["t"] + s))
    asked = []

    def query(job_id):
        asked.append(clock["t"])
        if clock["t"] >= 62:
            (tmp_path / "results.json").write_text("{}")
        done = (tmp_path / "results.json").exists() and len(asked) > 1 and asked[-2] >= 62
        return jobs.JobState(job_id, "COMPLETED" if done else "RUNNING", "", None, None, None)

    monkeypatch.setattr(jobs, "query", query)
    ticks = []
    state = jobs.wait("5", run_dir=str(tmp_path), on_tick=lambda: ticks.append(clock["t"]))
    assert state.state == "COMPLETED"
    assert len(asked) < 15 and len(ticks) > 60          # ~1 s ticks, far fewer Slurm calls
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert max(gaps) <= 15.0 + 1e-9 and gaps[0] == pytest.approx(1.0)


def test_progress_line():
    from hpcsuite.runner.status import progress_line

    state = jobs.JobState("5", "RUNNING", "", None, None, "None", "0:42")
    line = progress_line(state, {"step": 120, "max_steps": 400, "epoch": 1,
                                 "samples_per_s": 3456.7, "loss": 0.43219, "attempt": 1})
    assert line == "RUNNING 0:42 step 120/400 epoch 1 3457 samples/s loss 0.4322 attempt 1"
    pending = jobs.JobState("5", "PENDING", "", None, None, "Resources", "0:00")
    assert progress_line(pending, None) == "PENDING 0:00 (Resources: waiting for nodes to free up)"


def test_pending_reasons_explained_and_the_hopeless_ones_end_the_wait(monkeypatch):
    from hpcsuite.runner.status import progress_line

    def pending(reason, restarts=None, start="2026-11-25T10:00:00"):
        return jobs.JobState("7", "PENDING", "", None, None, reason, "0:00", restarts,
                             start_time=start)

    why, never = jobs.explain_pending(pending("PartitionNodeLimit"))
    assert never and "more nodes than its partition" in why
    why, never = jobs.explain_pending(pending("BeginTime", restarts=1))
    # attempts count from 0 everywhere (SLURM_RESTART_COUNT): one requeue runs attempt 1
    assert not never and "requeued (attempt 1)" in why and "10:00:00" in why
    assert "requeue delay" in progress_line(pending("BeginTime", restarts=1), None)
    gone = pending("ReqNodeNotAvail, UnavailableNodes:node2")
    assert jobs.explain_pending(gone, 5.0)[1] is False             # a node may come back
    assert jobs.explain_pending(gone, jobs.NODES_GONE_SECONDS)[1] is True
    assert jobs.explain_pending(pending("ReqNodeNotAvail", restarts=1), 1e6)[1] is False
    assert jobs.explain_pending(jobs.JobState("7", "RUNNING", "", None, None, "None")) is None

    states = iter([pending("Priority"), pending("PartitionConfig")])
    monkeypatch.setattr(jobs, "query", lambda job_id: next(states))
    monkeypatch.setattr(jobs, "POLL_FIRST", 0.01)
    with pytest.raises(jobs.NeverStarts, match="job 7 can never start: PartitionConfig: .*"
                                               "hpcsuite cancel 7"):
        jobs.wait("7")


def test_progress_file_round_trip(tmp_path):
    from hpcsuite.runs.results import read_progress, write_progress

    assert read_progress(tmp_path) is None
    write_progress(tmp_path, {"step": 3})
    assert read_progress(tmp_path) == {"step": 3}
    (tmp_path / "progress.json").write_text('{"step": ')      # caught mid-write: no progress
    assert read_progress(tmp_path) is None
    assert json.loads(json.dumps(read_progress(tmp_path))) is None


def test_jobs_unknown_without_a_jobcomp_file_are_left_out(monkeypatch):
    def fake(argv, **kw):
        if argv[0] in ("squeue", "scontrol") and "config" not in argv:
            return slurm.Completed(argv, 1, "", "slurm_load_jobs error: Invalid job id")
        if argv[0] == "sacct":
            return slurm.Completed(argv, 1, "", "sacct: error: Slurm accounting storage is disabled")
        return slurm.Completed(argv, 0, "JobCompLoc = (null)\n", "")

    monkeypatch.setattr(slurm, "call", fake)
    assert jobs.query_many(["3"]) == {}
    with pytest.raises(UserError, match="job 3 is not known to Slurm"):
        jobs.query("3")


SACCT = """\
41|REQUEUED|0:0|00:00:31||/w
41.batch|CANCELLED|0:15|00:00:31|25808K|
41.0|CANCELLED|0:15|00:00:30|329952K|
41|COMPLETED|0:0|00:01:02||/w
41.batch|COMPLETED|0:0|00:01:02|26000K|
41.0|COMPLETED|0:0|00:01:01|1.5G|
42|CANCELLED by 0|0:0|00:00:05||/w
43|PENDING|0:0|00:00:00||/w
"""


def test_parse_sacct_latest_attempt_requeues_and_largest_rss():
    states = jobs.parse_sacct(SACCT, {"41", "42", "43"})
    a = states["41"]
    assert (a.state, a.exit_code, a.elapsed, a.restarts) == ("COMPLETED", "0:0", "00:01:02", 1)
    assert a.max_rss == "1.5G" and a.source == "sacct" and a.workdir == "/w"
    assert states["42"].state == "CANCELLED" and states["42"].restarts is None
    assert states["43"].state == "PENDING" and states["43"].max_rss is None
    assert set(jobs.parse_sacct(SACCT, {"42"})) == {"42"}
    assert jobs._bytes("25808K") == 25808 * 1024 and jobs._bytes("") is None
    assert jobs._bytes("0") == 0 and jobs._bytes("x") is None


def test_query_many_asks_sacct_first_and_squeue_only_for_the_rest(monkeypatch):
    calls = []

    def fake(argv, **kw):
        calls.append(argv)
        if argv[0] == "sacct":
            return slurm.Completed(argv, 0, SACCT, "")
        if argv[0] == "squeue":
            return slurm.Completed(argv, 0, "44|PENDING|0:00|Priority\n", "")
        raise AssertionError(argv)

    monkeypatch.setattr(slurm, "call", fake)
    states = jobs.query_many(["41", "44"])
    assert [c[0] for c in calls] == ["sacct", "squeue"]
    assert calls[1][calls[1].index("-j") + 1] == "44"        # squeue asked only for the rest
    assert states["41"].source == "sacct" and states["44"].source == "squeue"


def test_query_adds_accounting_to_a_finished_job_and_finds_a_forgotten_one(monkeypatch):
    def fake(argv, **kw):
        if argv[0] == "sacct":
            return slurm.Completed(argv, 0, SACCT, "")
        if argv[:2] == ["scontrol", "show"] and argv[-1] == "41":
            return slurm.Completed(argv, 0, "JobId=41 JobState=COMPLETED ExitCode=0:0 "
                                   "RunTime=00:01:02 Restarts=1 StdOut=/w/o", "")
        return slurm.Completed(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")

    monkeypatch.setattr(slurm, "call", fake)
    live = jobs.query("41")
    assert live.stdout == "/w/o" and live.max_rss == "1.5G" and live.source == "scontrol+sacct"
    forgotten = jobs.query("42")             # the controller purged it; accounting keeps it
    assert forgotten.state == "CANCELLED" and forgotten.source == "sacct"


def test_a_cluster_that_does_not_answer_is_one_error_naming_slurm_conf(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)

    def fake(argv, **kw):
        return slurm.Completed(argv, 1, "", "squeue: fatal: Could not establish a configuration source")

    monkeypatch.setattr(slurm, "call", fake)
    with pytest.raises(UserError, match=r"squeue failed .*SLURM_CONF is not set.*cluster env"):
        jobs.query_many(["3"])
