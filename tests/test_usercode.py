"""User code named in a spec is checked on the login node without being run."""

import pytest
from click.testing import CliRunner

from hpcsuite import usercode
from hpcsuite.cli import main


def check(text, dirs):
    return usercode.check(usercode.parse(text), dirs)


def test_parse():
    assert usercode.parse("mlp") is None
    ref = usercode.parse("models/net.py:build")
    assert (ref.file, ref.module, ref.name) == ("models/net.py", None, "build")
    ref = usercode.parse("mypkg.nets:make")
    assert (ref.file, ref.module, ref.name) == (None, "mypkg.nets", "make")


def test_check_reads_but_never_runs_the_file(tmp_path):
    (tmp_path / "net.py").write_text(
        "import torch  # never imported by the check\n"
        "raise RuntimeError('must not run on the login node')\n"
        "def build(shape, classes):\n    return None\n"
        "class Data:\n    pass\n"
        "factory = Data\n"
        "from somewhere import helper as renamed\n")
    for name in ("build", "Data", "factory", "renamed"):
        assert check(f"net.py:{name}", [tmp_path]) is None, name
    assert check("net.py:nope", [tmp_path]) == f"net.py:nope: {tmp_path / 'net.py'} defines no nope"


def test_check_problems(tmp_path):
    assert check("missing.py:f", [tmp_path]).startswith("missing.py:f: no file missing.py (looked in")
    (tmp_path / "bad.py").write_text("def f(:\n")
    assert check("bad.py:f", [tmp_path]) == f"bad.py:f: {tmp_path / 'bad.py'}:1: syntax error: invalid syntax"
    (tmp_path / "nul.py").write_bytes(b"def f():\x00 pass\n")
    assert check("nul.py:f", [tmp_path]) == (f"nul.py:f: {tmp_path / 'nul.py'}: syntax error: "
                                             "source code string cannot contain null bytes")
    assert check("no.such.module:f", [tmp_path]).startswith("no.such.module:f: no module no.such.module")


def test_modules_and_pythonpath(tmp_path):
    pkg = tmp_path / "lib" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('not imported by the check')\n")
    (pkg / "nets.py").write_text("def make(shape, classes):\n    return ('model', shape, classes)\n")
    dirs = usercode.search_dirs(["lib"], tmp_path)
    assert check("mypkg.nets:make", dirs) is None
    assert check("mypkg.nets:other", dirs).endswith("defines no other")
    (pkg / "__init__.py").write_text("")
    assert usercode.load(usercode.parse("mypkg.nets:make"), dirs)((8,), 3) == ("model", (8,), 3)


def test_load_a_file_that_imports_its_neighbours(tmp_path):
    (tmp_path / "helper.py").write_text("WIDTH = 7\n")
    (tmp_path / "net.py").write_text("from helper import WIDTH\ndef build(s, c):\n    return WIDTH\n")
    assert usercode.load(usercode.parse("net.py:build"), [tmp_path])(None, None) == 7


def test_render_refuses_bad_references_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(tmp_path / "site"))
    (tmp_path / "net.py").write_text("def build(shape, classes):\n    pass\n")
    spec = tmp_path / "job.yaml"
    for train, message in [
        ("{model: net.py:buld}", f"train.model: net.py:buld: {tmp_path / 'net.py'} defines no buld"),
        ("{model: nets.py:build}", "train.model: nets.py:build: no file nets.py"),
        ("{loss: net.py:nope}", "train.loss: net.py:nope"),
        ("{data: {kind: python, factory: data.py:make}}", "train.data.factory: data.py:make: no file"),
        ("{data: {kind: python}}", "train.data.factory: required for kind python"),
        ("{data: {kind: hdf5}}", "train.data.path: required for kind hdf5"),
        ("{script: train.py}", "train.script: train.py: no such file"),
        ("{model: 'net.py:build x'}", "train.model: 'net.py:build x' is not valid"),
        ("{precision: mixed_float16}", "train.precision: mixed_float16 is TensorFlow's policy"),
    ]:
        spec.write_text(f"name: j\ntrain: {train}\n")
        result = CliRunner().invoke(main, ["submit", str(spec)])
        assert result.exit_code == 2, (train, result.output)
        assert message in result.output, (train, result.output)
        assert not (tmp_path / "runs").exists()
    spec.write_text("name: j\ntrain: {model: net.py:build, loss: net.py:build}\n")
    assert CliRunner().invoke(main, ["render", str(spec)]).exit_code == 0
