"""Login-node commands never import torch, tensorflow or horovod."""

import json
import subprocess
import sys

import pytest

from conftest import SBATCH

HEAVY = ("torch", "tensorflow", "horovod", "keras", "mpi4py", "numpy", "mlflow")
PROBE = """
import json, sys
from hpcsuite.cli import main
try:
    main(args=sys.argv[1:], prog_name="hpcsuite")
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
print("\\nHEAVY=" + json.dumps(heavy))
print("CLI=" + json.dumps(sorted(m for m in sys.modules if m.startswith("hpcsuite.cli."))))
""".format(heavy=set(HEAVY))

COMMANDS = [
    ["--help"], ["render", "--help"], ["submit", "--help"], ["status", "--help"],
    ["logs", "--help"], ["cancel", "--help"], ["runs", "--help"], ["cluster", "--help"],
    ["cluster", "status", "--help"], ["sweep", "--help"], ["sweep", "run", "--help"],
    ["sweep", "report", "--help"], ["report", "--help"], ["tracking", "sync", "--help"],
    ["render", str(SBATCH / "quickstart.yaml"), "--profile", str(SBATCH / "profile.yaml")],
    ["submit", str(SBATCH / "quickstart.yaml"), "--dry-run"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_no_framework_imported(args):
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                         timeout=60)
    line = [l for l in out.stdout.splitlines() if l.startswith("HEAVY=")]
    assert line, out.stderr
    assert json.loads(line[-1][6:]) == []


def test_train_help_does_not_import_frameworks_either():
    out = subprocess.run([sys.executable, "-c", PROBE, "train", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert "HEAVY=[]" in out.stdout


def test_sharding_data_and_checkpoint_layers_import_no_framework():
    probe = ("import sys, json; import hpcsuite.runtime.input.sharding, hpcsuite.runtime.input.data, "
             "hpcsuite.runtime.input.blocks, hpcsuite.runtime.session.checkpoint, hpcsuite.runtime.session.loop; "
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'tensorflow', 'keras', 'horovod'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


# Installed by scripts/setup.sh, not by an extra (Horovod is a patched source build).
SETUP_INSTALLED = {"torch", "tensorflow", "keras", "horovod"}


def _third_party_imports(paths) -> set[str]:
    import ast

    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found.update(n.split(".")[0] for n in names)
    return {n for n in found if n not in sys.stdlib_module_names and n != "hpcsuite"}


def test_every_module_the_runtime_imports_is_in_the_train_extra():
    """`pip install hpcsuite[train]` (plus setup.sh's frameworks) is all a compute node needs;
    an optional feature's extra (tracking: train.tracking's mlflow) only where it is used."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    train = {re.split(r"[<>=\[ ]", req)[0].replace("-", "_").lower() for req in extras["train"]}
    base = {re.split(r"[<>=\[ ]", req)[0].replace("-", "_").lower() for req in
            tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]}
    aliases = {"yaml": "pyyaml", "pynvml": "nvidia_ml_py"}
    used = _third_party_imports((root / "hpcsuite" / "runtime").glob("*.py"))
    used |= _third_party_imports([root / "hpcsuite" / "api.py"])
    optional = {re.split(r"[<>=\[ ]", req)[0].split("-")[0].lower() for req in extras["tracking"]}
    missing = {m for m in used - SETUP_INSTALLED if aliases.get(m, m) not in train | base | optional}
    assert not missing, f"imported by the runtime but in no install extra: {sorted(missing)}"


def test_everyday_commands_load_only_their_own_module():
    """render and submit import their own command module and no other (no status, study, sweep,
    bench, cluster, config or lint module): each loads when its command is named
    (cli.LAZY_COMMANDS)."""
    from hpcsuite.cli import LAZY_COMMANDS

    for args in (["render", str(SBATCH / "quickstart.yaml"), "--profile", str(SBATCH / "profile.yaml")],
                 ["submit", str(SBATCH / "quickstart.yaml"), "--dry-run"]):
        out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                             timeout=60)
        line = [l for l in out.stdout.splitlines() if l.startswith("CLI=")]
        assert line, out.stderr
        assert json.loads(line[-1][4:]) == ["hpcsuite.cli.submit_cmd"]
    assert set(LAZY_COMMANDS.values()) >= {"study_cmd", "sweep_cmd", "bench_cmd"}


def test_every_lazy_command_is_registered_by_its_module():
    import click

    from hpcsuite.cli import LAZY_COMMANDS, main

    ctx = click.Context(main)
    for name, module in LAZY_COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name, (name, module)
        assert command.callback.__module__ == f"hpcsuite.cli.{module}"
    listed = main.list_commands(ctx)
    assert listed == sorted(main.commands) and set(LAZY_COMMANDS) <= set(listed)


# What render and submit --dry-run may import beyond click, jinja2 and yaml (the floor
# bench/render_latency.py measures them against): their own modules and these few of the
# standard library. A module new here (urllib.request's http.client, ssl and email cost
# 70 ms on the 2-core machine) fails this test: import it where it is used, or add it here
# with the latency it costs measured (docs/BENCHMARKS.md).
LOGIN_STDLIB = {"_locale", "copy", "dataclasses", "locale", "shlex", "textwrap"}
LOGIN_THIRD_PARTY = {"click._textwrap", "jinja2.sandbox"}
LOGIN_HPCSUITE = {"hpcsuite", "hpcsuite.cli", "hpcsuite.cli.submit_cmd", "hpcsuite.errors",
                  "hpcsuite.fabrics", "hpcsuite.records", "hpcsuite.shell", "hpcsuite.templates",
                  "hpcsuite.usercode", "hpcsuite.runner", "hpcsuite.runs", "hpcsuite.runs.rundir",
                  "hpcsuite.runs.mlflow_store", "hpcsuite.submit",
                  "hpcsuite.mpis"}   # what an MPI is: mpi_flavours' records (2 ms)
LOGIN_ROOMS = ("hpcsuite.runner.", "hpcsuite.submit.")
ALL_MODULES = """
import json, sys
floor = set(sys.modules)
from hpcsuite.cli import main
try:
    main(args=sys.argv[1:], prog_name="hpcsuite")
except SystemExit:
    pass
print("\\nMODULES=" + json.dumps(sorted(set(sys.modules) - floor)))
"""


@pytest.mark.parametrize("args", [
    ["render", str(SBATCH / "quickstart.yaml"), "--profile", str(SBATCH / "profile.yaml")],
    ["submit", str(SBATCH / "quickstart.yaml"), "--dry-run"]], ids=lambda a: " ".join(a[:2]))
def test_login_commands_import_only_the_allowed_modules(args):
    floor = subprocess.run([sys.executable, "-c", "import json, sys, click, jinja2, yaml; "
                            "print(json.dumps(sorted(sys.modules)))"],
                           capture_output=True, text=True, timeout=60)
    out = subprocess.run([sys.executable, "-c", ALL_MODULES, *args], capture_output=True,
                         text=True, timeout=60)
    line = [l for l in out.stdout.splitlines() if l.startswith("MODULES=")]
    assert line, out.stderr
    extra = set(json.loads(line[-1][8:])) - set(json.loads(floor.stdout))
    outside = sorted(m for m in extra if m not in LOGIN_STDLIB | LOGIN_THIRD_PARTY | LOGIN_HPCSUITE
                     and not m.startswith(LOGIN_ROOMS))
    assert not outside, f"`hpcsuite {' '.join(args[:2])}` imports {outside}: not on the login path"
