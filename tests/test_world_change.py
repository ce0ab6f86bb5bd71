"""A run resumed at another world size: the record and the words (runs/world_change.py), and
the summary `submit --wait` prints (runs/results.summarize)."""

import json

from hpcsuite.runs.results import Results, summarize
from hpcsuite.runs.world_change import change, in_words


def test_the_same_world_or_an_unrecorded_one_is_no_change():
    assert change({"world_size": 2, "batch_size": 8}, 8, 1, 2, 5, None) is None
    assert change({"batch_size": 8}, 8, 1, 4, 5, None) is None


def test_the_global_batch_before_is_the_checkpoints_own():
    c = change({"world_size": 4, "batch_size": 32, "grad_accumulation": 2}, 16, 1, 2, 100, 1500)
    assert (c["global_batch_before"], c["global_batch_after"]) == (256, 32)
    # A checkpoint that did not record its batch settings: this job's are taken.
    c = change({"world_size": 1}, 16, 2, 2, 100, None)
    assert (c["global_batch_before"], c["global_batch_after"]) == (32, 64)


def test_what_a_step_means_for_max_steps_and_for_epochs():
    grow = change({"world_size": 1, "batch_size": 64}, 64, 1, 4, 900, 1500)
    assert in_words(grow) == ("resumed from 1 to 4 ranks at step 900: global batch 64 -> 256 "
                              "samples per step; train.max_steps 1500 counts steps, so the 600 "
                              "steps left train 153600 samples, not 38400")
    shrink = change({"world_size": 4, "batch_size": 64}, 64, 1, 2, 10, None)
    assert in_words(shrink).endswith("train.epochs bounds the run, so each epoch still trains "
                                     "every sample once, in 2x the steps it took before")
    # Fewer ranks, a larger batch each: the same global batch, nothing more to say.
    same = change({"world_size": 4, "batch_size": 32}, 64, 1, 2, 10, None)
    assert in_words(same) == "resumed from 4 to 2 ranks at step 10: global batch 128 -> 128 " \
                             "samples per step; a step trains as many samples as before"


def _summary(tmp_path, **fields):
    results = Results(job="j", job_id="7", status="completed", backend="torch", final_step=20,
                      start_step=10, resumed_from="ck/step-00000010", hosts=["node1"], **fields)
    (tmp_path / "results.json").write_text(json.dumps(results.to_json()))
    return summarize(tmp_path)


def test_the_summary_says_the_world_changed_and_spares_one_rank_the_parameters_line(tmp_path):
    c = change({"world_size": 2, "batch_size": 8}, 8, 1, 1, 10, 20)
    text = _summary(tmp_path, world_size=1, param_checksums=["a"], world_change=c)
    assert "  resumed from 2 to 1 ranks at step 10: global batch 16 -> 8 samples per step" in text
    assert "parameters" not in text
    two = _summary(tmp_path, world_size=2, param_checksums=["a", "a"])
    assert "parameters: identical on all ranks" in two and "resumed from" not in two
