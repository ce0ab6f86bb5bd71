"""The startup watch (hpcsuite.runtime.rank.startup): where a rank is when no step came within
train.startup_timeout_seconds, the message that names every rank's stage, the clock (paused
while a checkpoint is restored, stopped by the first step), and the spec key. The end-to-end
test on the local Slurm cluster is in test_e2e_user.py."""

import importlib.util
import json
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from hpcsuite import api
from hpcsuite.errors import ConfigError
from hpcsuite.runs.rundir import RunDir
from hpcsuite.runtime.rank import startup
from hpcsuite.runtime.session.session import Session
from hpcsuite.runtime.rank.startup import BEFORE_INIT, BEFORE_STEP, IN_INIT, StartupWatch, rank_list, stall_line
from hpcsuite.submit.spec import spec_from_dict

from test_locks import layers  # noqa: F401 (a fixture)
from test_session import on_ranks


def word(rank, stage, at=None):
    return {"rank": rank, "stage": stage, "at": at, "host": "n1"}


# ---------------------------------------------------------------------- the message
def test_ranks_in_one_stage_are_named_once():
    words = {r: word(r, IN_INIT) for r in range(4)}
    assert stall_line(words, 4, 600) == ("ranks stopped inside Horovod's init: no step within "
                                       "600 s after they started (train.startup_timeout_seconds)")


def test_ranks_in_different_stages_are_named_by_stage_in_order():
    words = {0: word(0, BEFORE_STEP), 1: word(1, BEFORE_INIT, "net.py:7 in build"),
             2: word(2, BEFORE_STEP), 3: word(3, IN_INIT)}
    assert stall_line(words, 4, 20) == (
        "ranks stopped before Horovod's init (rank 1), inside Horovod's init (rank 3), before "
        "the first step (ranks 0, 2): no step within 20 s after they started "
        "(train.startup_timeout_seconds); in net.py:7 in build (rank 1)")


def test_a_rank_that_never_answered_is_named():
    words = {0: word(0, IN_INIT), 1: word(1, IN_INIT)}
    text = stall_line(words, 4, 30)
    assert text.startswith("ranks stopped inside Horovod's init (ranks 0-1), not heard from "
                           "(ranks 2-3: never started, or stuck where they could not answer)")


def test_one_rank_and_the_users_frame():
    text = stall_line({0: word(0, BEFORE_STEP, "model.py:3 in build")}, 1, 45.5)
    assert text == ("the rank stopped before the first step: no step within 45.5 s after it "
                    "started (train.startup_timeout_seconds); in model.py:3 in build")


@pytest.mark.parametrize("ranks, text", [([3], "rank 3"), ([0, 1, 2, 3], "ranks 0-3"),
                                         ([5, 0, 2, 6, 7], "ranks 0, 2, 5-7"), ([1, 2], "ranks 1-2")])
def test_rank_lists(ranks, text):
    assert rank_list(ranks) == text


# ---------------------------------------------------------------------- the watch
class Stalls:
    """What a watch reports, in place of ending the process."""

    def __init__(self):
        self.texts, self.event = [], threading.Event()

    def __call__(self, text):
        self.texts.append(text)
        self.event.set()


def make(tmp_path, seconds, rank=0, size=1, script=False, grace=0.1):
    stalls = Stalls()
    return StartupWatch(seconds, tmp_path, rank, size, 0, stalls, script=script, grace=grace), stalls


def test_a_rank_that_trains_no_step_is_reported_with_its_stage_and_frame(tmp_path):
    watch, stalls = make(tmp_path, 0.3)
    watch.mark(BEFORE_STEP)
    watch.start()
    assert not stalls.event.wait(0.15)            # not before its time
    stalls.event.wait(5)                          # this thread sleeps here: the user's frame
    assert stalls.texts and stalls.texts[0].startswith(
        "the rank stopped before the first step: no step within 0.3 s after it started")
    assert "test_startup.py:" in stalls.texts[0] and "in test_a_rank_that_trains_no_step" in \
        stalls.texts[0]
    recorded = json.loads(RunDir(tmp_path).startup_word(0, 0).read_text())
    assert recorded["stage"] == BEFORE_STEP and recorded["rank"] == 0


def test_a_rank_that_steps_ends_its_watch(tmp_path):
    watch, stalls = make(tmp_path, 0.3)
    stepped = []
    watch.follow(lambda: bool(stepped))
    watch.start()
    stepped.append(1)
    time.sleep(1.5)
    assert not stalls.texts and not RunDir(tmp_path).startup(0).exists()


def test_restoring_a_checkpoint_does_not_count(tmp_path):
    now = [100.0]
    watch = StartupWatch(10, tmp_path, 0, 1, 0, Stalls(), clock=lambda: now[0])
    now[0] += 4
    with watch.paused():
        now[0] += 50                              # a large checkpoint, read for 50 s
        assert watch.elapsed() == 4
    now[0] += 3
    assert watch.elapsed() == 7


def test_a_hang_inside_horovods_init_is_named(tmp_path):
    """The main thread waits inside a function named init in a horovod/ directory, as it does
    in Horovod's basics.py while MPI starts (script mode: the script calls hvd.init itself)."""
    basics = tmp_path / "horovod" / "common" / "basics.py"
    basics.parent.mkdir(parents=True)
    basics.write_text("import time\n\ndef init(seconds):\n    time.sleep(seconds)\n")
    spec = importlib.util.spec_from_file_location("fake_basics", basics)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    watch, stalls = make(tmp_path / "run", 0.3, script=True)
    watch.start()
    module.init(1.5)
    assert stalls.event.wait(5)
    assert stalls.texts[0].startswith("the rank stopped inside Horovod's init: no step within")


def test_a_script_that_trains_without_the_api_is_left_alone(tmp_path, monkeypatch):
    """Horovod is initialised and no hpcsuite session exists: the script's steps cannot be
    seen, so the watch ends instead of failing a healthy job."""
    fake = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "horovod.torch", fake)
    watch, stalls = make(tmp_path, 0.2, script=True)
    watch.start()
    time.sleep(1.5)
    assert not stalls.texts
    monkeypatch.setitem(sys.modules, "horovod.torch", types.SimpleNamespace(is_initialized=lambda: False))
    watch, stalls = make(tmp_path, 0.2, script=True)
    watch.start()
    assert stalls.event.wait(5) and "before Horovod's init" in stalls.texts[0]


def test_the_first_rank_to_report_names_the_others(tmp_path):
    """Each rank writes its word, waits the grace for the others, and reports all of them."""
    other = RunDir(tmp_path).startup_word(0, 1)
    other.parent.mkdir(parents=True)
    other.write_text(json.dumps(word(1, IN_INIT)))
    watch, stalls = make(tmp_path, 0.2, rank=0, size=3, grace=0.3)
    watch.mark(BEFORE_STEP)
    watch.start()
    assert stalls.event.wait(5)
    assert stalls.texts[0].startswith(
        "ranks stopped inside Horovod's init (rank 1), before the first step (rank 0), not "
        "heard from (rank 2: ")


def test_the_other_ranks_leave_the_report_to_rank_0_and_read_no_word(tmp_path, monkeypatch):
    """Issue 53, point 3: one rank reads the words. Rank 1, out of time, writes its word and
    waits for rank 0's report (the FAILED marker); it reads no other rank's word and reports
    nothing itself."""
    watch, stalls = make(tmp_path, 0.2, rank=1, size=3, grace=0.3)
    reads = []
    monkeypatch.setattr(watch, "words", lambda: reads.append(1) or {})
    watch.mark(BEFORE_STEP)
    watch.start()
    word_path = RunDir(tmp_path).startup_word(0, 1)
    deadline = time.monotonic() + 5
    while not word_path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    RunDir(tmp_path).failed(0).write_text("rank 0\nexit 1\nranks stopped ...\n")
    time.sleep(1.5)                             # past 3 graces: it would have reported by now
    assert json.loads(word_path.read_text())["rank"] == 1
    assert stalls.texts == [] and reads == []


def test_a_rank_reports_itself_when_rank_0_does_not(tmp_path):
    """Rank 0 never started (or is stuck where its threads cannot run): after three graces
    without its report, rank 1 reads the words and names the ranks."""
    watch, stalls = make(tmp_path, 0.2, rank=1, size=2, grace=0.2)
    watch.mark(BEFORE_STEP)
    watch.start()
    assert stalls.event.wait(5)
    assert stalls.texts[0].startswith("ranks stopped before the first step (rank 1), not heard "
                                      "from (rank 0: ")


def test_the_null_watch_hears_nothing_and_is_the_default_everywhere():
    import inspect

    from hpcsuite.runtime.frameworks.backend import HorovodBackend
    from hpcsuite.runtime.script import script_job

    startup.OFF.mark(IN_INIT)
    startup.OFF.follow(lambda: True)
    startup.OFF.stop()
    with startup.OFF.paused():
        pass
    for made in (Session, HorovodBackend):
        assert inspect.signature(made).parameters["watch"].default is startup.OFF
    assert script_job.Handover.watch is startup.OFF


def test_script_mode_is_handed_the_watch_only_while_the_script_runs():
    from hpcsuite.runtime.script import script_job

    mine = object()
    with script_job.handed(mine):
        assert script_job.Handover.watch is mine
    assert script_job.Handover.watch is startup.OFF
    with pytest.raises(RuntimeError):
        with script_job.handed(mine):
            raise RuntimeError("the script failed")
    assert script_job.Handover.watch is startup.OFF


# ---------------------------------------------------------------------- the session's steps
def test_a_session_tells_the_watch_when_it_has_stepped(tmp_path, monkeypatch):
    job = spec_from_dict({"name": "s"}, "t")
    followed = []
    watch = types.SimpleNamespace(follow=followed.append)

    def body(rank, ranks):
        s = Session(job, tmp_path, ranks, watch=watch)
        before = s.has_stepped()
        s.progress.step += 1                      # a script was handed its first step's batches
        handed = s.has_stepped()
        s.metrics.step_times.append(0.1)          # a step ended (the managed loop, run.log)
        return before, handed, s.has_stepped()

    assert on_ranks(2, body) == [(False, False, True)] * 2
    assert len(followed) == 2


# ---------------------------------------------------------------------- the key
def test_the_key_defaults_to_ten_minutes_and_zero_turns_it_off():
    assert spec_from_dict({"name": "s"}, "t").train.startup_timeout_seconds == 600
    off = spec_from_dict({"name": "s", "train": {"startup_timeout_seconds": 0}}, "t")
    assert off.train.startup_timeout_seconds == 0
    with pytest.raises(ConfigError, match="train.startup_timeout_seconds"):
        spec_from_dict({"name": "s", "train": {"startup_timeout_seconds": -1}}, "job.yaml")


def test_a_site_sets_the_bound_and_may_lock_it(layers):
    """Like any job key: a site default reaches the job, and a locked one cannot be changed."""
    from test_locks import SITE

    from hpcsuite.errors import UserError
    from hpcsuite.submit.config import resolve

    layers["site"].write_text(SITE.replace("defaults: {resources: {partition: batch}}",
                                           "defaults: {resources: {partition: batch}, "
                                           "train: {startup_timeout_seconds: 1200}}"))
    assert resolve(str(layers["spec"])).job.train.startup_timeout_seconds == 1200
    assert resolve(str(layers["spec"]), sets=["train.startup_timeout_seconds=0"]).job.train \
        .startup_timeout_seconds == 0
    layers["site"].write_text(SITE.replace("defaults: {resources: {partition: batch}}",
                                           "defaults: {resources: {partition: batch}, "
                                           "train: {startup_timeout_seconds: 1200}}")
                              .replace("locked: [resources.partition]",
                                       "locked: [resources.partition, train.startup_timeout_seconds]"))
    with pytest.raises(UserError, match="train.startup_timeout_seconds"):
        resolve(str(layers["spec"]), sets=["train.startup_timeout_seconds=0"])


def test_a_scripts_other_ranks_read_the_checkpoint_with_the_clock_paused(tmp_path, monkeypatch):
    """Script mode: rank 0 picks the checkpoint (paused in the session's restore), then every
    other rank reads it itself, paused too."""
    from contextlib import contextmanager

    import numpy as np

    from test_api import make_run

    first = make_run(tmp_path)
    next(iter(first.batches(10)))
    path = first.save({"w": np.ones(2, np.float32)})
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    picked = {"step": manifest["step"], "cursor": manifest["cursor"], "path": path}

    class RankOne:                        # rank 1 of 2: rank 0's pick comes by broadcast
        rank, size = staticmethod(lambda: 1), staticmethod(lambda: 2)

        def broadcast_object(self, obj, root_rank=0, name=None):
            return picked

        def allgather_object(self, obj, name=None):   # the ranks' hosts, for the slow-rank rule
            return [obj, obj]

    pauses = []

    class Recording:
        def follow(self, has_stepped):
            pass

        @contextmanager
        def paused(self):
            pauses.append("pause")
            yield
            pauses.append("resume")

    from hpcsuite.runtime.script.script_job import handed

    with handed(Recording()):         # as `hpcsuite train` hands it to the script's Run
        run = api.Run(RankOne(), job=first.job, run_dir=first.run_dir)
    restored = run.restore()
    assert restored.step == manifest["step"] and restored.state["state"]["w"].tolist() == [1, 1]
    assert pauses == ["pause", "resume"] * 2
