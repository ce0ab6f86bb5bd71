"""What every job runs before its ranks, as `doctor` asks it of a compute node: the site
profile's prologue (the template's modules and setup blocks: module_init, module use, module
load, setup lines) and the probe of the Python, frameworks and Horovod the ranks import."""

from __future__ import annotations

from ..submit.site_profile import SiteProfile

PROBE = """
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
out = {"python": sys.version.split()[0], "host": os.uname().nodename}
for mod in ("numpy", "torch", "tensorflow", "horovod", "mpi4py"):
    try:
        out[mod] = __import__(mod).__version__
    except Exception as e:
        out[mod] = "MISSING: " + type(e).__name__ + ": " + str(e)[:120]
try:   # the node's GPUs through NVML, judged on the login node (hpcsuite.gpuhealth)
    import pynvml
    from hpcsuite import gpuhealth
    out["gpu_health"] = gpuhealth.read_all(pynvml)
except Exception as e:
    nvml = type(e).__name__.startswith("NVMLError")
    out["gpu_health"] = ("no GPU (NVML: %s)" if nvml else "GPU health not read (%s)") % str(e)[:120]
print("HPCSUITE_PROBE=" + json.dumps(out))
"""


PROLOGUE_DONE = "HPCSUITE_PROLOGUE_DONE"


def prologue(profile: SiteProfile | None) -> list[str]:
    """The lines every job's batch script runs before its ranks, from the site profile (the
    template's modules and setup blocks): module_init, module use, module load, setup."""
    import shlex

    if profile is None:
        return []
    lines = []
    if profile.modules or profile.module_paths:
        lines += [profile.module_init] if profile.module_init else []
        lines += [f"module use {shlex.quote(d)}" for d in profile.module_paths]
        lines += [f"module load {shlex.quote(m)}" for m in profile.modules]
    return lines + list(profile.setup)


def compute_argv(python: str, partition: str | None, profile: SiteProfile | None) -> list[str]:
    """srun of the probe as a job sees the node: the partition (and the account it charges),
    then the profile's prologue in bash with -e, as the batch script runs it."""
    argv = ["srun", "--nodes=1", "--ntasks=1", "--time=00:05:00", "--job-name=hpcsuite-doctor"]
    if partition:
        argv.append(f"--partition={partition}")
        account = profile.partitions[partition].account \
            if profile is not None and partition in profile.partitions else None
        if account:
            argv.append(f"--account={account}")
    lines = prologue(profile)
    if not lines:
        return [*argv, python, "-c", PROBE]
    script = "\n".join(["set -eo pipefail", *lines, f"echo {PROLOGUE_DONE}",
                         'exec "$0" -c "$1"'])
    return [*argv, "bash", "-c", script, python, PROBE]


def module_problems(profile: SiteProfile, timeout: float = 60) -> list[tuple[str, str]]:
    """(key, why) for each part of the profile's module lines that fails here, asked of bash
    as the batch script would run them: module_init that fails or defines no ``module``, a
    module_paths directory or a module the module system cannot find (``module is-avail``,
    which Environment Modules 4+ and Lmod 7+ have). Nothing without modules."""
    import shlex

    from .horovod_mpi import ask

    if not (profile.modules or profile.module_paths):
        return []
    # -e as in the batch script (set -euo pipefail): a module_init that fails ends the job
    script = ["set -e", profile.module_init or ":", "set +e", "type module >/dev/null 2>&1 || "
              "{ echo HPCSUITE_NO_MODULE; exit 0; }"]
    script += [f"module use {shlex.quote(d)} >/dev/null 2>&1 || echo HPCSUITE_PATH {shlex.quote(d)}"
               for d in profile.module_paths]
    script += [f"module is-avail {shlex.quote(m)} >/dev/null 2>&1 || "
               f"echo HPCSUITE_MISSING {shlex.quote(m)}" for m in profile.modules]
    code, out = ask(["bash", "-c", "\n".join(script)], timeout=timeout)
    said = out.splitlines()
    if code in (124, 127):          # bash missing or timed out: nothing was tried
        return [("module_init", f"could not be tried here: {out[:200]}")]
    if code != 0:
        last = (said or [f"exit {code}"])[-1]
        return [("module_init", f"{profile.module_init!r} fails here ({last[:200]}): every job "
                                "that loads modules would fail at once")]
    if "HPCSUITE_NO_MODULE" in said:
        init = repr(profile.module_init) if profile.module_init else "no module_init"
        return [("module_init", f"{init} defines no `module` command in bash here: set "
                                "module_init to the site's module system's bash init (Lmod's "
                                "or Environment Modules')")]
    out = [("module_paths", f"{line.split(' ', 1)[1]}: `module use` refuses it")
           for line in said if line.startswith("HPCSUITE_PATH ")]
    out += [("modules", f"{line.split(' ', 1)[1]}: the module system here does not find it "
                        "(module is-avail); a job loading it would fail at once")
            for line in said if line.startswith("HPCSUITE_MISSING ")]
    return out
