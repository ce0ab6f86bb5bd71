"""User code that raises is named by its spec key; epochs and max_steps say which ends
training; `lint --build` finds on the login node what a rank finds at its start."""

import json
import subprocess
import sys
import textwrap

import pytest

from hpcsuite import usercode
from hpcsuite.errors import UserError
from hpcsuite.submit.spec import spec_from_dict


def test_blame_names_the_key_of_user_code_and_leaves_our_errors_alone():
    with pytest.raises(ZeroDivisionError) as exc:
        with usercode.blame("train.model", "net.py:build"):
            1 / 0
    assert exc.value.hpcsuite_key == "train.model (net.py:build)"
    assert "(raised in train.model (net.py:build))" in exc.value.__notes__
    with pytest.raises(UserError) as mine:
        with usercode.blame("train.model", "net.py:build"):
            raise UserError("train.model: already named")
    assert not hasattr(mine.value, "hpcsuite_key")
    with pytest.raises(KeyError) as builtin:      # a built-in name: the key alone
        with usercode.blame("train.loss", "cross_entropy"):
            raise KeyError("x")
    assert builtin.value.hpcsuite_key == "train.loss"


@pytest.mark.parametrize("train, steps_per_epoch, limit", [
    ({}, 8, 1.0),                                   # neither: one epoch
    ({"epochs": 3}, 8, 3.0),
    ({"max_steps": 20}, 8, 2.5),                    # max_steps alone: the epochs it needs
    ({"epochs": 2, "max_steps": 20}, 8, 2.0),       # both: the first reached ends it
])
def test_which_limit_ends_training(train, steps_per_epoch, limit):
    job = spec_from_dict({"name": "x", "train": train}, "x.yaml")
    assert job.train.epoch_limit(steps_per_epoch) == limit


MODEL = '''
import torch


def wrong_width(shape, classes):
    return torch.nn.Linear(shape[0], classes + 1)


def keras_model(shape, classes):
    import keras
    return keras.Sequential([keras.Input(shape), keras.layers.Dense(classes)])


def broken(shape, classes):
    return {}["missing"]


class Data:
    def __len__(self):
        return 10

    def __getitem__(self, ids):
        return "not arrays"


def data():
    return Data()
'''


def lint_build(tmp_path, train: dict) -> subprocess.CompletedProcess:
    (tmp_path / "net.py").write_text(textwrap.dedent(MODEL))
    spec = {"name": "x", "train": {"data": {"samples": 64, "shape": [8], "classes": 4}, **train}}
    (tmp_path / "job.yaml").write_text(json.dumps(spec))
    return subprocess.run([sys.executable, "-m", "hpcsuite", "lint", "job.yaml", "--build",
                           "--no-slurm"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("train, key, text", [
    ({"model": "net.py:wrong_width"}, "train.model", "gives outputs of shape [2, 5]"),
    ({"model": "net.py:keras_model"}, "train.model", "not a torch.nn.Module"),
    ({"model": "net.py:broken"}, "train.model", "net.py:broken raised KeyError: 'missing'"),
    ({"data": {"kind": "python", "factory": "net.py:data"}}, "train.data.factory",
     "ds[ids] must return (inputs, targets)"),
])
def test_lint_build_finds_what_a_rank_would_in_seconds(tmp_path, train, key, text):
    pytest.importorskip("horovod.torch")
    done = lint_build(tmp_path, train)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [l for l in done.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: job.yaml: {key}: "), done.stderr
    assert text in errors[0]
    assert "Traceback" not in done.stderr


def test_lint_build_passes_a_good_job_and_plain_lint_imports_no_framework(tmp_path):
    pytest.importorskip("horovod.torch")
    done = lint_build(tmp_path, {"model": "mlp"})
    assert done.returncode == 0 and "ok (data, model and loss built)" in done.stdout, done.stderr
    code = ("import sys; from hpcsuite.cli import main; "
            "main(['lint', 'job.yaml', '--no-slurm'], standalone_mode=False); "
            "print(sorted(m for m in ('torch', 'tensorflow', 'horovod') if m in sys.modules))")
    plain = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert plain.stdout.strip().endswith("[]"), plain.stdout + plain.stderr


def test_an_error_in_training_is_blamed_on_the_key_whose_file_raised(tmp_path, monkeypatch):
    from hpcsuite.runtime.train import blame_by_frames

    (tmp_path / "net.py").write_text("def forward(x):\n    raise ValueError(x)\n")
    (tmp_path / "losses.py").write_text("def mine(out, y):\n    return out\n")
    monkeypatch.chdir(tmp_path)
    job = spec_from_dict({"name": "x", "train": {"model": "net.py:build",
                                                 "loss": "losses.py:mine"}}, "x.yaml")
    namespace = {}
    exec(compile((tmp_path / "net.py").read_text(), str(tmp_path / "net.py"), "exec"), namespace)
    with pytest.raises(ValueError) as exc:
        namespace["forward"](3)
    assert blame_by_frames(job, exc.value) == "train.model (net.py:build)"
    with pytest.raises(ZeroDivisionError) as ours:
        1 / 0
    assert blame_by_frames(job, ours.value) is None
