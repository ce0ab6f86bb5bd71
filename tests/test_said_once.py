"""Errors where they are found, and said once (issue T, point 8): plain lint opens what is cheap
of the data (an HDF5 file's datasets, npy shards' headers) and names the spec key; a spec path
that is a directory is the one-line contract; lint prints a problem once even when the site
profile and Slurm both see it; `config show --origin` names the template file in use."""

import os

import numpy as np
import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.errors import UserError
from hpcsuite.runtime.input.data import Hdf5
from hpcsuite.submit.lint import Finding
from hpcsuite.submit.spec import spec_from_dict

from conftest import SBATCH, as_account

PROFILE = str(SBATCH / "profile.yaml")


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def lint(*args):
    result = CliRunner().invoke(main, ["lint", *args, "--no-slurm"])
    return result.exit_code, [line for line in result.output.splitlines()
                              if line.startswith(("error:", "warning:"))]


def h5(path, **datasets):
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            f[name.replace("__", "/")] = value


def test_plain_lint_names_the_hdf5_key_and_lists_the_files_datasets(here):
    h5(here / "d.h5", train__inputs=np.zeros((8, 3), "f4"), train__y=np.zeros(8, "i8"))
    (here / "job.yaml").write_text("name: h\ntrain:\n  data: {kind: hdf5, path: d.h5, "
                                   "inputs: train/inputs, labels: train/labels}\n")
    code, lines = lint("job.yaml")
    assert code == 2 and lines == [
        f"error: job.yaml: train.data.labels: {here / 'd.h5'}: no dataset 'train/labels'; the "
        "file's datasets: train/inputs, train/y"]
    (here / "job.yaml").write_text("name: h\ntrain:\n  data: {kind: hdf5, path: d.h5, "
                                   "inputs: train/inputs, labels: train/y}\n")
    assert lint("job.yaml") == (0, [])
    h5(here / "d.h5", train__inputs=np.zeros((8, 3), "f4"), train__y=np.zeros(5, "i8"))
    code, lines = lint("job.yaml")
    assert code == 2 and "train.data.labels" in lines[0] and "5 rows for the 8 rows" in lines[0]


def test_a_rank_names_the_key_of_a_missing_hdf5_dataset_too(here):
    h5(here / "d.h5", x=np.zeros((4, 2), "f4"), y=np.zeros(4, "i8"))
    spec = spec_from_dict({"name": "h", "train": {"data": {"kind": "hdf5", "path": "d.h5",
                                                           "inputs": "x", "labels": "z"}}}, "t")
    with pytest.raises(UserError, match=r"^train\.data\.labels: .*no dataset 'z'; the file's "
                                        r"datasets: x, y$"):
        Hdf5(spec.train.data, 0)


def test_plain_lint_reads_npy_shard_headers(here):
    data = here / "shards"
    data.mkdir()
    np.save(data / "inputs-00000.npy", np.zeros((6, 4), "f4"))
    np.save(data / "labels-00000.npy", np.zeros(6, "i8"))
    np.save(data / "inputs-00001.npy", np.zeros((3, 5), "f4"))     # another sample shape
    np.save(data / "labels-00001.npy", np.zeros(3, "i8"))
    (here / "job.yaml").write_text("name: n\ntrain:\n  data: {kind: npy, path: shards}\n")
    code, lines = lint("job.yaml")
    assert code == 2 and len(lines) == 1 and lines[0].startswith(
        "error: job.yaml: train.data.path: ") and "sample shape (5,) differs from (4,)" in lines[0]
    np.save(data / "inputs-00001.npy", np.zeros((3, 4), "f4"))
    np.save(data / "labels-00001.npy", np.zeros(2, "i8"))
    code, lines = lint("job.yaml")
    assert code == 2 and "2 labels for 3 inputs" in lines[0]
    np.save(data / "labels-00001.npy", np.zeros(3, "f4"))
    code, lines = lint("job.yaml")
    assert code == 2 and "labels must be integers, not float32" in lines[0]
    np.save(data / "labels-00001.npy", np.zeros(3, "i4"))
    assert lint("job.yaml") == (0, [])
    # Data this machine cannot see is the ranks' to find: said, not refused.
    (here / "job.yaml").write_text("name: n\ntrain:\n  data: {kind: npy, path: /nowhere/x}\n")
    code, lines = lint("job.yaml")
    assert code == 0 and lines == ["warning: job.yaml: train.data.path: /nowhere/x: not found "
                                   "on this machine, so not checked here; the ranks must find it"]


@pytest.mark.parametrize("command", [["lint"], ["submit"], ["render"], ["config", "show"]])
def test_a_spec_path_that_is_a_directory_is_one_line(here, command):
    (here / "d.yaml").mkdir()
    result = CliRunner().invoke(main, [*command, "d.yaml"])
    assert result.exit_code == 2 and result.output == "error: d.yaml: is a directory, not a file\n"


def test_an_unreadable_spec_is_one_line(here, monkeypatch):
    """Run as the unprivileged test account when root runs the tests (root reads any file),
    in a directory it can reach (pytest's are under /tmp/pytest-of-root, mode 700)."""
    import shutil
    import tempfile
    from pathlib import Path

    work = Path(tempfile.mkdtemp(prefix="hpcsuite-unreadable-"))
    work.chmod(0o755)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(work / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(work / "xdg"))
    (work / "job.yaml").write_text("name: x\n")
    (work / "job.yaml").chmod(0)
    (work / "ok.yaml").write_text("name: x\n")

    def lint(name):
        result = CliRunner().invoke(main, ["lint", name])
        return result.exit_code, result.output

    try:
        assert lint("ok.yaml")[0] == 0       # and everything lint imports is imported
        code, output = as_account(lambda: lint("job.yaml"))
        assert code == 2 and output.startswith("error: job.yaml: ")
        assert len(output.splitlines()) == 1
        control = as_account(lambda: lint("ok.yaml"))     # a file it can read
        assert control[0] == 0, control[1]
    finally:
        shutil.rmtree(work)


def test_lint_prints_a_problem_the_profile_and_slurm_both_see_once(here, monkeypatch):
    import hpcsuite.submit.lint as lint_module

    monkeypatch.setattr(lint_module, "slurm_findings", lambda job: [
        Finding("error", "resources.tasks_per_node", "2 ranks x 1 CPUs = 2 CPUs per node, but "
                "the nodes of partition 'debug' have at most 1"),
        Finding("error", "resources.nodes", "9 nodes, but partition 'debug' has 2 nodes")])
    (here / "job.yaml").write_text("name: x\nresources: {partition: debug, nodes: 9, "
                                   "tasks_per_node: 2}\n")
    result = CliRunner().invoke(main, ["lint", "job.yaml", "--profile", PROFILE, "--slurm"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2
    assert [e.split(": ")[2] for e in errors] == ["resources.tasks_per_node", "resources.nodes"]


def test_config_show_origin_names_the_template_file_in_use(here):
    spec = str(SBATCH / "quickstart.yaml")
    result = CliRunner().invoke(main, ["config", "show", spec, "--origin"])
    line = next(x for x in result.output.splitlines() if x.startswith("job.template "))
    assert "(builtin)" in line and "horovod.sbatch.j2" in line
    site = here / "site" / "templates"
    site.mkdir(parents=True)
    (site / "horovod.sbatch.j2").write_text('{% extends "builtin/horovod.sbatch.j2" %}\n')
    result = CliRunner().invoke(main, ["config", "show", spec, "--origin"])
    line = next(x for x in result.output.splitlines() if x.startswith("job.template "))
    assert f"file: {site / 'horovod.sbatch.j2'} (site)" in line, line
