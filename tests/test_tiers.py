"""tests/tiers.py: which tier a test runs in, and an entry that names no test is refused."""

import tiers


def test_an_entry_names_a_file_a_function_or_one_case():
    assert tiers.matches("tests/a.py::test_x[srun]", "tests/a.py::test_x")
    assert tiers.matches("tests/a.py::test_x[srun]", "tests/a.py::test_x[srun]")
    assert tiers.matches("tests/a.py::test_x", "tests/a.py")
    assert not tiers.matches("tests/a.py::test_x[mpirun]", "tests/a.py::test_x[srun]")
    assert not tiers.matches("tests/a.py::test_xy", "tests/a.py::test_x")


def test_every_repeat_says_which_test_keeps_it_in_ci_and_fast_is_never_full():
    assert all(isinstance(why, str) and why for why in tiers.FULL.values())
    assert not set(tiers.FAST) & set(tiers.FULL)


def test_a_renamed_test_makes_its_entry_stale(monkeypatch):
    monkeypatch.setattr(tiers, "FULL", {"tests/a.py::test_gone[srun]": "test_x"})
    monkeypatch.setattr(tiers, "FAST", ("tests/b.py::test_y",))
    ids = ["tests/a.py::test_x[srun]", "tests/b.py::test_y", "tests/c.py::test_z"]
    assert tiers.stale(ids) == ["tests/a.py::test_gone[srun]"]
    # a file not collected (a run of one file) says nothing of its entries
    assert tiers.stale(["tests/b.py::test_y"]) == []
    assert tiers.tier_of("tests/b.py::test_y") == {"fast"}
    assert tiers.tier_of("tests/c.py::test_z") == set()
