"""templates/, models/ and the module files reach users from a normal (non-editable) wheel
install."""

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

from conftest import REPO, SBATCH

import pytest


@pytest.mark.timeout(600)
def test_wheel_install_renders_like_the_source_tree(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(REPO)], check=True, timeout=300,
                   capture_output=True)
    wheel = next(dist.glob("hpcsuite-*.whl"))
    # the module files a site copies onto its MODULEPATH (docs/admin/install.md)
    modulefiles = sorted((REPO / "packaging" / "modulefiles" / "hpcsuite").iterdir())
    assert [m.name for m in modulefiles] and all(m.is_file() for m in modulefiles)
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [m.name for m in modulefiles
               if f"hpcsuite/site/modulefiles/hpcsuite/{m.name}" not in names]
    assert not missing, f"{wheel.name} lacks the module files {missing}"
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    str(wheel)], check=True, timeout=300, capture_output=True)
    work = tmp_path / "elsewhere"          # not the source tree: nothing imports from it
    work.mkdir()
    args = ["render", str(SBATCH / "quickstart.yaml"), "--profile", str(SBATCH / "profile.yaml")]
    installed = subprocess.run([str(env_dir / "bin" / "hpcsuite"), *args], cwd=work,
                               capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout == (SBATCH / "quickstart.sbatch").read_text()
    where = subprocess.run([str(py), "-c", "import hpcsuite.models, hpcsuite.submit.templating as t;"
                            "print(hpcsuite.models.__file__); print(t.builtin_dir())"],
                           cwd=work, capture_output=True, text=True, timeout=60, check=True)
    assert all(str(env_dir) in line for line in where.stdout.splitlines())
    assert "mlp" in subprocess.run([str(py), "-c", "import hpcsuite.models as m; print(m.MODELS)"],
                                   cwd=work, capture_output=True, text=True, check=True).stdout
    module = subprocess.run([str(py), "-m", "hpcsuite", "--version"], cwd=work,
                            capture_output=True, text=True, timeout=60)
    assert module.stdout.startswith("hpcsuite, version")
    # install.md's line that finds them in the venv
    import docblocks

    page = REPO / "docs" / "admin" / "install.md"
    line = next(line for b in docblocks.blocks([page]) for line in b.text.splitlines()
                if line.startswith("SHIPPED="))
    found = subprocess.run(["bash", "-c", f'V={env_dir}; {line}; echo "$SHIPPED"'], cwd=work,
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    shipped = Path(found.stdout.strip())
    assert shipped.is_relative_to(env_dir), shipped
    assert [(m.name, m.read_bytes()) for m in modulefiles] == \
        [(m.name, (shipped / m.name).read_bytes()) for m in modulefiles]
