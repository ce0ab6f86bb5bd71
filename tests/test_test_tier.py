"""scripts/test_tier.sh, the stages `make test` and CI run: a failure fails the run, "no tests
ran" fails it, pytest's summary line is printed and each stage's time is listed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def tier(pytest_args: str) -> tuple[int, str]:
    env = dict(os.environ, PYTEST_ARGS=f"{pytest_args} -p no:cacheprovider",
               VENV=str(Path(sys.executable).parent.parent))
    proc = subprocess.run(["bash", "scripts/test_tier.sh", "fast"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def tests_dir(tmp_path):
    (tmp_path / "test_passes.py").write_text("def test_passes():\n    assert 1 + 1 == 2\n")
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert 1 + 1 == 3\n")
    return tmp_path


def test_a_passing_unit_test_passes_with_its_summary_and_stage_times(tests_dir):
    rc, out = tier(str(tests_dir / "test_passes.py"))
    assert rc == 0, out
    assert "1 passed" in out and "==== fast tier, stage times:" in out
    assert "  unit " in out and "  e2e " in out          # the e2e stage had none: exit 5, no fail


def test_a_failing_unit_test_fails_the_run_before_the_e2e_stage(tests_dir):
    rc, out = tier(str(tests_dir / "test_fails.py"))
    assert rc == 1, out
    assert "1 failed" in out and "the unit stage failed: the end-to-end stages do not run" in out
    assert "  e2e " not in out


def test_no_tests_ran_fails_the_run(tests_dir):
    rc, out = tier(f"{tests_dir / 'test_passes.py'} -k nosuchtest")
    assert rc == 1, out
    assert "==== no stage ran a test" in out
