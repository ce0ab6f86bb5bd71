"""`hpcsuite doctor`: is this cluster set up the way the site profile says, before a job finds out.

Each check passes, warns or fails, with what it saw and how to fix it. Checks read the login
node (Slurm's answers, MPI, the Horovod build, network devices, GPUs) and, unless told not to,
one compute node through ``srun`` (the Python, frameworks and Horovod the ranks will import).
Nothing here imports a framework: the compute side is asked in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import fabrics, gpuhealth, mpis
from ..submit.site_profile import SiteProfile
from .doctor_parse import interface_names, parse_check_build, parse_mpi_list, parse_partitions
from . import horovod_mpi
from .horovod_mpi import ask as _run
from .horovod_mpi import describe_gpu_build, framework_build, horovod_build  # noqa: F401
from .job_prologue import PROBE, PROLOGUE_DONE, compute_argv, prologue  # noqa: F401
from .slurm_versions import judge_mpi, judge_slurm

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: str          # pass | warn | fail
    detail: str          # what was seen
    hint: str = ""       # how to fix it (warn, fail)

    def to_json(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------- checks

def check_pinned(in_vain: tuple[str, str] | None) -> Check | None:
    """The site profile says ``pinned: true`` where that does nothing (what is wrong and what
    to do, from :func:`hpcsuite.submit.pinning.pinned_in_vain`: the command asks it, as site/
    reads no configuration); None: nothing to say."""
    return Check("profile", WARN, *in_vain) if in_vain else None


BUILD = "hpcsuite-build-horovod in the jobs' venv with the MPI's module loaded"


def check_slurm(profile: SiteProfile) -> Check:
    code, out = _run(["sinfo", "-h", "-o", "%R %a"], timeout=30)
    if code != 0:
        return Check("slurm", FAIL, out.splitlines()[-1] if out else f"sinfo exit {code}",
                     "is the controller up and SLURM_CONF right? (the local cluster: "
                     "`hpcsuite cluster up`, then eval \"$(hpcsuite cluster env)\")")
    partitions = parse_partitions(out)
    missing = sorted(set(profile.partitions) - set(partitions))
    if missing:
        return Check("slurm", FAIL, f"the profile names partition(s) {', '.join(missing)}; Slurm "
                     f"has {', '.join(sorted(partitions)) or 'none'}",
                     "fix partitions: in the site profile")
    down = sorted(p for p in profile.partitions or partitions if partitions.get(p) != "up")
    detail = f"partitions {', '.join(f'{p} ({a})' for p, a in sorted(partitions.items()))}"
    if down:
        return Check("slurm", WARN, detail, f"partition(s) {', '.join(down)} not up")
    return Check("slurm", PASS, detail)


def check_pmi(profile: SiteProfile, launcher: str | None) -> Check:
    want = profile.mpi.srun_plugin()
    code, out = _run(["srun", "--mpi=list"], timeout=30)
    if code != 0:
        return Check("pmi", FAIL, out.splitlines()[-1] if out else f"srun exit {code}",
                     "srun is needed on the login node to start jobs' ranks")
    plugins = parse_mpi_list(out)
    if want in plugins or want == "none":
        return Check("pmi", PASS, f"srun --mpi={want} available ({', '.join(sorted(plugins))})")
    hint = (f"set mpi.srun_mpi in the site profile to one of {', '.join(sorted(plugins))}, or "
            "build Slurm with PMIx; jobs with launcher: mpirun do not need it")
    status = WARN if launcher == "mpirun" else FAIL
    return Check("pmi", status, f"srun --mpi={want} (the profile's mpi.srun_mpi, or its "
                 f"flavour's) is not among {', '.join(sorted(plugins))}", hint)


def check_accounting() -> Check:
    """sacct answers: finished jobs stay findable with exit codes and MaxRSS."""
    code, out = _run(["sacct", "-n", "-P", "-X", "-o", "JobID", "-S", "now"], timeout=30)
    if code == 0:
        return Check("accounting", PASS, "sacct answers (slurmdbd)")
    return Check("accounting", WARN, out.splitlines()[-1] if out else f"sacct exit {code}",
                 "without accounting, status and runs fall back to squeue and the job "
                 "completion log: a finished job is forgotten after Slurm's MinJobAge")


def check_mpi(profile: SiteProfile) -> Check:
    """The flavour's launcher: its MPI and version (mpirun or mpiexec --version)."""
    flavour = profile.mpi.flavour
    launcher = mpis.FLAVOURS.get(flavour, mpis.FLAVOURS[mpis.DEFAULT]).launcher
    code, out = _run([launcher, "--version"], timeout=30, env=dict(os.environ))
    return Check("mpi", *judge_mpi(code, out, flavour))


def check_slurm_rules(scripts: dict[str, str]) -> Check:
    """The Slurm version, and what changed after 22.05 on the profile's scripts."""
    asked = [_run(argv, timeout=30) for argv in (["sbatch", "--version"], ["scontrol", "show", "config"])]
    return Check("slurm-rules", *judge_slurm(*asked, scripts))


def check_horovod(b: dict, profile: SiteProfile) -> Check:
    """:func:`horovod_build`'s answer against the profile (GPU partitions need NCCL)."""
    if "error" in b:
        return Check("horovod", FAIL, b["error"],
                     f"install Horovod: {BUILD} (or load the site's module)")
    detail = (f"frameworks {', '.join(sorted(b['frameworks'])) or 'none'}; controllers "
              f"{', '.join(sorted(b['controllers'])) or 'none'}; operations "
              f"{', '.join(sorted(b['operations'])) or 'none'}; {describe_gpu_build(b['gpu'])}")
    missing = b.get("missing") or {}
    if "MPI" not in b["controllers"]:
        return Check("horovod", FAIL, detail, f"rebuild Horovod with MPI: {BUILD}")
    gpus = {name: p.gpus_per_node for name, p in profile.partitions.items() if p.gpus_per_node}
    if gpus and "NCCL" not in b["operations"]:
        where = ", ".join(f"{n}: {g} per node" for n, g in sorted(gpus.items()))
        return Check("horovod", FAIL, f"{detail}; the profile has GPU partitions ({where}) but "
                     "this Horovod has no NCCL", "rebuild Horovod on a node with CUDA: "
                     f"{BUILD} builds it with HOROVOD_GPU_OPERATIONS=NCCL there")
    absent = {name for name, why in missing.items() if _not_installed(name, why)}
    missing = {name: why for name, why in missing.items() if name not in absent}
    if absent:    # a torch-only venv: nothing of Horovod is broken
        detail += "; " + ", ".join(f"{name} not installed" for name in sorted(absent))
    if missing:
        return Check("horovod", WARN, f"{detail}; " + "; ".join(
            f"no {name} support ({why})" for name, why in sorted(missing.items())),
            "jobs with that backend fail at import")
    return Check("horovod", PASS, detail)


# check-build's framework names -> the module each imports
FRAMEWORK_MODULES = {"PyTorch": "torch", "TensorFlow": "tensorflow"}


def _not_installed(name: str, why: str) -> bool:
    """Whether Horovod's ``name`` support failed only because the framework itself is not
    installed (a torch-only venv), not because Horovod's build of it is broken."""
    module = FRAMEWORK_MODULES.get(name, name.lower())
    return f"No module named '{module}'" in why


def check_infiniband(profile: SiteProfile, root: Path = Path("/sys/class/infiniband")) -> Check:
    devices = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    ucx = profile.mpi.mca.get("pml") == "ucx"
    if devices:
        return Check("infiniband", PASS, f"devices {', '.join(devices)}" +
                     ("" if ucx else "; the profile does not use pml ucx"))
    if ucx:
        return Check("infiniband", WARN, "no InfiniBand devices, but the profile sets mpi.mca.pml: "
                     "ucx", "on nodes without InfiniBand use pml: ob1 (TCP)")
    return Check("infiniband", PASS, "no InfiniBand devices; MPI runs over TCP (pml ob1)")


def check_network(env: dict[str, str], profile: SiteProfile,
                  root: Path = Path("/sys/class/net")) -> Check:
    interfaces = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    settings = {k: env[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                                    "HOROVOD_GLOO_IFACE") if env.get(k)}
    for key in ("btl_tcp_if_include", "oob_tcp_if_include"):
        if profile.mpi.mca.get(key):
            settings[f"mpi.mca.{key}"] = profile.mpi.mca[key]
    if env.get("UCX_NET_DEVICES"):
        settings["UCX_NET_DEVICES"] = env["UCX_NET_DEVICES"]
    problems = []
    for key, value in settings.items():
        if key == "UCX_NET_DEVICES":
            names = [v.split(":")[0] for v in value.split(",") if v and v != "all"]
            exact = True
        else:
            names, exact = interface_names(value)
        for name in names:
            if "/" in name:        # a CIDR subnet (btl_tcp_if_include accepts them)
                continue
            ok = name in interfaces if exact else any(i.startswith(name) for i in interfaces)
            if not ok and not (key == "UCX_NET_DEVICES" and Path("/sys/class/infiniband", name).exists()):
                problems.append(f"{key}={value} names {name}")
    detail = f"interfaces {', '.join(interfaces) or 'none'}"
    if settings:
        detail += "; " + ", ".join(f"{k}={v}" for k, v in settings.items())
    if problems:
        return Check("network", FAIL, f"{detail}; no such interface: {'; '.join(problems)}",
                     "name an interface this node has (ip -br link), in the profile's env/mca")
    return Check("network", PASS, detail)


def check_gpus(profile: SiteProfile) -> Check:
    wanted = {n: p.gpus_per_node for n, p in profile.partitions.items() if p.gpus_per_node}
    try:
        import pynvml     # nvidia-ml-py, where the site installed it
    except ImportError:
        pynvml = None
    count, how = 0, None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            count, how = pynvml.nvmlDeviceGetCount(), "NVML"
            pynvml.nvmlShutdown()
        except Exception:   # noqa: BLE001 - no driver: NVML raises its own error types
            count = 0
    if how is None and shutil.which("nvidia-smi"):
        code, out = _run(["nvidia-smi", "-L"], timeout=30, env=dict(os.environ))
        count, how = (len([l for l in out.splitlines() if l.startswith("GPU ")]), "nvidia-smi") \
            if code == 0 else (0, None)
    detail = f"{count} GPU(s) on this node ({how})" if how else "no NVIDIA GPUs on this node"
    status = PASS
    if count and how == "NVML":      # the preflight's health rule (hpcsuite.gpuhealth)
        status, health = gpuhealth.summarize(gpuhealth.read_all(pynvml))
        detail += f": {health}"
    if wanted:
        detail += "; GPU partitions: " + ", ".join(f"{n} ({g} per node)"
                                                    for n, g in sorted(wanted.items()))
    return Check("gpus", status, detail, "drain the node or reset the GPU (nvidia-smi -r) "
                 "before jobs land on it" if status != PASS else "")


def check_fabric(profile: SiteProfile) -> Check:
    """The site's fabric and the bar a job's ``preflight.fabric`` (``min_busbw_gbps: site``)
    holds each node pair to; a warning saying why ``site`` cannot be used when the profile
    names no fabric."""
    fabric = fabrics.from_profile(profile.fabric)
    if fabric is None:
        return Check("fabric", WARN, "the site profile names no fabric: a job's preflight.fabric "
                     "with min_busbw_gbps: site (its default) is refused, and study predict "
                     "needs --fabric", "add fabric: to the site profile (a preset, or {bandwidth, "
                     "latency} from `hpcsuite bench allreduce --nodes 2`); until then jobs give "
                     "min_busbw_gbps in GB/s")
    source = getattr(profile.fabric, "source", None)
    return Check("fabric", PASS, f"{fabric.in_words()}" + (f" ({source})" if source else "")
                 + f"; preflight.fabric min_busbw_gbps: site asks "
                 f"{fabrics.preflight_bar_GBps(profile.fabric):g} GB/s busbw of each node "
                 f"pair ({fabrics.PREFLIGHT_SHARE:.0%})")


def check_compute(python: str, partition: str | None, timeout: float = 300,
                  profile: SiteProfile | None = None) -> Check:
    argv = compute_argv(python, partition, profile)
    code, out = _run(argv, timeout=timeout)
    line = next((l for l in out.splitlines() if l.startswith("HPCSUITE_PROBE=")), None)
    if prologue(profile) and PROLOGUE_DONE not in out:
        lines = [l.strip() for l in out.splitlines() if l.strip()]
        said = [l for l in lines if not l.startswith("srun:") and any(
            w in l.lower() for w in ("error", "unable", "not found", "no such"))] or \
            [l for l in lines if not l.startswith("srun:")] or lines
        return Check("compute", FAIL, "the jobs' prologue from the site profile failed on a "
                     f"compute node: {(said or [f'srun exit {code}'])[-1][:300]}",
                     "every job would fail the same way: fix module_init, module_paths, modules "
                     "or setup in the site profile (try them in `srun --pty bash`)")
    if code != 0 or line is None:
        return Check("compute", FAIL, (out.splitlines() or [f"srun exit {code}"])[-1][:300],
                     f"the ranks run {python} on the compute nodes: set python: in the site "
                     "profile, or load the site's modules")
    found = json.loads(line.split("=", 1)[1])
    gpus, health = gpuhealth.summarize(found.pop("gpu_health", None))
    missing = {k: v for k, v in found.items() if str(v).startswith("MISSING")}
    detail = ", ".join(f"{k} {v}" for k, v in found.items() if k not in missing) + f"; {health}"
    if gpus != PASS:
        return Check("compute", gpus, detail, "drain the node or reset the GPU before jobs "
                     "land on it")
    if {"numpy", "horovod"} & set(missing) or {"torch", "tensorflow"} <= set(missing):
        return Check("compute", FAIL, f"{detail}; " + "; ".join(f"{k} {v}" for k, v in
                     missing.items()), "install hpcsuite[train], the frameworks and Horovod "
                     f"({BUILD}) on the compute nodes, or load the site's modules")
    absent = {k for k, v in missing.items() if k in ("torch", "tensorflow")
              and f"No module named '{k}'" in str(v)}
    if absent:    # one framework, not installed: the site's choice, not a broken install
        detail += "; " + ", ".join(f"{k} not installed" for k in sorted(absent))
        missing = {k: v for k, v in missing.items() if k not in absent}
    if missing:
        return Check("compute", WARN, f"{detail}; {', '.join(missing)} missing",
                     "jobs with that backend fail at import")
    return Check("compute", PASS, detail)


CONTAINER_BINARIES = {"apptainer": "apptainer", "singularity": "singularity",
                      "charliecloud": "ch-run"}


def smoke_image(root: Path) -> list[str]:
    """A throwaway Charliecloud image in ``root``: mount points, the passwd and group files
    ch-run binds over, the host's /usr (and /bin, /lib... as links or binds); its ch-run -b flags."""
    binds = ["/usr"]
    for d in ("dev", "proc", "sys", "tmp", "home", "etc", "usr"):
        (root / d).mkdir()
    for name in ("passwd", "group"):
        (root / "etc" / name).touch()
    for name in ("bin", "sbin", "lib", "lib64"):
        host = Path("/") / name
        if host.is_symlink():
            (root / name).symlink_to(os.readlink(host))
        elif host.is_dir():
            (root / name).mkdir()
            binds.append(str(host))
    return [flag for b in binds for flag in ("-b", b)]


def check_container(profile: SiteProfile) -> Check | None:
    """The profile's container runtime: present, its version; Charliecloud also runs a
    command in a throwaway image here (user namespaces). None: the profile names none."""
    runtime = profile.container.runtime
    if runtime is None:
        return None
    if runtime == "pyxis":
        code, out = _run(["srun", "--help"], timeout=30)
        if code == 0 and "--container-image" in out:
            return Check("container", PASS, "pyxis: srun has --container-image (images are not "
                         "pulled by doctor)")
        return Check("container", FAIL, "pyxis: srun has no --container-image option",
                     "install pyxis and enroot, and enable pyxis in Slurm's plugstack.conf")
    import getpass
    import tempfile

    binary = CONTAINER_BINARIES[runtime]
    env = dict(os.environ, USER=os.environ.get("USER") or getpass.getuser())  # ch-run needs it
    code, out = _run([binary, "--version"], timeout=30, env=env)
    version = (out.splitlines() or [""])[-1].strip()
    if code != 0:
        seen = f"{binary} is not on PATH" if code == 127 else f"{binary}: {version or f'exit {code}'}"
        return Check("container", FAIL, seen,
                     f"install {runtime} on the login and compute nodes"
                     + (" (Debian: charliecloud-runtime)" if runtime == "charliecloud" else ""))
    if runtime != "charliecloud":
        return Check("container", PASS, f"{binary} {version} (images are not run by doctor)")
    with tempfile.TemporaryDirectory(prefix="hpcsuite-doctor-") as tmp:
        image = Path(tmp) / "image"
        image.mkdir()
        flags = smoke_image(image)
        code, out = _run(["ch-run", *flags, str(image), "--", "cat", "/proc/self/uid_map"],
                         timeout=30, env=env)
    if code != 0:
        return Check("container", FAIL, f"ch-run {version}: a throwaway image did not run: "
                     f"{(out.splitlines() or [f'exit {code}'])[-1][:200]}",
                     "ch-run needs unprivileged user namespaces "
                     "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces)")
    mapping = " ".join(out.split()[:3])
    return Check("container", PASS, f"ch-run {version}; ran a command in a throwaway image on "
                 f"this node (user namespace, uid map {mapping})")


# The slow checks, each a subprocess that imports frameworks (seconds each on a login node):
# what `doctor` says it is waiting for while they run side by side.
WAITS = {
    "horovod": "Horovod's build (horovod.torch and horovod.tensorflow, each importing its framework)",
    "horovod-mpi": "which libmpi Horovod links (ldd, in the job's Python)",
    "compute": "one srun on a compute node, after the jobs' prologue (modules, setup): Python, "
               "numpy, torch, TensorFlow, Horovod there",
}


def run_checks(profile: SiteProfile, launcher: str | None = None, partition: str | None = None,
               env: dict[str, str] | None = None, compute: bool = True,
               progress=None, scripts: dict[str, str] | None = None,
               pinned: tuple[str, str] | None = None) -> list[Check]:
    """Every check, in the report's order. The slow ones (:data:`WAITS`) run in threads while
    the quick ones run here; ``progress(text)`` is told what is awaited and when each is done;
    ``scripts``: the profile's rendered scripts by launcher, for the Slurm version rules;
    ``pinned``: the profile's pinned: true in vain (:func:`check_pinned`), said first."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    say = progress or (lambda text: None)
    python = profile.interpreter()
    env = {**os.environ, **(env or {})}
    started = time.monotonic()
    slurm_check = check_slurm(profile)
    slow = {"horovod": lambda: horovod_build(python),
            "horovod-mpi": lambda: Check("horovod-mpi", *horovod_mpi.check(python, env))}
    if compute and slurm_check.status != FAIL:
        slow["compute"] = lambda: check_compute(python, partition, profile=profile)
    with ThreadPoolExecutor(max_workers=len(slow)) as pool:
        futures = {name: pool.submit(fn) for name, fn in slow.items()}
        say("waiting for " + "; ".join(WAITS[name] for name in futures))
        checks = [c for c in (check_pinned(pinned),) if c is not None]
        checks += [slurm_check, check_slurm_rules(scripts or {}), check_accounting(),
                   check_pmi(profile, launcher), check_mpi(profile)]
        done = {}
        for name, future in futures.items():
            done[name] = future.result()
            say(f"{name}: done after {time.monotonic() - started:.0f} s")
    checks += [check_horovod(done["horovod"], profile), done["horovod-mpi"],
               check_infiniband(profile), check_network(env, profile), check_gpus(profile),
               check_fabric(profile)]
    checks += [c for c in (check_container(profile),) if c is not None]
    if compute:
        checks.append(done.get("compute") or Check("compute", FAIL, "not asked: Slurm does not "
                                                   "answer", "fix the slurm check first"))
    return checks


def report(checks: list[Check]) -> str:
    mark = {PASS: "ok  ", WARN: "WARN", FAIL: "FAIL"}
    lines = []
    for c in checks:
        lines.append(f"{mark[c.status]} {c.name:<11} {c.detail}")
        if c.hint and c.status != PASS:
            lines.append(f"     {'':<11} -> {c.hint}")
    fails = sum(c.status == FAIL for c in checks)
    warns = sum(c.status == WARN for c in checks)
    lines.append(f"{len(checks)} checks: {fails} failed, {warns} warnings")
    return "\n".join(lines)


