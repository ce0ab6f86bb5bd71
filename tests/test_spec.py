"""Job spec validation: one clear error naming the file and dotted key."""

import pytest

from hpcsuite.errors import UserError
from hpcsuite.submit.spec import load_spec


def write(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error_of(path):
    with pytest.raises(UserError) as exc:
        load_spec(path)
    return str(exc.value)


def test_minimal_spec_gets_defaults(tmp_path):
    spec = load_spec(write(tmp_path, "name: tiny\n"))
    assert spec.launcher == "mpirun"
    assert spec.resources.nodes == 1 and spec.world_size == 1
    assert spec.train.backend == "torch" and spec.train.data.kind == "synthetic"


def test_unknown_key_names_path_and_close_match(tmp_path):
    path = write(tmp_path, "name: x\nresources: {nodse: 2}\n")
    msg = error_of(path)
    assert msg.startswith(f"{path}: resources.nodse: unknown key")
    assert 'did you mean "nodes"' in msg and "valid keys:" in msg


def test_wrong_type(tmp_path):
    msg = error_of(write(tmp_path, "name: x\ntrain: {batch_size: big}\n"))
    assert "train.batch_size: expected an integer, got a string 'big'" in msg


def test_bool_is_not_an_int(tmp_path):
    assert "expected an integer" in error_of(write(tmp_path, "name: x\nresources: {nodes: true}\n"))


def test_out_of_range(tmp_path):
    assert "resources.nodes: 0 is below the minimum 1" in error_of(
        write(tmp_path, "name: x\nresources: {nodes: 0}\n"))


def test_choice_lists_valid_values(tmp_path):
    msg = error_of(write(tmp_path, "name: x\nlauncher: mpirn\n"))
    assert "launcher: 'mpirn' is not one of: mpirun, srun" in msg and '"mpirun"' in msg


def test_missing_name(tmp_path):
    assert "name: required key is missing" in error_of(write(tmp_path, "resources: {}\n"))


def test_bad_name_pattern(tmp_path):
    assert "name: 'a b;rm' is not valid" in error_of(write(tmp_path, "name: 'a b;rm'\n"))


def test_newline_refused(tmp_path):
    msg = error_of(write(tmp_path, 'name: x\nenv: {A: "one\\ntwo"}\n'))
    assert "env.A: newline and NUL characters are not allowed" in msg


def test_bad_env_name(tmp_path):
    assert "env.1BAD: not a valid environment variable name" in error_of(
        write(tmp_path, "name: x\nenv: {1BAD: v}\n"))


def test_invalid_yaml_names_line(tmp_path):
    path = write(tmp_path, "name: x\nresources: [1, 2\n")
    assert error_of(path).startswith(f"{path}:")
    assert "invalid YAML" in error_of(path)


def test_not_a_mapping(tmp_path):
    assert "expected a mapping of keys, got a list" in error_of(write(tmp_path, "- 1\n"))


def test_missing_file(tmp_path):
    assert "no such file" in error_of(str(tmp_path / "nope.yaml"))


def test_walltime_accepts_minutes_and_clock(tmp_path):
    assert load_spec(write(tmp_path, "name: x\nresources: {time: 30}\n")).resources.time == "30"
    assert "resources.time" in error_of(write(tmp_path, "name: x\nresources: {time: soon}\n"))


def test_digest_is_stable_and_sensitive(tmp_path):
    a = load_spec(write(tmp_path, "name: x\n", "a.yaml"))
    b = load_spec(write(tmp_path, "name: x\ntrain: {seed: 1}\n", "b.yaml"))
    assert a.digest() == load_spec(write(tmp_path, "name: x\n", "c.yaml")).digest()
    assert a.digest() != b.digest()
