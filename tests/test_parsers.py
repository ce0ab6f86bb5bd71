"""Pure parsers of Slurm command output."""

import pytest

from hpcsuite import slurm
from hpcsuite.errors import UserError


def test_sbatch_parsable():
    assert slurm.parse_sbatch_parsable("123\n") == "123"
    assert slurm.parse_sbatch_parsable("123;cluster\n") == "123"
    with pytest.raises(UserError):
        slurm.parse_sbatch_parsable("Submitted batch job\n")


def test_scontrol_record_with_spaces_in_values():
    rec = slurm.parse_scontrol_record(
        "JobId=5 JobName=a b JobState=COMPLETED Reason=None ExitCode=0:0 "
        "StdOut=/x y/slurm-5.out Command=/bin/true")
    assert rec["JobName"] == "a b" and rec["StdOut"] == "/x y/slurm-5.out"
    assert rec["JobState"] == "COMPLETED"


def test_sinfo_nodes():
    assert slurm.parse_sinfo_nodes("node1 idle\nnode2 down*\n") == {"node1": "idle", "node2": "down"}


def test_missing_program_is_user_error():
    with pytest.raises(UserError, match="command not found"):
        slurm.call(["hpcsuite-no-such-program"], env={})
