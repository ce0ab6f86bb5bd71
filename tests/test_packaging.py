"""What a site installs from packaging/: the container definitions (no Docker or Apptainer here:
their syntax, and that the shell they run parses), the module files (loaded by Environment
Modules and by Lmod for real), and hpcsuite-build-horovod's key and bad input."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import REPO

PACKAGING = REPO / "packaging"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
WHEEL = f"hpcsuite-{VERSION}-py3-none-any.whl"


# ------------------------------------------------------------------ Apptainer's .def

# Apptainer's sections (its docs' "The Definition File"); the header's keys by bootstrap agent.
DEF_SECTIONS = {"setup", "files", "environment", "post", "runscript", "startscript", "test",
                "labels", "help", "arguments", "app*"}
SCRIPT_SECTIONS = {"setup", "environment", "post", "runscript", "startscript", "test"}
BOOTSTRAP_KEYS = {"docker": {"From"}, "library": {"From"}, "localimage": {"From"},
                  "debootstrap": {"OSVersion", "MirrorURL"}}


def parse_def(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(header, sections) of an Apptainer definition file; ValueError naming the line for what
    apptainer build would refuse (a header line that is no `Key: value`, an unknown or repeated
    section)."""
    header, sections, current = {}, {}, None
    for number, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^%(\w+)(\s.*)?$", line)
        if m:
            name = m.group(1)
            if name not in DEF_SECTIONS:
                raise ValueError(f"line {number}: unknown section %{name}")
            if name in sections:
                raise ValueError(f"line {number}: section %{name} twice")
            sections[name], current = "", name
        elif current is not None:
            sections[current] += line + "\n"
        elif line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition(":")
            if not sep or not key.strip().isidentifier() or not value.strip():
                raise ValueError(f"line {number}: a header line is `Key: value`, not {line!r}")
            header[key.strip()] = value.strip()
    return header, sections


def test_apptainer_def_parses_and_its_scripts_are_shell():
    header, sections = parse_def((PACKAGING / "apptainer" / "hpcsuite.def").read_text())
    agent = header["Bootstrap"]
    assert agent in BOOTSTRAP_KEYS and BOOTSTRAP_KEYS[agent] <= set(header), header
    assert {"files", "post", "environment", "test", "runscript"} <= set(sections)
    for name in SCRIPT_SECTIONS & set(sections):
        # apptainer runs these with /bin/sh: dash parses them here
        done = subprocess.run(["sh", "-n"], input=sections[name], text=True, capture_output=True)
        assert done.returncode == 0, f"%{name}: {done.stderr}"
    files = [line.split() for line in sections["files"].splitlines() if line.strip()]
    assert all(len(pair) == 2 for pair in files), files
    # the wheel it copies is the one `pip wheel` builds from this version
    assert [src for src, _ in files] == [f"dist/{WHEEL}"]
    assert "hpcsuite-build-horovod" in sections["post"]


@pytest.mark.parametrize("bad, why", [
    ("Bootstrap docker\n", "a header line is `Key: value`"),
    ("Bootstrap: docker\nFrom: x\n%post\ntrue\n%post\ntrue\n", "section %post twice"),
    ("Bootstrap: docker\nFrom: x\n%postt\ntrue\n", "unknown section %postt"),
])
def test_the_def_parser_refuses_what_apptainer_refuses(bad, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_def(bad)


# ------------------------------------------------------------------ the Dockerfile

DOCKER_INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                       "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK",
                       "SHELL"}


def test_dockerfile_parses_and_its_runs_are_shell():
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(fileobj=open(PACKAGING / "docker" / "Dockerfile", "rb"))
    structure = [i for i in parser.structure if i["instruction"] != "COMMENT"]
    instructions = [i["instruction"] for i in structure]
    assert set(instructions) <= DOCKER_INSTRUCTIONS, instructions
    # only ARGs before the first FROM, and one stage
    assert instructions[:instructions.index("FROM")] == ["ARG"] * instructions.index("FROM")
    assert instructions.count("FROM") == 1
    assert parser.baseimage == "debian:bookworm-slim"     # the ARG's default, resolved
    runs = [i["value"] for i in structure if i["instruction"] == "RUN"]
    for run in runs:
        done = subprocess.run(["sh", "-n"], input=run, text=True, capture_output=True)
        assert done.returncode == 0, f"RUN {run}: {done.stderr}"
    copies = [i["value"].split() for i in structure if i["instruction"] == "COPY"]
    assert copies == [["dist/hpcsuite-*.whl", "/tmp/wheels/"]]
    assert any("hpcsuite-build-horovod" in run for run in runs)


def test_the_images_build_horovod_with_an_entry_point_the_wheel_has():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["hpcsuite-build-horovod"] == "hpcsuite.site.build_horovod:main"
    shipped = REPO / "hpcsuite" / "site" / "build_horovod.sh"
    assert shipped.read_bytes() == (REPO / "scripts" / "build_horovod.sh").read_bytes()


# ------------------------------------------------------------------ the module files

def site_copy(tmp_path, name, root, pattern):
    """The shipped module file as a site installs it: copied under MODULEPATH/hpcsuite/, its
    one `root` line set."""
    shipped = PACKAGING / "modulefiles" / "hpcsuite" / name
    text, n = re.subn(pattern, lambda m: m.group(1) + str(root) + m.group(2), shipped.read_text(),
                      flags=re.M)
    assert n == 1, f"{shipped}: no single root line"
    target = tmp_path / "modulefiles" / "hpcsuite" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return tmp_path / "modulefiles"


def shell(script, **env):
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"], **env})


VENV_ROOT = Path(sys.prefix)      # a venv with bin/hpcsuite: this one


def test_environment_modules_loads_the_tcl_module_file(tmp_path):
    init = Path("/usr/share/modules/init/bash")
    assert init.is_file(), "Environment Modules is missing: scripts/setup.sh installs environment-modules"
    path = site_copy(tmp_path, VERSION, VENV_ROOT, r"^(set root ).*()$")
    done = shell(f"source {init}; module use {path}; module load hpcsuite && command -v hpcsuite"
                 " && hpcsuite --version && module unload hpcsuite && command -v hpcsuite || echo gone")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(VENV_ROOT / "bin" / "hpcsuite"),
                                        f"hpcsuite, version {VERSION}", "gone"]
    path = site_copy(tmp_path, VERSION, "/nowhere", r"^(set root ).*()$")
    done = shell(f"source {init}; module use {path}; module load hpcsuite")
    assert done.returncode != 0
    assert (f"hpcsuite module: /nowhere/bin/hpcsuite is missing; set root in "
            f"{path}/hpcsuite/{VERSION} to the venv") in done.stderr


LMOD = Path(os.environ.get("HPCSUITE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME")
                                                     or Path.home() / ".cache") / "hpcsuite") / "lmod"


def test_lmod_loads_the_lua_module_file(tmp_path):
    lmod = LMOD / "usr" / "share" / "lmod" / "lmod" / "libexec" / "lmod"
    assert lmod.is_file(), f"no Lmod at {lmod}: scripts/setup.sh unpacks Debian's lmod there"
    name = f"{VERSION}.lua"
    path = site_copy(tmp_path, name, VENV_ROOT, r'^(local root = ").*(")$')
    done = shell(f'eval "$(lua5.3 {lmod} bash load hpcsuite)" && command -v hpcsuite',
                 MODULEPATH=str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(VENV_ROOT / "bin" / "hpcsuite")], done.stderr
    path = site_copy(tmp_path, name, "/nowhere", r'^(local root = ").*(")$')
    done = shell(f'eval "$(lua5.3 {lmod} bash load hpcsuite)"; command -v hpcsuite || echo none',
                 MODULEPATH=str(path))
    assert done.stdout.strip() == "none"
    assert "hpcsuite module: /nowhere/bin/hpcsuite is" in " ".join(done.stderr.split())
