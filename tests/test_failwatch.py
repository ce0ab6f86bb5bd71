"""A rank ends as soon as another rank of its attempt reported a failure (runtime/observe/failwatch.py):
the marker's rank, the status it names, a marker not yet written in full."""

import threading
import time

from hpcsuite.runs.rundir import RunDir, failure_text
from hpcsuite.runtime.observe import failwatch
def test_another_ranks_marker_ends_this_rank_with_its_status(tmp_path):
    marker = RunDir(tmp_path).failed(0)
    assert failwatch.check(marker, 0, 0) is None                     # nothing failed
    marker.write_text(failure_text(1, 2, "error: train.data.path: no such directory"))
    assert failwatch.failed_rank(marker) == 1
    assert failwatch.check(marker, 0, 1) == 2                         # rank 1's exit 2
    assert failwatch.check(marker, 1, 1) is None                      # its own: it exits itself


def test_a_marker_being_written_is_waited_for_a_moment(tmp_path):
    marker = RunDir(tmp_path).failed(0)
    marker.write_text("")                    # created, not yet written (O_EXCL, then write)
    assert failwatch.check(marker, 0, 1) is None
    assert failwatch.check(marker, 0, failwatch.UNREADABLE) == 1      # then: end anyway


def test_the_watch_thread_ends_the_rank_within_a_tick_or_two(tmp_path):
    ended = []
    done = threading.Event()

    def end(status, marker):
        ended.append((status, time.monotonic()))
        done.set()

    failwatch.watch(tmp_path, 0, 3, end=end)
    time.sleep(0.3)
    RunDir(tmp_path).failed(2).write_text(failure_text(1, 1, "another attempt's"))
    time.sleep(0.6)
    assert ended == []                       # an earlier attempt's marker is not this one's
    wrote = time.monotonic()
    RunDir(tmp_path).failed(3).write_text(failure_text(1, 1, "Traceback ...\nRuntimeError: x"))
    assert done.wait(5)
    status, at = ended[0]
    assert status == 1 and at - wrote < 3 * failwatch.TICK
