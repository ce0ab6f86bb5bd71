"""results.json has one typed owner, read by the CLI and the tests."""

import pytest

from hpcsuite.errors import UserError
from hpcsuite.runs.results import Results, describe_run, summarize


def test_round_trip_and_unknown_keys(tmp_path):
    r = Results(job="j", status="completed", world_size=2, hosts=["a", "b"], final_step=5,
                loss=[2.0, 1.0], step_time_s={"median": 0.01},
                eval=[{"epoch": 1, "step": 5, "loss": 0.5, "accuracy": 0.9, "samples": 10}],
                param_checksums=["x", "x"], metrics={"score": 0.7})
    r.write(tmp_path)
    again = Results.load(tmp_path / "results.json")
    assert again == r
    data = r.to_json() | {"from_the_future": 1}
    assert Results.from_json(data) == r
    text = summarize(tmp_path)
    assert "validation loss 0.5000, accuracy 90.00% (10 held-out samples, epoch 1, step 5)" in text
    assert "script metrics: score 0.7" in text and "identical on all ranks" in text


@pytest.mark.parametrize("content, message", [
    ('{"job": "j", ', "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"world_size": 2, "hosts": null}', "hosts: must not be null"),
    ('{"world_size": 2, "loss": 3}', "loss: expected list, got int"),
    ('{"world_size": "2"}', "world_size: expected int, got str"),
    ('{"elapsed_s": true}', "elapsed_s: expected a number, got bool"),
])
def test_damaged_results_are_a_clear_error(tmp_path, content, message):
    (tmp_path / "results.json").write_text(content)
    with pytest.raises(UserError, match=message):
        Results.load(tmp_path / "results.json")


def two_attempts(tmp_path):
    """A job preempted at step 4 and requeued: attempt 1 resumed from the checkpoint at 4."""
    first = Results(job="j", job_id="9", attempt=0, status="preempted", world_size=2,
                    batch_size_per_rank=8, start_step=0, final_step=4, steps=4,
                    loss=[4.0, 3.0, 2.5, 2.0], step_times_s=[0.1] * 4, samples_per_s=150.0,
                    samples_per_s_steady=160.0, stop={"reason": "preempted", "signal": "USR1"})
    first.write(tmp_path)
    second = Results(job="j", job_id="9", attempt=1, status="completed", world_size=1,
                     batch_size_per_rank=8, start_step=4, final_step=7, steps=3,
                     loss=[1.5, 1.0, 0.5], step_times_s=[0.05] * 3, samples_per_s=100.0,
                     samples_per_s_steady=110.0, resumed_from="ckpt/step-4")
    second.write(tmp_path)
    return second


def test_a_requeued_job_is_reported_from_its_first_step(tmp_path):
    two_attempts(tmp_path)
    r = Results.load(tmp_path / "results.json")
    assert r.loss == [1.5, 1.0, 0.5]                      # this attempt's own, as before
    h = r.history
    assert h["steps"] == list(range(1, 8)) and h["loss"] == [4.0, 3.0, 2.5, 2.0, 1.5, 1.0, 0.5]
    assert h["samples_per_s"] == pytest.approx([160.0] * 4 + [160.0] * 3)   # 16/0.1, 8/0.05
    assert [(a["attempt"], a["step"], a["status"], a["world_size"]) for a in h["attempt_starts"]] \
        == [(0, 1, "preempted", 2), (1, 5, "completed", 1)]
    assert [(a["first_step"], a["loss_first"], a["samples_per_s_steady"]) for a in r.attempts] \
        == [(1, 4.0, 160.0), (5, 1.5, 110.0)]
    text = summarize(tmp_path)
    assert "loss 4.0000 at step 1 -> 0.5000 at step 7, over 2 attempts (began: attempt 1 at " \
           "step 5)" in text, text
    assert "attempts: 0: preempted at step 4 (steps 1-4, 2 ranks, 150.0 samples/s); 1: " \
           "completed at step 7 (steps 5-7, 1 rank, 100.0 samples/s)" in text, text
    assert describe_run(r) == ("loss 4.0000 at step 1 -> 0.5000 at step 7, over 2 attempts "
                               "(began: attempt 1 at step 5); samples/s by attempt 0: 150.0, "
                               "1: 100.0")
    assert not (Results.load(tmp_path / "results-attempt-1.json").history)


def test_a_later_attempt_replaces_the_steps_it_trained_again(tmp_path):
    """An attempt killed after its checkpoint at step 2 (it wrote results at 4): the next one
    resumed at 2 and its steps 3-4 are the ones the model kept."""
    Results(job="j", attempt=0, status="preempted", start_step=0, final_step=4,
            loss=[4.0, 3.0, 2.0, 1.0]).write(tmp_path)
    Results(job="j", attempt=1, start_step=2, final_step=5, loss=[2.9, 1.9, 0.9]).write(tmp_path)
    h = Results.load(tmp_path / "results.json").history
    assert h["steps"] == [1, 2, 3, 4, 5] and h["loss"] == [4.0, 3.0, 2.9, 1.9, 0.9]


def test_one_attempt_reads_as_before_and_old_files_have_a_history(tmp_path):
    Results(job="j", loss=[2.0, 1.0], step_times_s=[0.1, 0.1]).write(tmp_path)
    assert "  loss 2.0000 -> 1.0000\n" in summarize(tmp_path)
    old = Results(job="j", start_step=10, final_step=12, loss=[2.0, 1.0], resumed_from="x")
    assert old.whole()["steps"] == [11, 12]              # no history key: this attempt's own
    import json
    (tmp_path / "results.json").write_text(json.dumps({"job": "j", "start_step": 10,
                                                       "loss": [2.0, 1.0], "resumed_from": "x"}))
    text = summarize(tmp_path)                          # what it knows: this attempt's steps
    assert "resumed at step 10" in text and "  loss 2.0000 -> 1.0000\n" in text
