"""The Horovod timeline window: when it starts and stops, where the file goes, the report."""

from pathlib import Path

import pytest

from hpcsuite.errors import UserError
from hpcsuite.submit.lint import lint
from hpcsuite.submit.plan import horovod_environment
from hpcsuite.submit.site_profile import SiteProfile
from hpcsuite.runs.report import timeline_line, timeline_summary, timeline_windows
from hpcsuite.runtime.observe.timeline import Window
from hpcsuite.submit.spec import spec_from_dict


class FakeHvd:
    def __init__(self):
        self.calls = []

    def start_timeline(self, path, mark_cycles=False):
        self.calls.append(("start", path))
        Path(path).write_text('[{"ph": "B", "name": "ALLREDUCE", "ts": 0, "pid": 1},'
                              '{"ph": "E", "ts": 3000, "pid": 1}')

    def stop_timeline(self):
        self.calls.append(("stop",))


def test_window_starts_and_stops_at_its_steps_and_copies_rank_0s_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "local"))
    (tmp_path / "local").mkdir()
    hvd = FakeHvd()
    w = Window(hvd, 0, tmp_path, 10, 5)
    for step in range(0, 10):
        w.step(step)
    assert hvd.calls == []
    w.step(10)
    assert hvd.calls[0][0] == "start" and hvd.calls[0][1].startswith(str(tmp_path / "local"))
    for step in range(11, 30):
        w.step(step)
    assert [c[0] for c in hvd.calls] == ["start", "stop"]
    copy = tmp_path / "horovod-timeline-steps-10-15.json"
    assert copy.is_file() and not list((tmp_path / "local").iterdir())
    assert timeline_windows(tmp_path) == [copy]
    s = timeline_summary(copy)                # the file lacks its closing bracket: still read
    assert s["steps"] == 5 and s["per_step_ms"] == {"ALLREDUCE": 3000 / 1000 / 5}
    assert "ALLREDUCE 0.6 ms" in timeline_line(s)


def test_a_run_that_ends_inside_the_window_keeps_what_it_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    hvd = FakeHvd()
    w = Window(hvd, 0, tmp_path, 0, 100)
    w.step(0)
    w.step(1)
    assert w.close(7) == tmp_path / "horovod-timeline-steps-0-7.json"
    assert w.close(7) is None and [c[0] for c in hvd.calls] == ["start", "stop"]
    other = Window(FakeHvd(), 1, tmp_path, 0, 3)           # rank 1 copies nothing
    other.step(0)
    assert other.close(2) is None


def test_a_resumed_run_past_the_window_records_nothing(tmp_path):
    hvd = FakeHvd()
    w = Window(hvd, 0, tmp_path, 10, 5)
    w.step(40)
    assert w.close(50) is None and hvd.calls == []


def test_the_window_renders_dynamic_and_excludes_the_whole_run_timeline():
    job = spec_from_dict({"name": "t", "train": {"monitor": {"timeline_steps": 20}}}, "t.yaml")
    assert horovod_environment(job)["HOROVOD_TIMELINE"] == "DYNAMIC"
    both = spec_from_dict({"name": "t", "train": {"monitor": {"timeline_steps": 20},
                                                  "horovod": {"timeline": True}}}, "t.yaml")
    errors = [f for f in lint(both, SiteProfile()) if f.level == "error"]
    assert [f.key for f in errors] == ["train.monitor.timeline_steps"]
    plain = spec_from_dict({"name": "t"}, "t.yaml")
    assert "HOROVOD_TIMELINE" not in horovod_environment(plain)


def test_a_damaged_timeline_is_one_error_naming_the_file(tmp_path):
    bad = tmp_path / "horovod-timeline-steps-1-2.json"
    bad.write_text('[{"ph": "B", "na')
    with pytest.raises(UserError, match=r"horovod-timeline-steps-1-2.json: not a Horovod timeline"):
        timeline_summary(bad)
