"""The local cluster on another MPI (the Debian 13 tier: Open MPI 5): `cluster up` writes the
MPI on PATH into its profile (mpi.flavour), and Open MPI 5 ranks on nodes that share a host pair
their interfaces with the weighted reachability. End to end: tests/test_e2e_debian13.py."""

import pytest

from hpcsuite.site.horovod_mpi import flavour_on_path
from hpcsuite.site.slurm_conf import render_profile
from hpcsuite.submit.plan import plan
from hpcsuite.submit.config import load_profile_layer
from hpcsuite.submit.site_profile import Mpi, SiteProfile
from hpcsuite.submit.spec import spec_from_dict
from hpcsuite.submit.strict_yaml import load
from hpcsuite.submit.templating import SearchPath


def fake_mpirun(tmp_path, says: str) -> dict:
    """PATH with only an `mpirun` that prints ``says`` for --version."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mpirun = bin_dir / "mpirun"
    mpirun.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in says.splitlines()))
    mpirun.chmod(0o755)
    return {"PATH": str(bin_dir)}


@pytest.mark.parametrize("says, flavour", [
    ("mpirun (Open MPI) 5.0.7\n\nReport bugs to https://www.open-mpi.org/community/help/", "openmpi5"),
    ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/", None),
    ("HYDRA build details:\n    Version:                                 4.0.2", None),
    ("something else entirely", None),
])
def test_the_mpi_on_path_names_the_flavour_the_cluster_profile_says(tmp_path, says, flavour):
    assert flavour_on_path(fake_mpirun(tmp_path, says)) == flavour


def test_no_mpi_on_path_leaves_the_default(tmp_path):
    assert flavour_on_path({"PATH": str(tmp_path)}) is None


def test_the_cluster_profile_says_open_mpi_5_only_when_it_is_there(tmp_path):
    assert "flavour" not in render_profile()          # Open MPI 4: the default, unchanged
    path = tmp_path / "profile.yaml"
    path.write_text(render_profile(2, "openmpi5"))
    load_profile_layer("site", str(path))                # every key valid
    mpi = load(path.read_text())["mpi"]
    assert mpi["flavour"] == "openmpi5" and mpi["nodes_share_host"] is True


def job():
    return spec_from_dict({"name": "x", "resources": {"nodes": 2, "tasks_per_node": 1}}, "t")


def exports(text):
    return dict(l[len("export "):].split("=", 1) for l in text.splitlines() if l.startswith("export "))


@pytest.mark.parametrize("flavour, share, mca, expect", [
    ("openmpi5", True, {}, "weighted"),
    ("openmpi5", True, {"reachable": "netlink"}, None),   # the site's choice stands
    ("openmpi5", False, {}, None),                         # one slurmd per host: netlink's
    ("openmpi", True, {}, None),                           # 4.1 pairs them already
])
def test_open_mpi_5_on_nodes_sharing_a_host_pairs_interfaces_by_weight(flavour, share, mca, expect):
    mpi = Mpi(flavour=flavour, nodes_share_host=share, mca={"pml": "ob1", **mca})
    text = plan(job(), SiteProfile(python="python3", mpi=mpi), SearchPath.builtin_only()).script
    assert exports(text).get("OMPI_MCA_reachable") == expect
    if expect:
        assert "-x OMPI_MCA_reachable" in text            # mpirun hands it to every rank
