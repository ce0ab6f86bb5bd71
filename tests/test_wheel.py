"""templates/ and models/ reach users from a normal (non-editable) wheel install."""

import subprocess
import sys
import venv

from conftest import REPO, SBATCH

import pytest


@pytest.mark.timeout(600)
def test_wheel_install_renders_like_the_source_tree(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(REPO)], check=True, timeout=300,
                   capture_output=True)
    wheel = next(dist.glob("hpcsuite-*.whl"))
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
