"""mpi.flavour: each MPI's launch line, environment, srun plugin and lint findings
(hpcsuite/submit/mpi_flavours.py), and the bad input around it."""

import shlex
import subprocess
import sys

import pytest

from hpcsuite.runtime.rank import shm
from hpcsuite.submit.lint import lint
from hpcsuite.submit.plan import plan
from hpcsuite.submit.site_profile import Mpi, SiteProfile
from hpcsuite.submit.spec import spec_from_dict
from hpcsuite.submit.templating import SearchPath

from conftest import REPO


def job(launcher="mpirun", **resources):
    res = {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, **resources}
    return spec_from_dict({"name": "x", "launcher": launcher, "resources": res}, "t")


def script(job, **mpi):
    return plan(job, SiteProfile(python="python3", mpi=Mpi(**mpi)), SearchPath.builtin_only()).script


HOLD_TERM = ["python3", "-m", "hpcsuite.runtime.hold_term"]   # Open MPI 5's daemons hold SIGTERM


def launch_words(text, held=False):
    """The launcher's words (after Open MPI 5's hold_term wrapper; ``held``: with it)."""
    line = next(l for l in text.splitlines()
                if l.startswith(("mpirun ", "mpiexec ", "srun ", " ".join(HOLD_TERM) + " ")))
    words = shlex.split(line.removesuffix(" &"))
    return words if held or words[:3] != HOLD_TERM else words[3:]


def exports(text):
    return dict(l[len("export "):].split("=", 1) for l in text.splitlines() if l.startswith("export "))


# flavour -> the launcher's words before the first -x/-genvlist, for a 2-node x 2-rank job
LAUNCH = {
    "openmpi": ["mpirun", "-np", "4", "-npernode", "2", "--map-by", "slot", "--bind-to", "none",
                "--mca", "pml", "ob1", "--mca", "btl", "^openib"],
    "openmpi5": ["mpirun", "-np", "4", "--map-by", "ppr:2:node", "--bind-to", "none",
                 "--prtemca", "prte_launch_agent", "python3 -m hpcsuite.runtime.hold_term prted",
                 "--mca", "pml", "ob1", "--mca", "btl", "^openib"],
    "mpich": ["mpiexec", "-n", "4", "-ppn", "2", "-bind-to", "none"],
    "intelmpi": ["mpiexec", "-n", "4", "-ppn", "2"],
}


@pytest.mark.parametrize("flavour", sorted(LAUNCH))
def test_each_flavour_has_its_own_launch_line(flavour):
    words = launch_words(script(job(), flavour=flavour))
    head = words[:len(LAUNCH[flavour])]
    assert head == LAUNCH[flavour]
    rest = words[len(head):]
    assert rest[-5:] == ["python3", "-m", "hpcsuite", "train", "--job"] or \
        rest[-6:-1] == ["python3", "-m", "hpcsuite", "train", "--job"]
    if flavour.startswith("openmpi"):
        assert rest[0] == "-x" and rest[1] == "PATH" and "-genvlist" not in rest
    else:   # Hydra: one -genvlist with every variable the ranks need
        assert rest[0] == "-genvlist" and rest[1].split(",")[:2] == ["PATH", "HPCSUITE_RUN_DIR"]
        assert "HOROVOD_CYCLE_TIME" in rest[1].split(",") and "-x" not in rest


def test_open_mpi_5_keeps_a_sites_placement_and_modifiers():
    words = launch_words(script(job(binding={"map_by": "slot:PE=2"}), flavour="openmpi5"))
    assert words[words.index("--map-by") + 1] == "ppr:2:node:PE=2"
    words = launch_words(script(job(binding={"map_by": "node"}), flavour="openmpi5"))
    assert words[words.index("--map-by") + 1] == "node"


def test_hydra_binding_takes_hardware_objects_only():
    words = launch_words(script(job(binding={"bind_to": "core:overload-allowed",
                                             "map_by": "socket"}), flavour="mpich"))
    assert words[5:9] == ["-bind-to", "core", "-map-by", "socket"]


@pytest.mark.parametrize("flavour, plugin", [("openmpi", "pmix"), ("openmpi5", "pmix"),
                                             ("mpich", "pmi2"), ("intelmpi", "pmi2")])
def test_srun_uses_the_flavours_plugin_unless_the_profile_says(flavour, plugin):
    assert launch_words(script(job("srun"), flavour=flavour))[1] == f"--mpi={plugin}"
    assert launch_words(script(job("srun"), flavour=flavour, srun_mpi="pmix_v4"))[1] == \
        "--mpi=pmix_v4"


def test_each_flavour_gives_its_ranks_its_own_settings():
    four, five = exports(script(job(), flavour="openmpi")), exports(script(job(), flavour="openmpi5"))
    assert four["OMPI_MCA_odls_base_sigkill_timeout"] == "10" and "PRTE_MCA_odls_base_sigkill_timeout" not in four
    # PRRTE 3.0 has no kill timeout to set (its daemons hold SIGTERM: hold_term)
    assert not [name for name in five if "sigkill_timeout" in name]
    assert four["OMPI_MCA_mpi_yield_when_idle"] == five["OMPI_MCA_mpi_yield_when_idle"] == "1"
    mpich = exports(script(job(), flavour="mpich"))
    assert not [name for name in mpich if name.startswith(("OMPI_", "PRTE_"))]
    assert exports(script(job(), flavour="intelmpi"))["I_MPI_PIN"] == "0"
    pinned = exports(script(job(binding={"bind_to": "socket"}), flavour="intelmpi"))
    assert pinned["I_MPI_PIN_DOMAIN"] == "socket" and "I_MPI_PIN" not in pinned


@pytest.mark.parametrize("flavour, variable", [("openmpi", None),
                                               ("openmpi5", "OMPI_MCA_btl_sm_backing_directory"),
                                               ("mpich", False), ("intelmpi", False)])
def test_nodes_that_share_a_host_get_the_flavours_shared_memory_directory(flavour, variable, tmp_path):
    env = exports(script(job(), flavour=flavour, nodes_share_host=True))
    if variable is False:    # MPICH names its segments uniquely
        assert shm.ENV not in env
        return
    assert env[shm.ENV] == "/dev/shm" and env.get("HPCSUITE_NODE_SHM_VARIABLE") == variable
    rank = {**env, shm.ENV: str(tmp_path), "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "node1"}
    shm.private_shm(rank)
    assert rank[variable or shm.BACKING] == str(shm.node_directory(str(tmp_path), rank))
    assert (variable is None) == (shm.BACKING in rank)


def findings(job, **mpi):
    profile = SiteProfile(python="python3", mpi=Mpi(**mpi))
    return [(f.level, f.key, f.message) for f in lint(job, profile) if f.key.startswith(("mpi", "launcher", "resources.binding"))]


def test_lint_says_what_the_mpi_cannot_use():
    assert findings(job(), flavour="openmpi") == []
    assert findings(job("srun"), flavour="mpich") == []
    [(level, key, message)] = findings(job(), flavour="mpich", mca={"pml": "ucx"})
    assert (level, key) == ("warning", "mpi.mca") and "ignores" in message
    [(level, key, message)] = findings(job("srun"), flavour="mpich", srun_mpi="pmix")
    assert key == "mpi.srun_mpi" and "pmi2" in message
    [(level, key, message)] = findings(job(), flavour="openmpi5", mca={"btl": "self,vader,tcp"})
    assert key == "mpi.mca.btl" and "sm, not vader" in message
    # Intel MPI 2021 speaks PMI-2 to srun itself (run: tests/test_e2e_mpi_lines.py)
    assert findings(job("srun"), flavour="intelmpi") == []
    [(level, key, message)] = findings(job(binding={"bind_to": "core:overload-allowed"}),
                                       flavour="mpich")
    assert key == "resources.binding.bind_to" and "passed as core" in message
    [(level, key, message)] = findings(job("srun"), flavour="openmpi", srun_mpi="none")
    assert (level, key) == ("error", "mpi.srun_mpi") and "world of one" in message


def hpcsuite(*args, cwd):
    return subprocess.run([sys.executable, "-m", "hpcsuite", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_an_unknown_flavour_is_one_line_naming_the_file_and_the_valid_ones(tmp_path):
    (tmp_path / "profile.yaml").write_text("mpi: {flavour: mvapich}\n")
    done = hpcsuite("render", str(REPO / "sbatch" / "quickstart.yaml"), "--profile",
                    str(tmp_path / "profile.yaml"), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"{tmp_path / 'profile.yaml'}: mpi.flavour: 'mvapich'" in line
    assert "openmpi, openmpi5, mpich, intelmpi" in line


def test_launcher_mpiexec_is_told_that_mpirun_means_the_mpis_own(tmp_path):
    (tmp_path / "job.yaml").write_text("name: x\nlauncher: mpiexec\n")
    done = hpcsuite("render", "job.yaml", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "job.yaml: launcher: 'mpiexec' is not one of: mpirun, srun" in line
    assert "mpiexec for the site profile's mpi.flavour mpich or intelmpi" in line


def saving_job(launcher="mpirun"):
    """A 2x1 job that checkpoints: its batch shell traps and forwards the stop signals."""
    return spec_from_dict({"name": "x", "launcher": launcher, "resources": {"nodes": 2},
                           "train": {"checkpoint": {"every_steps": 25},
                                     "preemption": {"signal": "USR2"}}}, "t")


def test_open_mpi_5s_daemons_hold_sigterm_and_the_batch_shell_signals_them_otherwise():
    """PRRTE's prterun and prted abort on SIGTERM (their ranks SIGKILLed 0.5 s later, before a
    save): under Open MPI 5's mpirun both start through hold_term, a TERM the batch shell
    forwards goes as the job's preemption signal, and a failed rank's launcher is ended by INT.
    Open MPI 4's ORTE forwards a TERM and waits: its script keeps TERM throughout."""
    five = script(saving_job(), flavour="openmpi5")
    words = launch_words(five, held=True)
    assert words[:4] == HOLD_TERM + ["mpirun"]
    agent = words.index("prte_launch_agent")
    assert words[agent - 1] == "--prtemca" and words[agent + 1].split() == HOLD_TERM + ["prted"]
    assert "trap 'stop_requested TERM USR2' TERM" in five.splitlines()
    assert '    kill -"${2:-$1}" "$launcher" 2>/dev/null || true' in five.splitlines()
    assert 'sleep 1; kill -INT "$launcher" 2>/dev/null; break' in five
    for other in (script(saving_job(), flavour="openmpi"), script(saving_job("srun"), flavour="openmpi5")):
        assert "hold_term" not in other
        assert "trap 'stop_requested TERM' TERM" in other.splitlines()
        assert '    kill -"$1" "$launcher" 2>/dev/null || true' in other.splitlines()
        assert 'sleep 1; kill -TERM "$launcher" 2>/dev/null; break' in other
    # a site that names its own launch agent keeps it
    own = script(saving_job(), flavour="openmpi5", mpirun_args=["--prtemca", "prte_launch_agent", "mine"])
    assert launch_words(own).count("prte_launch_agent") == 1 and "mine" in launch_words(own)


def test_hold_term_execs_its_program_with_sigterm_blocked():
    probe = "import signal; print(signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []))"
    held = subprocess.run([sys.executable, "-m", "hpcsuite.runtime.hold_term", sys.executable,
                           "-c", probe], capture_output=True, text=True, timeout=60)
    assert (held.returncode, held.stdout) == (0, "True\n"), held.stderr
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert plain.stdout == "False\n"
    missing = subprocess.run([sys.executable, "-m", "hpcsuite.runtime.hold_term", "no-such-prted"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 127 and missing.stderr.splitlines() == [
        "hpcsuite: cannot run no-such-prted: No such file or directory"]
