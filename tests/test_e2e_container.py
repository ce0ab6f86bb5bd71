"""End to end through a real container runtime: Charliecloud's ch-run (Debian's
charliecloud-runtime, installed by scripts/setup.sh) starts both ranks of a 2-node job on the
local Slurm cluster, under the host's mpirun.

The image is synthetic: a directory with its own marker file and mount points, into which the
host's userland (/usr, the Python and the venv) is bound by the site profile, since nothing can
be pulled from a registry here. So this proves the wiring, not an image's contents: mpirun's
daemons start ch-run on each node, each rank runs in its own user and mount namespace (the
image's root, the image's marker), joins the host's MPI (allreduce across the two nodes), sees
the job's environment, and writes its results and checkpoints into the bound run root, from a
submit directory that is reachable only through its bind (it is not under /tmp, which ch-run
shares by default).
"""

import json
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, submit_spec as submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MARKER = "hpcsuite-test-image"
# What the rank reports from inside: how it was started, what it sees as /.
PROBE = '''
import json, os, sys


def build(input_shape, classes):
    import torch

    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "?")
    marker = "/%s"
    facts = {"rank": rank, "ch_running": os.environ.get("CH_RUNNING"),
             "marker": open(marker).read().strip() if os.path.exists(marker) else None,
             "uid_map": open("/proc/self/uid_map").read().split(),
             "node": os.environ.get("SLURMD_NODENAME"), "cwd": os.getcwd(),
             "python": sys.executable}
    with open(os.path.join(os.environ["HPCSUITE_RUN_DIR"], f"inside-rank-{rank}.json"), "w") as f:
        json.dump(facts, f)
    size = 1
    for n in input_shape:
        size *= n
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(size, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, classes))
''' % MARKER


def host_roots() -> list[str]:
    """The top-level host directories the job's Python lives in (/usr, the venv's, the repo's)."""
    paths = ["/usr", sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix,
             str(REPO), *sys.path, *os.environ.get("PYTHONPATH", "").split(":")]
    tops = {Path(p).parts[1] for p in paths if p.startswith("/") and len(Path(p).parts) > 1}
    return sorted(f"/{t}" for t in tops if t not in ("tmp", "proc", "sys", "dev"))


def build_image(image: Path, token: str, mounts: list[str]) -> None:
    """A Charliecloud image directory: mount points for the binds, the host's loader and
    name-service files copied into etc/, and a marker file only the image has."""
    for d in ("dev", "proc", "sys", "tmp", "home", "etc", *(m.lstrip("/") for m in mounts)):
        (image / d).mkdir(parents=True, exist_ok=True)
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):   # merged /usr
        if os.path.islink(f"/{name}"):
            os.symlink(os.readlink(f"/{name}"), image / name)
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "hosts",
                 "nsswitch.conf", "resolv.conf", "passwd", "group"):
        source = Path("/etc") / name
        if source.is_dir():
            shutil.copytree(source, image / "etc" / name, symlinks=True)
        elif source.exists():
            shutil.copy2(source, image / "etc" / name)
        else:
            (image / "etc" / name).touch()   # ch-run binds passwd and group over these
    (image / MARKER).write_text(token + "\n")


def test_ranks_run_inside_charliecloud(local_cluster, tmp_path):
    _, env = local_cluster
    assert shutil.which("ch-run"), "ch-run is missing: scripts/setup.sh installs charliecloud-runtime"
    token = secrets.token_hex(8)
    # The submit directory is outside /tmp, so the ranks reach it only through its bind.
    work = Path(tempfile.mkdtemp(prefix="hpcsuite-ctr-", dir="/var/tmp"))
    try:
        roots = host_roots()
        image = tmp_path / "images" / "synthetic"
        build_image(image, token, [*roots, str(work)])
        (work / "probe.py").write_text(PROBE)
        profile = work / "site.yaml"
        profile.write_text(json.dumps({
            "python": sys.executable,
            "container": {"runtime": "charliecloud", "allowed_images": [f"{image.parent}/"],
                          "binds": roots, "python": sys.executable}}))
        spec = (f"name: ctr\nresources: {{nodes: 2, tasks_per_node: 1}}\n"
                f"container: {{image: {image}}}\n"
                "train:\n  backend: torch\n  model: probe.py:build\n"
                "  data: {samples: 256, shape: [8], classes: 4}\n  batch_size: 32\n"
                "  epochs: 1\n  checkpoint: {every_steps: 4}\n")
        out = submit(env, work, spec, "--profile", str(profile))
        results = out["results"]
        run_dir = Path(out["run_dir"])
        assert results["status"] == "completed" and results["world_size"] == 2
        assert len(set(results["param_checksums"])) == 1      # one model: the allreduce ran
        script = (run_dir / "job.sbatch").read_text()
        assert f"ch-run -b \"$SLURM_SUBMIT_DIR\"" in script and f" {image} -- " in script

        host_map = Path("/proc/self/uid_map").read_text().split()
        inside = [json.loads((run_dir / f"inside-rank-{r}.json").read_text()) for r in (0, 1)]
        for facts in inside:
            assert facts["ch_running"], facts                  # ch-run's own variable
            assert facts["marker"] == token, facts             # / is the image
            assert facts["uid_map"] != host_map, facts         # a user namespace of its own
            assert facts["cwd"] == str(work), facts            # the bound submit directory
        assert not Path(f"/{MARKER}").exists()
        assert sorted(f["node"] for f in inside) == ["node1", "node2"]
        checkpoints = list((work / "runs" / "ctr" / "checkpoints").iterdir())
        assert checkpoints, "no checkpoint written from inside the container"
        assert (run_dir / "results.json").is_file()
    finally:
        shutil.rmtree(work, ignore_errors=True)
