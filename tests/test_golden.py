"""sbatch/ is the golden record of the templates: every example spec beside its script."""

from hpcsuite.submit.golden import example_specs, expected_scripts

from conftest import SBATCH


def test_examples_exist():
    assert any(p.stem == "quickstart" for p in example_specs(SBATCH))


def test_scripts_match_their_specs():
    stale = []
    for path, text in expected_scripts(SBATCH).items():
        if not path.exists() or path.read_text() != text:
            stale.append(path.name)
    assert not stale, (f"sbatch/ scripts out of date with their specs or the templates: {stale}. "
                       "Regenerate with `make golden` and review the diff.")


def test_job_json_is_renamed_into_place_never_rewritten_where_status_reads_it():
    """A requeued attempt runs the batch script again while `hpcsuite status` may read the
    run directory's job.json: a script that truncated it in place let status read an empty
    file (CI, stop 29). Every script writes it beside and renames it in."""
    import re
    from hpcsuite.runs.rundir import JOB, SHELL_PID, staged_name

    scripts = expected_scripts(SBATCH)
    assert scripts
    target = re.compile(r'(>|cp\s.*)\s*"\$RUN_DIR/' + re.escape(JOB) + '"')
    staged = f'"$RUN_DIR/{staged_name(JOB, SHELL_PID)}"'
    for path, text in scripts.items():
        assert not target.search(text), f"{path.name} writes $RUN_DIR/{JOB} in place"
        assert f'mv -f {staged} "$RUN_DIR/{JOB}"\n' in text, path.name
