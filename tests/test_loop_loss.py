"""The managed loop on 2 and 4 ranks simulated by threads (no framework, no MPI): every loss a
user reads, rank 0's log line included, is the step's global mean, the number results.json
records for that step (issue T, point 5). tests/test_e2e_train.py checks it through Slurm."""

import logging
import re

import pytest
from test_session import on_ranks

from hpcsuite.runtime.session.loop import Trainer
from hpcsuite.runtime.rank.signals import StopFlag
from hpcsuite.submit.spec import spec_from_dict

LINE = re.compile(r"step (\d+), epoch (\d+), loss ([0-9.]+)")


class Backend:
    """Collectives from test_session's threads; a "model" whose loss per sample is the rank's
    number plus one, so rank 0's share differs from the global mean on more than one rank."""
    name = "torch"

    def __init__(self, ranks):
        self.ranks, self.rank, self.size, self.local_rank = ranks, ranks.rank, ranks.size, 0

    def __getattr__(self, name):      # the collectives: broadcast, allgather, the vote
        return getattr(self.__dict__["ranks"], name)

    def build(self, data): pass
    def feed(self, data, batches): return ((b, None) for b in batches)
    def micro_step(self, inputs, scale, last, padded): return (self.rank + 1.0) * self._real
    def set_lr(self, lr): pass
    def losses_to_floats(self, losses): return [float(v) for v in losses]
    def broadcast_state(self): pass
    def checksum(self): return "c"
    def gradient_sizes(self): return [1]
    def precision_seen(self): return {}
    def versions(self): return {}


def train(tmp_path, size, caplog):
    job = spec_from_dict({"name": "l", "output_dir": str(tmp_path / "runs"), "train": {
        "batch_size": 4, "max_steps": 12, "data": {"samples": 64, "shape": [2]}}}, "t")

    def rank(r, ranks):
        b = Backend(ranks)
        feed = b.feed
        b.feed = lambda data, batches: ((x, b.__dict__.__setitem__("_real", x.real) or i)
                                        for x, i in feed(data, batches))
        return Trainer(job, tmp_path / "run", b, StopFlag()).run()[1]

    (tmp_path / "run").mkdir()
    with caplog.at_level(logging.INFO, logger="hpcsuite.runtime.session.loop"):
        results = on_ranks(size, rank)[0]
    return results, [LINE.search(r.getMessage()) for r in caplog.records
                     if LINE.search(r.getMessage())]


@pytest.mark.parametrize("size", [2, 4])
def test_rank_0s_log_line_shows_the_global_mean_loss(tmp_path, caplog, size):
    results, lines = train(tmp_path, size, caplog)
    mean = sum(range(1, size + 1)) / size          # ranks 1..size, equal shares
    assert results.loss == pytest.approx([mean] * 12)
    assert lines, "rank 0 logged no step line"
    for line in lines:
        step, loss = int(line.group(1)), float(line.group(3))
        assert loss == pytest.approx(results.loss[step - 1], abs=5e-5), line.group(0)


class Hvd:
    """A Horovod module's object collectives over test_session's threads (script mode)."""

    def __init__(self, ranks):
        self.ranks = ranks

    def rank(self): return self.ranks.rank
    def size(self): return self.ranks.size
    def broadcast_object(self, obj, root_rank=0, name=None): return self.ranks.broadcast_object(obj)
    def allgather_object(self, obj, name=None): return self.ranks.allgather_object(obj)
    def allreduce(self, values, op=None, name=None): return self.ranks.allreduce_sums(values)
    Sum = "sum"


@pytest.mark.parametrize("size", [2, 4])
def test_script_modes_log_line_progress_and_results_show_the_global_mean(tmp_path, caplog, size):
    import json

    from hpcsuite import api

    job = spec_from_dict({"name": "s", "train": {"script": "train.py", "batch_size": 4,
                                                 "epochs": 1}},
                         "t")
    (tmp_path / "run").mkdir()

    def rank(r, ranks):
        run = api.Run(Hvd(ranks), job=job, run_dir=tmp_path / "run")
        run.session.flag = StopFlag()
        for batch in run.batches(48):
            run.log(loss=r + 1.0, accuracy=0.5)     # this rank's mean over its samples
            run.should_stop()
        run.finish()

    with caplog.at_level(logging.INFO, logger="hpcsuite.api"):
        on_ranks(size, rank)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    mean = sum(range(1, size + 1)) / size
    steps = 48 // (4 * size)
    assert results["loss"] == pytest.approx([mean] * steps)
    assert results["metrics"]["loss"] == pytest.approx([mean] * steps)
    assert progress["loss"] == pytest.approx(mean)
    lines = [LINE.search(r.getMessage()) for r in caplog.records if LINE.search(r.getMessage())]
    assert lines and all(float(x.group(3)) == pytest.approx(mean, abs=5e-4) for x in lines)


def test_script_modes_global_loss_is_one_allreduce_of_each_ranks_own_series():
    """Issue 53, point 3: each step's loss over every rank's real samples, from the ranks'
    sums (one allreduce); no rank reads another's series. Ranks that logged different numbers
    of losses: rank 0's own series, as before."""
    from test_session import on_ranks

    from hpcsuite.runtime.script.collectives import HorovodObjects
    from hpcsuite.runtime.script.script_run import global_loss

    series = {0: [1.0, 2.0], 1: [3.0, 5.0]}
    real = {0: [3, 1], 1: [1, 1]}

    def body(rank, ranks):
        sent = []
        ranks.allgather_object = lambda obj: sent.append(obj)
        got = global_loss(HorovodObjects(Hvd(ranks)), series[rank], real[rank])
        return got, sent

    got = on_ranks(2, body)
    assert got[0][0] == pytest.approx([(1 * 3 + 3 * 1) / 4, (2 * 1 + 5 * 1) / 2])
    assert got[0][0] == got[1][0] and got[0][1] == got[1][1] == []
    unequal = {0: [1.0, 2.0, 4.0], 1: [3.0]}
    got = on_ranks(2, lambda rank, ranks: global_loss(HorovodObjects(Hvd(ranks)),
                                                     unequal[rank], []))
    assert got[0] == [1.0, 2.0, 4.0]
    weightless = on_ranks(2, lambda rank, ranks: global_loss(HorovodObjects(Hvd(ranks)),
                                                             series[rank], [0, 0]))
    assert weightless[0] == pytest.approx([2.0, 3.5])      # no real samples: the plain mean
