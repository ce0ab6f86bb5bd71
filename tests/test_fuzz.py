"""Property-based fuzzing (hypothesis) of job specs, site profiles, templates' inputs,
command-line values and sweep files: no traceback, no hang, every refusal exit 2 naming file and key, and
every accepted script exactly as safe as its inputs (see tests/fuzzing.py).

At least 1,000 cases per kind; HPCSUITE_FUZZ_EXAMPLES raises (or, for a quick local run,
lowers) the number. The examples are derandomised so CI sees the same cases every run;
bench/fuzz_counts.py runs fresh random ones and prints the counts.
"""

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from fuzzing import KINDS

EXAMPLES = int(os.environ.get("HPCSUITE_FUZZ_EXAMPLES", "1000"))


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch):
    for name in ("HPCSUITE_SITE_DIR", "HPCSUITE_PROFILE", "SLURM_CONF"):
        monkeypatch.delenv(name, raising=False)


def make_test(kind: str):
    strategy, run = KINDS[kind]
    work = Path(tempfile.mkdtemp(prefix="hpcsuite-fuzz-"))

    @pytest.mark.timeout(1800)
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def test(case):
        outcome, detail = run(case, work)
        assert outcome in ("accepted", "refused"), f"{outcome}: {detail}\ncase: {case!r}"[:6000]

    test.__name__ = f"test_fuzz_{kind.replace(' ', '_').replace('-', '_')}"
    return test


test_fuzz_job_specs = make_test("job specs")
test_fuzz_site_profiles = make_test("site profiles")
test_fuzz_template_inputs = make_test("template inputs")
test_fuzz_command_line_values = make_test("command-line values")
test_fuzz_sweep_files = make_test("sweep files")
