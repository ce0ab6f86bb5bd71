"""A communication-bound run is said without a preflight (issue 51, point 15): every rank waits
most of each step in the allreduce and none is slow; the line gives the share, the bus
bandwidth the allreduce's time implies and the site fabric's, and what finds the pair."""

import dataclasses
import json

import pytest

from hpcsuite.runs.comm_bound import busbw_GBps, line
from hpcsuite.runs.report import slow_rank_findings
from hpcsuite.runs.results import Results, summarize, write_json_atomic
from hpcsuite.runs.rundir import RunDir


def results(own, wait, slow=None, world=2):
    return Results(job="a", job_id="7", world_size=world, hosts=["node1", "node2"],
                   gradient_bytes=400_000, rank_balance={"own_s": own, "wait_s": wait,
                                                         "slow_rank": slow})


def test_the_implied_bus_bandwidth_is_nccl_tests():
    assert busbw_GBps(1_000_000_000, 2, 1.0) == pytest.approx(1.0)       # 2(n-1)/n = 1
    assert busbw_GBps(1_000_000_000, 8, 1.0) == pytest.approx(1.75)
    assert busbw_GBps(100, 1, 1.0) is None and busbw_GBps(100, 2, 0.0) is None


def test_a_run_waiting_in_the_allreduce_on_every_rank_is_said(tmp_path):
    """The researcher's run: node2 on 25 Mbit/s, 97 % of every step waiting, no slow rank."""
    r = results([0.003, 0.0031], [0.097, 0.0969])
    said = line(r)
    assert said.startswith("communication-bound: 97 % of every rank's step is spent waiting "
                           "in the gradients' allreduce, and no rank is slow"), said
    assert "0.4 MB per step implies a bus bandwidth of 0.00413 GB/s" in said, said
    assert "preflight.fabric" in said
    # against the site's fabric, from the profile the job was submitted under
    RunDir(tmp_path).profile.write_text(json.dumps({"fabric": "10gbe-tcp"}))
    assert "against the site fabric's 0.75 GB/s (0.0055x)" in line(r, tmp_path)


@pytest.mark.parametrize("own, wait, slow", [
    ([0.05, 0.05], [0.01, 0.01], None),                  # compute-bound: nothing said
    ([0.003, 0.09], [0.09, 0.003], {"rank": 1}),         # a slow rank: said as that instead
    ([0.003, None], [0.097, None], None),                # not measured on every rank
])
def test_nothing_is_said_of_a_run_that_is_not_communication_bound(own, wait, slow):
    assert line(results(own, wait, slow)) is None


def test_wait_status_and_report_say_it(tmp_path):
    r = results([0.003, 0.0031], [0.097, 0.0969])
    write_json_atomic(RunDir(tmp_path).results, dataclasses.asdict(r))
    assert "  communication-bound: 97 %" in summarize(tmp_path)
    assert slow_rank_findings(tmp_path)[0].startswith("communication-bound: ")
