"""Open MPI's shared memory where Slurm nodes share a host (runtime/rank/shm.py), and the site
profile key that asks for it (mpi.nodes_share_host)."""

import os

import pytest

from hpcsuite.runtime.rank import shm
from hpcsuite.site.slurm_conf import render_profile
from hpcsuite.submit.plan import plan
from hpcsuite.submit.site_profile import Mpi, SiteProfile
from hpcsuite.submit.spec import spec_from_dict
from hpcsuite.submit.templating import SearchPath


def test_each_node_of_a_job_gets_its_own_directory(tmp_path):
    env = {shm.ENV: str(tmp_path), "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node1"}
    line = shm.private_shm(env)
    mine = tmp_path / f"hpcsuite-{os.getuid()}-42-node1"
    assert env[shm.BACKING] == str(mine) and mine.is_dir() and str(mine) in line
    other = dict(env, SLURMD_NODENAME="node2")
    del other[shm.BACKING]
    shm.private_shm(other)
    assert other[shm.BACKING] != env[shm.BACKING]
    shm.remove_private_shm(env)
    assert not mine.exists()


def test_nothing_changes_unless_asked_or_when_the_user_chose(tmp_path):
    env = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node1"}
    assert shm.private_shm(env) is None and shm.BACKING not in env
    chosen = {shm.ENV: str(tmp_path), shm.BACKING: "/scratch/mine"}
    assert shm.private_shm(chosen) is None and chosen[shm.BACKING] == "/scratch/mine"
    shm.remove_private_shm(chosen)            # never removes a directory it did not make


def test_a_directory_still_holding_a_segment_is_kept(tmp_path):
    env = {shm.ENV: str(tmp_path), "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n"}
    shm.private_shm(env)
    (tmp_path / f"hpcsuite-{os.getuid()}-7-n" / "vader_segment.h.1.0").write_text("")
    shm.remove_private_shm(env)
    assert (tmp_path / f"hpcsuite-{os.getuid()}-7-n").is_dir()


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_only_a_site_whose_nodes_share_a_host_exports_it(launcher):
    job = spec_from_dict({"name": "x", "launcher": launcher}, "t")
    real = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    assert shm.ENV not in real
    local = SiteProfile(python="python3", mpi=Mpi(nodes_share_host=True))
    script = plan(job, local, SearchPath.builtin_only()).script
    assert f"export {shm.ENV}=/dev/shm" in script.splitlines()
    if launcher == "mpirun":
        assert f"-x {shm.ENV}" in [l for l in script.splitlines() if l.startswith("mpirun ")][0]


def test_the_local_cluster_says_its_nodes_share_a_host():
    assert "nodes_share_host: true" in render_profile() and "nodes_share_host: true" in \
        render_profile(gpus=2)
