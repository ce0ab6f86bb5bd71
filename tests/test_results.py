"""results.json has one typed owner, read by the CLI and the tests."""

import pytest

from hpcsuite.errors import UserError
from hpcsuite.results import Results, summarize


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
