"""The rank's lifecycle without a cluster (issue 53, point 4): the watches start together, one
network watch a node, "training is over" stops the startup and network watches once, and the
managed loop and script mode say it when their last step ends. The job's nodes come from
Slurm's compressed host list. tests/test_e2e_script_stragglers.py runs a rank 0 working 60 s
after its last step through Slurm."""

import threading

import pytest

from hpcsuite import api
from hpcsuite.runs.rundir import RunDir
from hpcsuite.runtime.observe import lifecycle
from hpcsuite.runtime.rank import startup
from hpcsuite.runtime.script import script_job
from hpcsuite.submit.spec import spec_from_dict
from hpcsuite.world import World, expand_hostlist, from_env


@pytest.mark.parametrize("text,names", [
    ("node1", ["node1"]),
    ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
    ("gpu[08-11],cpu5", ["gpu08", "gpu09", "gpu10", "gpu11", "cpu5"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("", []), ("node[3-1]", []), ("node[1-", []), ("node[a]", []), ("n[[1]]", []),
])
def test_slurms_host_list_is_expanded_in_its_order(text, names):
    assert expand_hostlist(text) == names


def test_the_world_knows_the_jobs_nodes():
    assert from_env({"SLURM_JOB_NODELIST": "node[1-4]"}, "h").nodes == \
        ("node1", "node2", "node3", "node4")
    assert from_env({}, "h").nodes == ()


class Started:
    """What the lifecycle started, in place of the real watches."""

    def __init__(self, monkeypatch):
        self.net, self.fail = [], []
        monkeypatch.setattr(lifecycle.failwatch, "watch",
                            lambda run_dir, rank, attempt: self.fail.append(rank))
        monkeypatch.setattr(lifecycle.netwatch, "watch", self.netwatch)

    def netwatch(self, run_dir, rank, attempt, node, fail, stop, nodes=()):
        self.net.append((rank, node, tuple(nodes)))
        RunDir(run_dir).startup(attempt).mkdir(parents=True, exist_ok=True)   # its record's
        self.stop = stop
        return threading.current_thread()


def test_one_network_watch_a_node_and_a_failure_watch_a_rank(tmp_path, monkeypatch):
    started = Started(monkeypatch)
    nodes = ("node1", "node2")
    for rank in range(4):
        lifecycle.Lifecycle(tmp_path, World(rank=rank, size=4, local_rank=rank % 2, local_size=2,
                                            node=nodes[rank // 2], nodes=nodes),
                            0, False, lambda text, code: None).start()
    assert started.fail == [0, 1, 2, 3]
    assert started.net == [(0, "node1", nodes), (2, "node2", nodes)]


def test_training_over_stops_the_watches_once(tmp_path, monkeypatch, caplog):
    import logging

    started = Started(monkeypatch)
    life = lifecycle.Lifecycle(tmp_path, World(rank=0, size=2, node="node1",
                                               nodes=("node1", "node2")),
                               60, False, lambda text, code: None).start()
    assert isinstance(life.startup, startup.StartupWatch) and not started.stop.is_set()
    with caplog.at_level(logging.INFO, logger="hpcsuite.runtime.observe.lifecycle"):
        life.over()
        life.over()
        life.stop()
    assert started.stop.is_set() and life.startup.done.is_set()
    done = RunDir(tmp_path).attempt_file(0, "net", "node1").with_suffix(".done")
    assert done.exists()            # the neighbours skip this node from now on
    assert [r.getMessage() for r in caplog.records] == [
        "training is over: the startup and network watches stop"]


def test_a_rank_with_no_startup_bound_has_the_null_watch(tmp_path, monkeypatch):
    Started(monkeypatch)
    life = lifecycle.Lifecycle(tmp_path, World(local_rank=1), 0, False, lambda t, c: None).start()
    assert life.startup is startup.OFF and not life.network
    life.mark(startup.IN_INIT)
    with life.paused():
        pass
    life.over()
    startup.OFF.over()                  # the default watch hears it too, and does nothing


class Ends:
    def __init__(self):
        self.calls = 0

    def over(self):
        self.calls += 1

    def mark(self, stage):
        pass

    def follow(self, has_stepped):
        pass


def script_run(tmp_path, watch, **train):
    job = spec_from_dict({"name": "s", "train": {"script": "train.py", "batch_size": 4,
                                                 "epochs": 1, **train}}, "t")
    run_dir = tmp_path / "runs" / "s" / "1"
    run_dir.mkdir(parents=True, exist_ok=True)
    with script_job.handed(watch):
        return api.Run(None, job=job, run_dir=run_dir)


def test_a_scripts_training_is_over_when_its_batches_end(tmp_path):
    ends = Ends()
    run = script_run(tmp_path, ends)
    for _ in run.batches(12):
        assert ends.calls == 0           # every step is watched
        run.log(loss=1.0)
    assert ends.calls == 1
    run.finish()


def test_a_script_that_breaks_out_is_over_at_finish(tmp_path):
    ends = Ends()
    run = script_run(tmp_path, ends)
    for _ in run.batches(12):
        run.log(loss=1.0)
        break
    assert ends.calls == 0
    run.finish()
    assert ends.calls == 1


def test_the_managed_loop_says_training_is_over_before_its_final_save(tmp_path, monkeypatch):
    """Before the final checkpoint, evaluation and report: the loop fires over() right after
    its last step (the order is read from the loop, where the save follows it)."""
    import inspect

    from hpcsuite.runtime.session.loop import Trainer

    source = inspect.getsource(Trainer.run)
    over, save = source.index("self.session.watch.over()"), source.index('self.save(p, "final")')
    loop_end = source.index("while p.cursor.epoch < self.epochs")
    assert loop_end < over < save < source.index("return self.report(")
