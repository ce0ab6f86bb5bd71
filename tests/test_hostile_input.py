"""Input that is legal YAML (or a plausible file) but wrong: refused in one line, exit 2."""

import json
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main

from conftest import REPO

PROFILE = str(REPO / "sbatch" / "profile.yaml")


def cli(*args, **kw):
    result = CliRunner().invoke(main, list(args), **kw)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def refused(path, text, *args):
    """Render a spec file holding ``text``: exit 2 and the one error line."""
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    result = cli("render", str(path), *args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0][len("error: "):]


@pytest.mark.parametrize("text, message", [
    ("name: a\nname: b\n", "job.yaml:2: duplicate key 'name' (first on line 1)"),
    ("name: a\nresources: {nodes: 1, nodes: 2}\n", "job.yaml:2: duplicate key 'nodes'"),
    ("name: a\nresources: {time: 10:00}\n",
     'job.yaml: resources.time: 10:00 unquoted is the number 600 in YAML (base 60); write time: "10:00"'),
    ("name: a\nresources: {time: 1:30:00}\n", "resources.time: 1:30:00 unquoted is the number 5400"),
    ("name: a\nresources: {time: 0}\n", "job.yaml: resources.time: '0' means no time limit"),
    ("name: a\nresources: {time: '00:00:00'}\n", "resources.time: '00:00:00' means no time limit"),
    ("name: a\nresources: {nodes: 010}\n", "resources.nodes: 010 unquoted is the octal number 8"),
    ("name: a\ntrain: {lr: .nan}\n", "job.yaml: train.lr: nan is not a finite number"),
    ("name: a\ntrain: {lr: .inf}\n", "job.yaml: train.lr: inf is not a finite number"),
    ("name: a\ntrain: {checkpoint: {every_minutes: -.inf}}\n", "train.checkpoint.every_minutes: -inf"),
    ("name: a\ntrain: {horovod: {cycle_time_ms: .NaN}}\n", "train.horovod.cycle_time_ms: nan"),
    ('name: a\noutput_dir: ""\n', "job.yaml: output_dir: must not be empty"),
    ("name: a\noutput_dir: 'runs x'\n", "job.yaml: output_dir: 'runs x' is not valid"),
    ("name: a\noutput_dir: 'runs/%u'\n", "output_dir: 'runs/%u' is not valid"),
    ("name: a\noutput_dir: -runs\n", "output_dir: '-runs' is not valid"),
    ("name: a\nenv: {SHELLOPTS: xtrace}\n", "job.yaml: env.SHELLOPTS: SHELLOPTS belongs to the shell"),
    ("name: a\nenv: {BASHOPTS: x}\n", "env.BASHOPTS: BASHOPTS belongs to the shell"),
    ("name: a\nenv: {UID: '0'}\n", "env.UID: UID belongs to the shell"),
    ("name: a\nenv: {BASH_ENV: /tmp/x}\n", "env.BASH_ENV: BASH_* variables belong to bash"),
    ("name: a\nenv: {SLURM_JOB_ID: '1'}\n", "env.SLURM_JOB_ID: SLURM_* variables belong to Slurm"),
    ("name: a\nenv: {SBATCH_PARTITION: x}\n", "env.SBATCH_PARTITION: SBATCH_* variables belong"),
    ("name: a\nenv: {HPCSUITE_RUN_DIR: /x}\n", "env.HPCSUITE_RUN_DIR: HPCSUITE_* variables belong"),
    ("name: a\nenv: {RUN_DIR: /x}\n", "env.RUN_DIR: RUN_DIR is used by the rendered script"),
    ("name: a\nenv: {HOROVOD_CYCLE_TIME: '5'}\n",
     "env.HOROVOD_CYCLE_TIME: hpcsuite sets HOROVOD_CYCLE_TIME from train.horovod.cycle_time_ms"),
    ("name: a\nenv: {'A-B': x}\n", "env.A-B: not a valid environment variable name"),
    ("name: a\nenv: {A: yes}\n", "env.A: expected a string, got a boolean True (YAML reads yes/no"),
    ("name: a\ntemplate: ../../etc/passwd\n", "job.yaml: template: '../../etc/passwd' is not valid"),
    ("name: a\ntemplate: " + "t" * 300 + "\n", "job.yaml: template: 'tttt"),
    ("name: a\nresources: {partition: 'debug --qos=high'}\n", "resources.partition: 'debug --qos=high' is not valid"),
    ("name: a\nresources: {mem: '4G #'}\n", "resources.mem: '4G #' is not valid"),
    ("name: \"a'b\"\n", "job.yaml: name: \"a'b\" is not valid"),
    ("- a\n- b\n", "job.yaml: expected a mapping of keys, got a list"),
    ("name: a\n? [x]\n: 1\n", "job.yaml:2: a mapping key must be a plain value"),
    ("name: a\n" + "x: " + "[" * 100 + "]" * 100 + "\n", "job.yaml:2: nested more than 32 levels deep"),
    ("name: &a [*a]\n", "job.yaml: a value contains itself"),
])
def test_legal_yaml_that_is_wrong_is_refused(work, text, message):
    assert message in refused(work / "job.yaml", text)


def test_yaml_1_1_number_spellings_read_as_meant(work):
    (work / "job.yaml").write_text("name: a\ntrain: {lr: 1e-3, data: {samples: 1e4}}\n"
                                   "env: {A: 4, B: 1e-3, C: 0.50}\nresources: {mem: 4096}\n")
    result = cli("render", str(work / "job.yaml"), "--json")
    assert result.exit_code == 0, result.output
    import json

    script = json.loads(result.stdout)["script"]
    assert '"lr": 0.001' in script and '"samples": 10000' in script
    assert "export A=4\n" in script and "export B=1e-3\n" in script and "export C=0.50\n" in script
    assert "#SBATCH --mem=4096\n" in script


def test_duplicate_keys_in_a_site_profile_are_refused(work):
    (work / "site").mkdir()
    (work / "site" / "profile.yaml").write_text(
        "locked: [resources.partition]\ndefaults: {resources: {partition: a}}\nlocked: []\n")
    assert f"{work / 'site' / 'profile.yaml'}:3: duplicate key 'locked' (first on line 1)" in \
        refused(work / "job.yaml", "name: a\n")


def test_site_may_allow_no_time_limit(work):
    (work / "site").mkdir()
    (work / "site" / "profile.yaml").write_text("allow_unlimited_time: true\n")
    (work / "job.yaml").write_text("name: a\nresources: {time: '0'}\n")
    result = cli("render", str(work / "job.yaml"))
    assert result.exit_code == 0 and "#SBATCH --time=0\n" in result.output


def test_alias_bomb_is_refused_quickly_with_a_short_message(work):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    (work / "bomb.yaml").write_text("name: x\n" + "\n".join(lines) + "\n")
    # In a subprocess, with its memory capped at 400 MB: the bomb must not need it.
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (400 << 20, 400 << 20));"
            "from hpcsuite.cli import main; sys.argv = ['hpcsuite', 'render', 'bomb.yaml']; main()")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "HPCSUITE_SITE_DIR": str(work / "site")})
    assert time.monotonic() - t0 < 20
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: bomb.yaml: more than 20000 values once aliases are expanded")
    assert len(proc.stderr) < 300


def test_oversized_file_and_values_are_refused_with_a_short_quote(work):
    big = "name: a\n# " + "x" * (300 * 1024) + "\n"
    assert "job.yaml: larger than 256 KiB" in refused(work / "job.yaml", big)
    message = refused(work / "job.yaml", "name: a\nenv: {A: '" + "y" * 100_000 + "'}\n")
    assert message.startswith(f"{work / 'job.yaml'}: env.A: 'yyyy") and "(100000 characters) is longer than 4096" in message
    assert len(message) < 200
    message = refused(work / "job.yaml", "name: a\nenv: {" + "Z" * 900 + ": x}\n")
    assert len(message) < 300 and "a key must be text of at most 64 characters" in message


@pytest.mark.parametrize("key, says", [("1E100", "the key 1e+100 is a number"),
                                        ("~", "a key is empty or null"),
                                        ("yes", "the key True is a boolean")])
def test_a_key_yaml_reads_as_no_text_is_refused_at_its_mapping(work, key, says):
    for body in (f"name: a\nenv:\n  {key}: x\n",
                 f"name: a\ntrain:\n  data:\n    kind: synthetic\n    args:\n      n: {{{key}: 1}}\n"):
        message = refused(work / "job.yaml", body)
        where = "env" if "env" in body else "train.data.args.n"
        assert message == f"{work / 'job.yaml'}: {where}: {says}: keys must be text" + \
            ("" if key == "~" else " (put it in quotes)"), message


def test_non_utf8_and_unreadable_specs(work):
    assert refused(work / "job.yaml", b"name: \xff\xfe\n") == f"{work / 'job.yaml'}: not UTF-8 text"
    result = cli("render", str(work / "nosuch.yaml"))
    assert result.exit_code == 2 and "nosuch.yaml: no such file" in result.output
    result = cli("render", str(work / ("n" * 300 + ".yaml")))
    assert result.exit_code == 2 and "File name too long" in result.output


def test_set_values_are_strict_too(work):
    (work / "job.yaml").write_text("name: a\n")
    for item, message in [("train.lr=.nan", "--set: train.lr: nan is not a finite number"),
                          ("env.SLURM_X=1", "--set: env.SLURM_X: SLURM_* variables"),
                          ("output_dir=", "--set: output_dir: must not be empty"),
                          ("resources.partition=a b", "--set: resources.partition: 'a b' is not valid")]:
        result = cli("render", str(work / "job.yaml"), "--set", item)
        assert result.exit_code == 2 and message in result.output, (item, result.output)
    result = cli("render", str(work / "job.yaml"), "--set", "resources.time=10:00",
                 "--set", "train.lr=1e-3")
    assert result.exit_code == 0, result.output
    assert "#SBATCH --time=10:00\n" in result.output and '"lr": 0.001' in result.output


# ---------------------------------------------------------------------- templates

def project_template(work, text, name="horovod"):
    d = work / ".hpcsuite" / "templates"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.sbatch.j2"
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return path


@pytest.mark.parametrize("body, message", [
    ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
    ("{{ 'a' + 1 }}", "TypeError"),
    ("{{ nope }}", "undefined variable: 'nope' is undefined"),
    ("{{ job.__class__ }}", "not allowed in a template: access to attribute '__class__'"),
    ("{{ job.__class__.__mro__[1].__subclasses__() }}", "not allowed in a template"),
    ("{{ cycler.__init__.__globals__.os.system('touch CANARY') }}", "not allowed in a template"),
    ("{{ modules.append('x') }}", "not allowed in a template"),
    ("{{ job.to_dict.__globals__ }}", "not allowed in a template"),
    ("{% include '../../../etc/passwd' %}", "template not found"),
    ("{% extends 'nosuch.sbatch.j2' %}", "template not found: 'nosuch.sbatch.j2'"),
    ("{% if %}", "template syntax error"),
])
def test_template_errors_are_one_line_with_file_and_line(work, body, message):
    path = project_template(work, "#!/bin/bash\n#SBATCH --job-name=x\n" + body + "\n")
    text = refused(work / "job.yaml", "name: a\n")
    assert text.startswith(f"{path}:"), text
    assert message in text, text
    assert not (work / "CANARY").exists()


def test_template_that_is_not_utf8(work):
    path = project_template(work, b"#!/bin/bash\n\xff\xfe\n")
    assert refused(work / "job.yaml", "name: a\n") == f"{path}: not UTF-8 text"


def test_template_name_too_long_or_escaping(work):
    for name in ["a" * 300, "../x", "/etc/passwd", ".hidden"]:
        for args in (["templates", "which", name], ["templates", "show", name],
                     ["templates", "eject", name]):
            result = cli(*args)
            assert result.exit_code == 2 and "template name" in result.output, (args, result.output)
    (work / "job.yaml").write_text("name: a\n")
    result = cli("render", str(work / "job.yaml"), "--template-dir", "d" * 5000)
    assert result.exit_code == 2 and "not a usable file name" in result.output
    result = cli("render", str(work / "job.yaml"), "--template-dir", "d" * 300)
    assert result.exit_code == 2 and "File name too long" in result.output


def test_validate_reports_a_broken_template_with_file_and_line(work):
    d = work / "tpl"
    d.mkdir()
    (d / "broken.sbatch.j2").write_text("#!/bin/bash\n{{ 1 // 0 }}\n")
    result = cli("templates", "validate", str(d), "--profile", PROFILE)
    assert result.exit_code == 2
    assert f"{d / 'broken.sbatch.j2'}:2: ZeroDivisionError" in result.output


def test_eject_into_unwritable_directory(work):
    target = work / "ro"
    target.mkdir()
    os.chmod(target, 0o500)
    if os.access(target, os.W_OK):   # root ignores permissions; a file in the way does not
        os.chmod(target, 0o700)
        (work / "file").write_text("")
        target = work / "file" / "sub"
    result = cli("templates", "eject", "horovod", "--to", str(target))
    assert result.exit_code == 2 and result.output.startswith("error: "), result.output
    assert "cannot write the template" in result.output and len(result.output.splitlines()) == 1


def test_eject_force_never_writes_through_a_symlink(work):
    victim = work / "victim.txt"
    victim.write_text("precious\n")
    d = work / "t"
    d.mkdir()
    (d / "horovod.sbatch.j2").symlink_to(victim)
    result = cli("templates", "eject", "horovod", "--to", str(d))
    assert result.exit_code == 2 and "already exists" in result.output
    result = cli("templates", "eject", "horovod", "--to", str(d), "--force")
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "precious\n"
    assert not (d / "horovod.sbatch.j2").is_symlink()
    assert "#SBATCH --job-name" in (d / "horovod.sbatch.j2").read_text()
    # A dangling link is not followed either.
    (d / "horovod.sbatch.j2").unlink()
    (d / "horovod.sbatch.j2").symlink_to(work / "elsewhere.txt")
    assert cli("templates", "eject", "horovod", "--to", str(d), "--force").exit_code == 0
    assert not (work / "elsewhere.txt").exists()


def test_unexpected_errors_are_one_line_not_a_traceback(work, monkeypatch):
    import hpcsuite.submit.plan

    def broken(*a, **k):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(hpcsuite.submit.plan, "plan", broken)
    (work / "job.yaml").write_text("name: a\n")
    result = cli("render", str(work / "job.yaml"))
    assert result.exit_code == 70
    assert result.output.startswith("error: internal error in hpcsuite (RuntimeError: simulated bug)")
    assert "Traceback" not in result.output


def allow_in_templates(work, option):
    """A site profile that lets a project's template add ``--option``."""
    (work / "site").mkdir(exist_ok=True)
    (work / "site" / "profile.yaml").write_text(f"sbatch_allowed: [{option}]\n")


@pytest.mark.parametrize("line", [
    "#SBATCH --wckey={{ job.env.NOTE }}",
    "#SBATCH --wckey=x{{ job.env.NOTE }}",
    "#SBATCH {{ job.env.NOTE }}",
    "{{ job.env.NOTE }}",
])
def test_a_value_that_needs_quoting_never_reaches_an_sbatch_line(work, line):
    """Shell quoting protects the body, not the header: a template that puts a value into an
    #SBATCH line gets it only if sbatch would read it as one plain word."""
    allow_in_templates(work, "wckey")
    project_template(work, '{% extends "builtin/horovod.sbatch.j2" %}\n'
                           "{% block sbatch %}" + line + "\n{{ super() }}{% endblock %}\n")
    evil = "\\'' --partition=other #'"
    (work / "job.yaml").write_text(f"name: a\nenv: {{NOTE: \"{evil}\"}}\n".replace("\\", "\\\\"))
    result = cli("render", str(work / "job.yaml"))
    if line.startswith("#SBATCH"):
        assert result.exit_code == 2, result.output
        assert "in an #SBATCH line holds" in result.output
        assert "sbatch reads its header with its own tokeniser" in result.output
    else:
        # On its own line the quoted value is a shell command: the header has ended there.
        assert result.exit_code == 0, result.output
        from hpcsuite.submit.sbatch_header import parse_header

        assert [o.name for o in parse_header(result.output)] == []
    if "--wckey" in line:
        (work / "job.yaml").write_text("name: a\nenv: {NOTE: plain-word_1.0}\n")
        result = cli("render", str(work / "job.yaml"))
        assert result.exit_code == 0 and "plain-word_1.0\n" in result.output


def test_literal_header_lines_of_a_parent_block_stay_literal(work):
    allow_in_templates(work, "wckey")
    project_template(work, '{% extends "builtin/horovod.sbatch.j2" %}\n'
                           "{% block sbatch %}{{ super() }}#SBATCH --wckey=\"site note\"\n"
                           "{% endblock %}\n")
    (work / "job.yaml").write_text("name: a\ntrain: {preemption: {requeue: true}, "
                                   "checkpoint: {every_steps: 5}}\n")
    result = cli("render", str(work / "job.yaml"))
    assert result.exit_code == 0, result.output
    assert "#SBATCH --requeue\n" in result.output


# ---------------------------------------------------------------------- sweep files
SWEEP_BASE = "name: a\nresources: {partition: debug}\n"


@pytest.mark.parametrize("axes, message", [
    # a value that would inject an option or a command reaches no script: env is in the body,
    # so every element must render the same one and this axis is refused
    ('{env.NOTE: ["x", "\\\\\'\' --partition=other #\'"]}', "axes.env.NOTE: element 1"),
    ("{resources.extra_sbatch.array: ['0-999']}",
     "elements[0].resources.extra_sbatch.array: --array is not an sbatch option this site allows"),
    ("{resources.partition: [debug, other]}", "elements[1].resources.partition: unknown partition"),
    ("{resources.partition: [debug, cpu]}", "axes.resources.partition: element 1"),
    ("{'train.lr; touch CANARY': [1]}", "axes.'train.lr; touch CANARY': not a dotted job key"),
    ('{train.checkpoint.dir: ["x\\n#SBATCH -p other"]}', "newline and NUL characters are not allowed"),
    ("{train.lr: [1e400]}", "not a finite number"),
    ("{train.seed: [4294967296]}", "elements[0].train.seed: 4294967296 is above the maximum"),
    ("{train.model: ['$(touch CANARY)']}", "elements[0].train.model: '$(touch CANARY)' is not valid"),
    ("{train.lr: *x}", "sweep.yaml:4: "),
])
def test_hostile_sweep_files_are_refused_in_one_line(work, axes, message):
    (work / "job.yaml").write_text(SWEEP_BASE)
    path = work / "sweep.yaml"
    path.write_text(f"name: s\nbase: job.yaml\n# axes\naxes: {axes}\n")
    result = cli("sweep", "run", str(path), "--dry-run", "--profile", PROFILE)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), lines
    assert message in lines[0], lines[0]
    assert not list(work.rglob("CANARY")) and not (work / "sweeps").exists()


def test_a_hostile_value_that_only_reaches_job_json_stays_there(work):
    """Free text an element's job.json holds (a checkpoint directory) is the same script for
    every element, and the array's script never spells it."""
    (work / "job.yaml").write_text(SWEEP_BASE)
    path = work / "sweep.yaml"
    evil = ["$(touch CANARY)", "x #SBATCH --partition=other", "' ; touch CANARY '"]
    path.write_text("name: s\nbase: job.yaml\naxes:\n  train.checkpoint.dir:\n"
                    + "".join(f"  - {json.dumps(v)}\n" for v in evil))
    result = cli("sweep", "run", str(path), "--dry-run", "--json", "--profile", PROFILE)
    assert result.exit_code == 0, result.output
    planned = json.loads(result.output[result.output.index("{"):])
    assert all("CANARY" not in line for line in planned["script"].splitlines())
    from hpcsuite.submit.sbatch_header import parse_header

    assert {o.name: o.value for o in parse_header(planned["script"])}["partition"] == "debug"
    assert [e["values"]["train.checkpoint.dir"] for e in planned["elements"]] == evil
