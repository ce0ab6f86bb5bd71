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
