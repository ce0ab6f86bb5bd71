"""The training session both modes share, on several ranks simulated by threads in one process:
restore (rank 0 picks, every rank learns), the asynchronous stop/save vote, the save policy and
the results record. No framework, no MPI."""

import threading

import numpy as np
import pytest

from hpcsuite.errors import UserError
from hpcsuite.runs.results import Results
from hpcsuite.runs.rundir import RunDir
from hpcsuite.runtime.session.session import Session
from hpcsuite.runtime.input.sharding import Cursor
from hpcsuite.runtime.rank.signals import StopFlag
from hpcsuite.submit.spec import spec_from_dict


class World:
    """Object collectives for ``size`` threads: each call waits for every rank's part."""

    def __init__(self, size):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=20)
        self.slots = [None] * size
        self.votes = 0

    def exchange(self, rank, obj):
        self.barrier.wait()
        self.slots[rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class Ranks:
    """One rank's Collectives; the vote is started now and read later, like a Horovod handle."""

    def __init__(self, world, rank):
        self.world, self.rank, self.size = world, rank, world.size

    def broadcast_object(self, obj):
        return self.world.exchange(self.rank, obj)[0]

    def allgather_object(self, obj):
        return self.world.exchange(self.rank, obj)

    def allreduce_sums(self, values):
        return [sum(col) for col in zip(*self.world.exchange(self.rank, list(values)))]

    def vote_start(self, values):
        if self.rank == 0:
            self.world.votes += 1
        return [max(col) for col in zip(*self.world.exchange(self.rank, list(values)))]

    def vote_result(self, handle):
        return handle


def on_ranks(size, body):
    """``body(rank, ranks)`` on ``size`` threads; their results by rank (a failure re-raised)."""
    world = World(size)
    out, errors = [None] * size, []

    def go(rank):
        try:
            out[rank] = body(rank, Ranks(world, rank))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            world.barrier.abort()

    threads = [threading.Thread(target=go, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return out


def job(tmp_path, **train):
    return spec_from_dict({"name": "s", "output_dir": str(tmp_path / "runs"), "train": {
        "script": "train.py", "batch_size": 4, "checkpoint": {"every_steps": 3}, **train}}, "t")


def session(tmp_path, ranks, flag=None, **train):
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return Session(job(tmp_path, **train), run_dir, ranks, flag or StopFlag())


def test_restore_rank_0_picks_and_every_rank_continues_from_it(tmp_path):
    def first(rank, ranks):
        s = session(tmp_path, ranks)
        s.progress.step, s.progress.cursor = 6, Cursor(1, 8)
        return s.save("interval", lambda: ({"model": {"w": np.full(2, 6.0)}}, {"extra": {}}))

    paths = on_ranks(3, first)
    assert paths[1:] == [None, None] and paths[0].endswith("step-00000006")
    accepted = []

    def second(rank, ranks):
        s = session(tmp_path, ranks)
        loaded = s.restore(lambda loaded: accepted.append(rank))
        return (loaded is not None, s.progress.step, s.progress.start_step, s.progress.cursor,
                s.progress.resumed_from, s.policy.start_step)

    got = on_ranks(3, second)
    assert accepted == [0]                        # only rank 0 reads and checks the checkpoint
    assert [g[0] for g in got] == [True, False, False]
    assert {g[1:] for g in got} == {(6, 6, Cursor(1, 8), paths[0], 6)}


def test_a_refused_checkpoint_stops_every_rank_with_rank_0s_reason(tmp_path):
    on_ranks(1, lambda rank, ranks: session(tmp_path, ranks).save(
        "interval", lambda: ({"model": {"w": np.zeros(1)}}, {})))

    def refuse(loaded):
        raise UserError("not this model")

    def body(rank, ranks):
        with pytest.raises(UserError, match="not this model"):
            session(tmp_path, ranks).restore(refuse)
        return True

    assert on_ranks(3, body) == [True, True, True]


def test_nothing_to_restore_leaves_progress_at_zero(tmp_path):
    got = on_ranks(2, lambda rank, ranks: (session(tmp_path, ranks).restore(lambda _: None),))
    assert got == [(None,), (None,)]


def test_one_ranks_signal_stops_every_rank_at_the_same_step(tmp_path):
    """The vote is posted after a step and read after the next, as the managed loop does: rank
    2's flag, raised at step 4, stops all four ranks at step 5, saving with the stop."""
    def body(rank, ranks):
        flag = StopFlag()
        s = session(tmp_path, ranks, flag, checkpoint={"every_steps": 100})
        for step in range(1, 50):
            s.progress.step = step
            s.metrics.step_times.append(0.1)
            if rank == 2 and step == 4:
                flag.raise_("USR1")
            if s.vote_handle is not None and step > s.vote_tick:
                result = s.read_vote()
                if result.stop:
                    assert s.policy.save_due(step, result.stop or result.save)
                    unsaved = s.status()       # stopped, and nothing saved at this step yet
                    s.save(s.stop_reason, lambda: ({"model": {"w": np.zeros(2)}}, {}))
                    return step, s.noticed_step, s.status(), unsaved
            if s.vote_due(step):
                s.post_vote(step, s.metrics.step_times, 0, 1e-9, loss_sum=float(rank))  # every step
        return None

    got = on_ranks(4, body)
    assert [g[0] for g in got] == [5, 5, 5, 5]
    assert [g[1] for g in got] == [None, None, 4, None]
    assert {g[2] for g in got} == {"preempted"}
    assert {g[3] for g in got} == {"stopped"}     # never called a save before one is made


def test_the_vote_agrees_on_the_smallest_interval_and_sums_the_loss(tmp_path):
    def body(rank, ranks):
        s = session(tmp_path, ranks)
        s.post_vote(1, [0.25 / (rank + 1)] * 5, 0, 0.25, loss_sum=1.5 * rank)
        result = s.read_vote()
        return result.interval, result.loss_sum, s.policy.next_poll, s.stopped

    got = on_ranks(3, body)
    assert got == [(1, 4.5, 2, False)] * 3        # rank 0's 1-step proposal wins


def test_every_minutes_is_agreed_by_the_vote_and_resets_at_a_save(tmp_path):
    def body(rank, ranks):
        s = session(tmp_path, ranks, checkpoint={"every_steps": 0, "every_minutes": 1})
        s.policy.last_save -= 61 if rank == 1 else 0    # only rank 1's clock says it is time
        s.post_vote(1, [0.1], 0, 0.25)
        agreed = s.read_vote().save
        s.progress.step = 1
        s.save("interval", lambda: ({"model": {"w": np.zeros(1)}}, {}))
        return agreed, s.policy.save_due(1, agreed), s.policy.time_to_save(s.policy.last_save + 1)

    assert on_ranks(2, body) == [(True, True, False)] * 2


def test_save_writes_the_shared_manifest_and_the_modes_fields(tmp_path):
    def body(rank, ranks):
        s = session(tmp_path, ranks)
        s.progress.step, s.progress.cursor = 3, Cursor(0, 12)
        s.save("final", lambda: ({"model": {"w": np.ones(2)}}, {"script": "train.py"}))
        return s.metrics.checkpoints, s.saved_step

    got = on_ranks(2, body)
    assert got[1] == ([], 3) and [c["step"] for c in got[0][0]] == [3]
    loaded = session(tmp_path, Ranks(World(1), 0)).store.latest()
    m = loaded.manifest
    assert (m["step"], m["epoch"], m["cursor"], m["world_size"], m["reason"], m["script"]) == \
        (3, 0, Cursor(0, 12).to_json(), 2, "final", "train.py")
    assert loaded.tensors["model"]["w"].tolist() == [1.0, 1.0]


def test_results_combine_every_ranks_note(tmp_path):
    def body(rank, ranks):
        s = session(tmp_path, ranks)
        s.progress.step = 4
        s.metrics.samples = 10 * (rank + 1)
        s.metrics.step_times[:] = [0.5] * 4
        s.metrics.real[:] = [8] * 4
        gathered = s.gather(s.note(2.0 + rank, f"sum{rank}", extra=rank))
        return s.results(gathered, s.status(), mode="script", loss=[1.0]) if rank == 0 else None

    r = on_ranks(2, body)[0]
    assert isinstance(r, Results)
    assert (r.status, r.stop, r.world_size, r.steps, r.final_step, r.samples) == \
        ("completed", {}, 2, 4, 4, 30)
    assert r.elapsed_s == 3.0 and r.samples_per_s == 10.0 and r.samples_per_s_per_rank == [10 / 3, 20 / 3]
    assert r.param_checksums == ["sum0", "sum1"] and r.mode == "script" and r.loss == [1.0]
    assert r.samples_per_s_steady == 16.0


def test_a_stopped_runs_results_say_how_it_stopped(tmp_path):
    def body(rank, ranks):
        flag = StopFlag()
        if rank == 1:
            flag.raise_("USR1")
        s = session(tmp_path, ranks, flag)
        s.progress.step = 7
        s.post_vote(7, [0.1], 0, 0.25)
        s.read_vote()
        s.progress.step = 9
        gathered = s.gather(s.note(1.0, None))
        return s.results(gathered, s.status()) if rank == 0 else s.status()

    r, other = on_ranks(2, body)
    # Stopped at step 9 with nothing saved there (no checkpoint keys): never a "preempted" save.
    assert r.status == "stopped" and other == "stopped"
    assert (r.stop["reason"], r.stop["signal"], r.stop["steps_after_notice"]) == ("preempted", "USR1", 2)
    assert r.stop["seconds_after_signal"] is not None and r.param_checksums == []
    assert (r.stop["saved"], r.stop["checkpoint_step"]) == (False, None)


def test_the_end_of_run_gather_reaches_rank_0_only_through_each_ranks_file(tmp_path):
    """Issue 53, point 3: rank 0 gets every rank's note, series and all; the others get
    nothing back, and no rank is handed another's series: each rank's note is its own file."""
    import json

    def body(rank, ranks):
        s = session(tmp_path, ranks)
        sent = []
        ranks.allgather_object = lambda obj: sent.append(obj)     # not used for the notes
        got = s.gather(s.note(1.0, None, loss_sums=[float(rank)] * 500, scale=np.float32(0.5)))
        return got, sent

    got = on_ranks(3, body)
    assert [g for g, _ in got[1:]] == [None, None] and all(sent == [] for _, sent in got)
    assert [note["loss_sums"][:2] for note in got[0][0]] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    assert got[0][0][2]["scale"] == 0.5
    notes = sorted(RunDir(tmp_path / "run").startup(0).glob("note-*.json"))
    assert [p.name for p in notes] == ["note-0.json", "note-1.json", "note-2.json"]
    assert json.loads(notes[1].read_text())["loss_sums"] == [1.0] * 500


def test_a_restore_on_another_number_of_ranks_says_what_a_step_now_means(tmp_path, caplog):
    """Saved by 3 ranks of 4 x 2 (global batch 24), resumed by 2 (16): rank 0 records and
    logs the change, with what train.max_steps now trains; the same world records none."""
    def first(rank, ranks):
        s = session(tmp_path, ranks, grad_accumulation=2, max_steps=10)
        s.progress.step, s.progress.cursor = 6, Cursor(0, 144)
        return s.save("interval", lambda: ({"model": {"w": np.zeros(2)}}, {}))

    on_ranks(3, first)

    def resumed(size):
        def body(rank, ranks):
            s = session(tmp_path, ranks, grad_accumulation=2, max_steps=10)
            s.restore(lambda loaded: None)
            gathered = s.gather(s.note(1.0, None))      # rank 0's; None on the others
            return s.world_change, s.results(gathered, s.status()) if rank == 0 else None
        return on_ranks(size, body)

    with caplog.at_level("WARNING", logger="hpcsuite.runtime.session.session"):
        got = resumed(2)
    change, results = got[0]
    assert change == {"from_ranks": 3, "to_ranks": 2, "step": 6, "global_batch_before": 24,
                      "global_batch_after": 16, "max_steps": 10}
    assert got[1][0] is None and results.world_change == change
    said = [r.getMessage() for r in caplog.records]
    assert said == ["resumed from 3 to 2 ranks at step 6: global batch 24 -> 16 samples per "
                    "step; train.max_steps 10 counts steps, so the 4 steps left train 64 "
                    "samples, not 96"]
    assert resumed(3)[0][0] is None


def test_a_session_opens_no_chart_itself_its_maker_hands_them_over(tmp_path):
    """Making a Session starts no thread and writes no chart, whatever the spec asks: the mode
    that makes it opens rank 0's charts (RankCharts.open, where the MLflow thread starts)."""
    from hpcsuite.runtime.session.session import RankCharts

    asked = {"monitor": {"tensorboard": True}, "tracking": {"mlflow": {"uri": "file:./mlruns"}}}
    threads = set(threading.enumerate())

    def body(rank, ranks):
        s = session(tmp_path, ranks, **asked)
        return s.tracker, s.chart

    assert on_ranks(2, body) == [(None, None)] * 2
    assert set(threading.enumerate()) <= threads
    assert RankCharts.open(job(tmp_path, **asked), tmp_path / "run", rank=1) == RankCharts()
