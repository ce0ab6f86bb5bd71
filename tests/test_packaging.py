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


# ------------------------------------------------------------------ docs/admin/install.md's steps
# The page's own lines, run here: its venv path is this venv, its /apps/modulefiles a tmp dir,
# and its MPI modules stand-ins that set FAKE_MPI.

INSTALL = REPO / "docs" / "admin" / "install.md"


def install_block(needle: str) -> str:
    """The one shell block of install.md that holds ``needle``."""
    import docblocks

    found = [b.text for b in docblocks.blocks([INSTALL])
             if b.lang in ("bash", "sh") and needle in b.text]
    assert len(found) == 1, f"{INSTALL}: {len(found)} shell blocks hold {needle!r}"
    return found[0]


def fake_mpis(tmp_path) -> Path:
    """openmpi/4.1 and openmpi/5.0 for both module systems, each setting FAKE_MPI."""
    mpi = tmp_path / "mpi" / "openmpi"
    mpi.mkdir(parents=True)
    for version in ("4.1", "5.0"):
        (mpi / version).write_text(f"#%Module1.0\nsetenv FAKE_MPI {version}\n")
        (mpi / f"{version}.lua").write_text(f'setenv("FAKE_MPI", "{version}")\n')
    return mpi.parent


def install_modules_as_the_page_says(tmp_path) -> tuple[Path, list[tuple[str, str]]]:
    """MODULEPATH/hpcsuite/ made by the page's blocks (module files, .version, HPCSUITE_SITE_DIR),
    once for each MPI its venv block names; (that MODULEPATH directory, the (MPI, module) pairs)."""
    venv = install_block("MPI_MODULE=")
    pairs = re.findall(r"MPI=(\S+) MPI_MODULE=(\S+)", venv.splitlines()[0])
    assert len(pairs) == 2, venv.splitlines()[0]
    modules = tmp_path / "modulefiles"
    page_dir = "M=/apps/modulefiles/hpcsuite"
    copy = install_block("SHIPPED=")
    assert page_dir in copy
    copy = copy.replace(page_dir, f"M={modules}/hpcsuite")
    site_dir = [line for line in install_block("HPCSUITE_SITE_DIR").splitlines()
                if line.startswith("sed ")]
    assert len(site_dir) == 2, site_dir
    for mpi, module in pairs:
        script = (f"set -e\nMPI={mpi} MPI_MODULE={module}\nV={VENV_ROOT}\n{copy}"
                  + install_block("/.version") + "\n".join(site_dir) + "\n")
        done = shell(script)
        assert done.returncode == 0, done.stderr
    return modules, pairs


def changed_lines(shipped: Path, installed: Path) -> list[tuple[str, str]]:
    a, b = shipped.read_text().splitlines(), installed.read_text().splitlines()
    assert len(a) == len(b), installed
    return [(x, y) for x, y in zip(a, b) if x != y]


def test_install_md_makes_a_module_per_mpi_and_its_lines_change_only_what_they_say(tmp_path):
    modules, pairs = install_modules_as_the_page_says(tmp_path)
    shipped = PACKAGING / "modulefiles" / "hpcsuite"
    for mpi, module in pairs:
        tcl = changed_lines(shipped / VERSION, modules / "hpcsuite" / f"{VERSION}-{mpi}")
        assert [new for _, new in tcl] == [f"set root {VENV_ROOT}", f"prereq {module}",
                                           "setenv HPCSUITE_SITE_DIR $root/etc/hpcsuite"]
        lua = changed_lines(shipped / f"{VERSION}.lua", modules / "hpcsuite" / f"{VERSION}-{mpi}.lua")
        assert [new for _, new in lua] == [
            f'local root = "{VENV_ROOT}"', f'depends_on("{module}")',
            'setenv("HPCSUITE_SITE_DIR", pathJoin(root, "etc", "hpcsuite"))']


def test_environment_modules_loads_the_pages_default_and_each_mpis_module(tmp_path):
    modules, pairs = install_modules_as_the_page_says(tmp_path)
    (default, mpi_module), (other, other_module) = pairs
    init = Path("/usr/share/modules/init/bash")
    show = 'echo "$FAKE_MPI $HPCSUITE_SITE_DIR $_LMFILES_"; command -v hpcsuite'
    done = shell(f"source {init}; module use {fake_mpis(tmp_path)}; module use {modules}; "
                 f"module load hpcsuite; {show}; module purge; "
                 f"module load hpcsuite/{VERSION}-{other}; {show}")
    assert done.returncode == 0, done.stderr
    hpcsuite = str(VENV_ROOT / "bin" / "hpcsuite")
    site = VENV_ROOT / "etc" / "hpcsuite"
    mpi_file = tmp_path / "mpi"
    assert done.stdout.splitlines() == [
        f"{mpi_module.split('/')[1]} {site} {mpi_file / mpi_module}:{modules}/hpcsuite/{VERSION}-{default}",
        hpcsuite,
        f"{other_module.split('/')[1]} {site} {mpi_file / other_module}:{modules}/hpcsuite/{VERSION}-{other}",
        hpcsuite], done.stderr


def test_lmod_loads_the_pages_default_and_each_mpis_module(tmp_path):
    lmod = LMOD / "usr" / "share" / "lmod" / "lmod" / "libexec" / "lmod"
    assert lmod.is_file(), f"no Lmod at {lmod}: scripts/setup.sh unpacks Debian's lmod there"
    modules, pairs = install_modules_as_the_page_says(tmp_path)
    (default, mpi_module), (other, other_module) = pairs
    path = f"{fake_mpis(tmp_path)}:{modules}"
    for name, mpi, module in (("hpcsuite", default, mpi_module),
                              (f"hpcsuite/{VERSION}-{other}", other, other_module)):
        done = shell(f'eval "$(lua5.3 {lmod} bash load {name})" && '
                     'echo "$FAKE_MPI $HPCSUITE_SITE_DIR $_LMFILES_" && command -v hpcsuite',
                     MODULEPATH=path)
        assert done.returncode == 0, done.stderr
        # the .lua files, though the Tcl ones are beside them
        assert done.stdout.splitlines() == [
            f"{module.split('/')[1]} {VENV_ROOT / 'etc' / 'hpcsuite'} {tmp_path / 'mpi' / module}.lua:"
            f"{modules}/hpcsuite/{VERSION}-{mpi}.lua",
            str(VENV_ROOT / "bin" / "hpcsuite")], done.stderr


def test_install_md_profile_d_snippet_puts_the_modules_on_users_modulepath(tmp_path):
    snippet = install_block("/etc/profile.d/zz-hpcsuite.sh")
    assert "/apps/modulefiles" in snippet
    path = site_copy(tmp_path, VERSION, VENV_ROOT, r"^(set root ).*()$")
    (tmp_path / "zz-hpcsuite.sh").write_text(snippet.replace("/apps/modulefiles", str(path)))
    # a login shell (sh, as /etc/profile sources it) after Environment Modules' own script
    login = subprocess.run(["sh", "-c", f". /usr/share/modules/init/sh; . {tmp_path}/zz-hpcsuite.sh; "
                            "module load hpcsuite && command -v hpcsuite"],
                           capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"]})
    assert login.returncode == 0, login.stderr
    assert login.stdout.splitlines() == [str(VENV_ROOT / "bin" / "hpcsuite")]
    # a shell with no module system: the snippet says nothing and fails nothing
    bare = subprocess.run(["sh", "-c", f". {tmp_path}/zz-hpcsuite.sh"], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert (bare.returncode, bare.stdout, bare.stderr) == (0, "", "")


def test_install_md_site_profile_is_one_hpcsuite_reads(tmp_path):
    import docblocks
    from hpcsuite.submit.config import load_profile_layer

    profiles = [b for b in docblocks.blocks([INSTALL]) if b.lang == "yaml"
                and b.text.startswith("# /apps/hpcsuite/")]
    assert len(profiles) == 1, [b.where for b in profiles]
    target = tmp_path / "profile.yaml"
    target.write_text(profiles[0].text)
    layer = load_profile_layer("site", str(target))      # one ConfigError naming the key if not
    venv = profiles[0].text.splitlines()[0].split()[1].removesuffix("/etc/hpcsuite/profile.yaml")
    assert layer.profile["python"] == f"{venv}/bin/python"
