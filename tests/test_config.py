"""Layered configuration: built-in < site < user < project < spec < --set, with locks."""

import json

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.submit.config import resolve
from hpcsuite.errors import UserError


@pytest.fixture
def layers(tmp_path, monkeypatch):
    """Empty site, user and project locations, all under tmp_path."""
    site, user, project = tmp_path / "site", tmp_path / "xdg", tmp_path / "proj"
    for d in (site, user / "hpcsuite", project / ".hpcsuite"):
        d.mkdir(parents=True)
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(site))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    monkeypatch.chdir(project)
    files = {"site": site / "profile.yaml", "user": user / "hpcsuite" / "profile.yaml",
             "project": project / ".hpcsuite" / "profile.yaml", "spec": project / "job.yaml"}
    files["spec"].write_text("name: job\n")
    return files


def test_each_layer_overrides_the_one_below(layers):
    layers["site"].write_text("defaults: {train: {epochs: 2, lr: 0.1, seed: 1}, resources: {time: '01:00:00'}}\n")
    layers["user"].write_text("defaults: {train: {epochs: 3, lr: 0.2}}\n")
    layers["project"].write_text("defaults: {train: {epochs: 4}}\n")
    layers["spec"].write_text("name: job\ntrain: {epochs: 5}\n")
    r = resolve(str(layers["spec"]), sets=["train.epochs=6"])
    assert (r.job.train.epochs, r.job.train.lr, r.job.train.seed) == (6, 0.2, 1)
    assert r.job.resources.time == "01:00:00"
    assert r.origins["job.train.epochs"] == "set (--set)"
    assert r.origins["job.train.lr"] == f"user ({layers['user']})"
    assert r.origins["job.train.seed"] == f"site ({layers['site']})"
    assert r.origins["job.train.batch_size"] == "builtin"


def test_site_env_reaches_the_job_and_user_may_add(layers):
    layers["site"].write_text("env: {UCX_NET_DEVICES: mlx5_0:1, NCCL_DEBUG: WARN}\n")
    layers["spec"].write_text("name: job\nenv: {NCCL_DEBUG: INFO, MINE: x}\n")
    r = resolve(str(layers["spec"]))
    assert r.job.env == {"UCX_NET_DEVICES": "mlx5_0:1", "NCCL_DEBUG": "INFO", "MINE": "x"}


def test_locked_key_refused_with_contact(layers):
    layers["site"].write_text("contact: hpc@uni.example\ndefaults: {resources: {partition: batch}}\n"
                              "locked: [resources.partition]\n")
    layers["spec"].write_text("name: job\nresources: {partition: gpu}\n")
    with pytest.raises(UserError) as exc:
        resolve(str(layers["spec"]))
    msg = str(exc.value)
    assert msg.startswith(f"{layers['spec']}: resources.partition: the site fixes resources.partition")
    assert "hpc@uni.example" in msg


def test_locked_key_may_be_restated_with_the_same_value(layers):
    layers["site"].write_text("defaults: {resources: {partition: batch}}\nlocked: [resources.partition]\n")
    layers["spec"].write_text("name: job\nresources: {partition: batch, nodes: 2}\n")
    assert resolve(str(layers["spec"])).job.resources.partition == "batch"


def test_lock_covers_set_and_sub_keys(layers):
    layers["site"].write_text("env: {NCCL_IB_HCA: mlx5}\nlocked: [env.NCCL_IB_HCA, train.horovod]\n")
    with pytest.raises(UserError, match=r"--set: env.NCCL_IB_HCA: the site fixes env.NCCL_IB_HCA"):
        resolve(str(layers["spec"]), sets=["env.NCCL_IB_HCA=other"])
    layers["project"].write_text("defaults: {train: {horovod: {cycle_time_ms: 9}}}\n")
    with pytest.raises(UserError, match=r"train.horovod.cycle_time_ms: the site fixes train.horovod"):
        resolve(str(layers["spec"]))


def test_only_site_may_lock(layers):
    layers["user"].write_text("locked: [launcher]\n")
    with pytest.raises(UserError, match="locked: only the site profile can lock keys"):
        resolve(str(layers["spec"]))


def test_lock_of_unknown_key(layers):
    layers["site"].write_text("locked: [resources.partitoin]\n")
    with pytest.raises(UserError, match=r"locked\[0\]: 'resources.partitoin' is not a job key "
                                        r'\(did you mean "resources.partition"\?\)'):
        resolve(str(layers["spec"]))


def test_profile_errors_name_their_file(layers):
    layers["project"].write_text("defaults: {resources: {nodes: -1}}\n")
    with pytest.raises(UserError) as exc:
        resolve(str(layers["spec"]))
    assert str(exc.value) == f"{layers['project']}: defaults.resources.nodes: -1 is below the minimum 1"
    layers["project"].write_text("partitons: {}\n")
    with pytest.raises(UserError, match='partitons: unknown key \\(did you mean "partitions"\\?\\)'):
        resolve(str(layers["spec"]))


@pytest.mark.parametrize("item, message", [
    ("nodes", "--set: expected KEY=VALUE, got 'nodes'"),
    ("resources.nodez=2", '--set: resources.nodez: unknown key (did you mean "nodes"?); valid '
                          'keys: account, '),
    ("trian.lr=2", '--set: trian: unknown key (did you mean "train"?); valid keys: after, container, '),
    ("resources.nodes=two", "--set: resources.nodes: expected an integer"),
    ("resources={a: 1}", "a single value is expected"),
])
def test_bad_set(layers, item, message):
    import re

    with pytest.raises(UserError, match=re.escape(message)):
        resolve(str(layers["spec"]), sets=[item])


def test_config_show_origin_cli(layers):
    layers["site"].write_text("name: uni\ndefaults: {resources: {partition: batch}}\n")
    result = CliRunner().invoke(main, ["config", "show", str(layers["spec"]), "--origin",
                                       "--set", "train.epochs=3"])
    assert result.exit_code == 0, result.output
    lines = {l.split()[0]: l for l in result.output.splitlines()}
    assert lines["job.resources.partition"].endswith(f"# site ({layers['site']})")
    assert lines["job.train.epochs"].endswith("# set (--set)")
    assert lines["site.name"].split()[1] == '"uni"'
    data = json.loads(CliRunner().invoke(main, ["config", "show", "--json"]).output)
    assert data["job"]["resources"]["partition"] == "batch" and data["site"]["name"] == "uni"


def test_set_names_one_entry_of_a_mapping(layers):
    """--set env.NAME, train.model_args.NAME and train.data.args.NAME add to the mapping;
    other mappings' entries and bad names are refused naming the key."""
    layers["spec"].write_text("name: j\ntrain: {model: net.py:build, model_args: {depth: 2}, "
                              "data: {kind: python, factory: d.py:f, args: {part: train}}}\n")
    r = resolve(str(layers["spec"]), sets=["train.model_args.hidden=16", "train.data.args.n=3"])
    assert r.job.train.model_args == {"depth": 2, "hidden": 16}
    assert r.job.train.data.args == {"part": "train", "n": 3}
    for bad in ("train.model_args.2x=1", "resources.binding.x=1", "train.optimizer.betas.0=1"):
        with pytest.raises(UserError, match=r"^--set: "):
            resolve(str(layers["spec"]), sets=[bad])
