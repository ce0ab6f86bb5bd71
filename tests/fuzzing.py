"""Property-based fuzzing of everything a user or a site feeds hpcsuite.

Shared by ``tests/test_fuzz.py`` (the suite: at least 1,000 cases per kind) and
``bench/fuzz_counts.py`` (the same checks, counted, for docs/SECURITY.md). Five kinds of input:

- job specs (YAML text, including YAML that is legal but wrong),
- site profiles (with a spec that tries to change what they lock),
- templates' inputs (values placed by templates into #SBATCH lines and the body),
- command-line values (every login-node command, odd arguments),
- sweep files (axes of hostile keys and values over a base spec, under a site that locks a key;
  accepted: the array's header holds exactly the job's options and ``--array``, its body is
  harmless, and each element's job holds its axis values exactly).

Each case runs the real CLI in-process (Click's runner) and its outcome is classified:
``accepted`` (exit 0: then the rendered header, read the way sbatch reads it, holds exactly
the options the job implies, and the script body run by bash creates no canary file and exports
every environment value verbatim), ``refused`` (exit 2 with an ``error:`` line naming the
file and the key or line), or a failure: a traceback, another exit code, a refusal that names
no file, an injected option, a canary, or a case that ran past :data:`HANG_SECONDS`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from click.testing import CliRunner
from hypothesis import strategies as st

from hpcsuite.cli import main

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "sbatch" / "profile.yaml"
CANARY = "CANARY"
HANG_SECONDS = 20

# Payloads for bash (command substitution, quotes, separators) and for sbatch's tokeniser
# (a backslash escapes inside quotes, '#' ends the line, several options per line).
PAYLOADS = [
    f"$(touch {CANARY})", f"`touch {CANARY}`", f"; touch {CANARY}", f"' ; touch {CANARY} '",
    f'" ; touch {CANARY} "', f"x > {CANARY}", f"&& touch {CANARY} #", "\\'' --partition=other #'",
    "' --partition=other '", '" -p other "', "\\' -p other #", "x\\ -p other", "a#b --qos=high",
    "--partition=other", "-pother", "x --uid=0", "\\", "'", '"', "#", " ", "\t", "$HOME", "${PATH}",
    "%j", "%u", "-", "--", "=", ":", "\u00a0", "\u2028", "\r", "\n", "\0", "\0<", "\0>",
    "hetjob", " packjob -p other", "a" * 300, "é", "日本", "\x7f", "\x1b[31m",
]
HOSTILE_CHARS = "'\"\\#$`;&|<>(){}[]*?!~ \t\n\r\0%=:,-+@/._\u00a0\u2028é"

hostile_text = st.one_of(
    st.sampled_from(PAYLOADS),
    st.text(alphabet=HOSTILE_CHARS + "abcAZ09", max_size=24),
    st.lists(st.sampled_from(PAYLOADS + ["a", "b", "1"]), min_size=2, max_size=4).map("".join),
    st.integers(4090, 5000).map(lambda n: "v" * n),
)
names = st.one_of(st.sampled_from(["fz", "job-1", "a.b_c", "X" * 64]), hostile_text)
numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True))
scalars = st.one_of(st.none(), st.booleans(), numbers, hostile_text)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def either(good):
    """A plausible value for a key, or anything at all."""
    return st.one_of(good, good, good, scalars, values)


ENV_NAMES = st.one_of(st.sampled_from(["NOTE", "NCCL_DEBUG", "OMP_PROC_BIND", "SHELLOPTS", "PATH",
                                       "SLURM_JOB_ID", "HOROVOD_CYCLE_TIME", "RUN_DIR", "BASH_ENV",
                                       "UID", "A-B", "1X"]), hostile_text)
GOOD_ENV_NAMES = st.sampled_from(["NOTE", "NCCL_DEBUG", "OMP_PROC_BIND", "X_1", "_Y"])

# Each key: (values that are valid, values that are wrong in some way). Free-text fields that
# only reach the script body (quoted) or job.json take any text even in a valid spec.
SPEC_FIELDS = {
    "template": (st.just("horovod"), st.sampled_from(["nosuch", "../x", "a" * 300, "a/b"])),
    "launcher": (st.sampled_from(["mpirun", "srun"]), st.sampled_from(["ssh", ""])),
    "output_dir": (st.sampled_from(["runs", "out/x", "/tmp/fz-runs", "a+b@c"]),
                   st.sampled_from(["/tmp/fz runs", "runs/%u", "-r", "", "r'#"])),
    "resources.nodes": (st.integers(1, 4), st.integers(-1, 0)),
    "resources.tasks_per_node": (st.just(1), st.integers(-3, 0)),
    "resources.cpus_per_task": (st.just(1), st.integers(2, 3)),
    "resources.gpus_per_node": (st.just(0), st.integers(1, 4)),
    "resources.gpus_per_task": (st.just(0), st.integers(1, 4)),
    "resources.binding.gpu_bind": (st.none(), hostile_text),
    "after": (st.just([]), st.lists(hostile_text, min_size=1, max_size=2)),
    "resources.time": (st.sampled_from(["00:10:00", "10", "1:00:00", "5:00", "1-2", "0-00:30"]),
                       st.sampled_from(["0", "99:00:00", "10:00 --qos=x", "1-00:00:00:00"])),
    "resources.partition": (st.sampled_from(["debug"]), st.sampled_from(["other", "-p", "gpu"])),
    "resources.mem": (st.sampled_from(["4G", "1000", "512M"]), st.sampled_from(["0", "4G --uid=0"])),
    "env": (st.dictionaries(GOOD_ENV_NAMES, hostile_text, max_size=4),
            st.dictionaries(ENV_NAMES, hostile_text, max_size=4)),
    "train.backend": (st.sampled_from(["torch", "tensorflow"]), st.just("jax")),
    "train.batch_size": (st.integers(1, 512), st.integers(-5, 0)),
    "train.lr": (st.floats(0, 1), st.floats(allow_nan=True, allow_infinity=True)),
    "train.precision": (st.sampled_from(["fp32", "amp", "mixed_float16"]), st.just("fp8")),
    "train.checkpoint.every_steps": (st.integers(0, 100), st.integers(-3, -1)),
    "train.checkpoint.dir": (hostile_text, st.just("")),
    "train.data.path": (hostile_text, st.just("")),
    "train.data.shape": (st.lists(st.integers(1, 8), min_size=1, max_size=3), st.just([0])),
    "train.data.on_device": (st.sampled_from(["auto", True, False]), st.sampled_from(["gpu", "True", 1])),
    "train.preemption.signal": (st.sampled_from(["USR1", "TERM"]), st.just("KILL")),
    "train.preemption.lead_seconds": (st.integers(0, 30), st.integers(3600, 99999)),
    "train.horovod.cycle_time_ms": (st.floats(0, 100), st.floats(-1, -0.1)),
    "train.startup_timeout_seconds": (st.integers(0, 3600), st.integers(-5, -1)),
    "train.seed": (st.integers(0, 2**32 - 1), st.integers(2**32, 2**40)),
    "train.tracking.mlflow.uri": (st.sampled_from(["mlruns", "file:///srv/ml", "http://ml:5000",
                                                   "https://ml.site/x"]),
                                  st.sampled_from(["sqlite:///m.db", "http://", "", "s3://b",
                                                   "http://h:99999", 5])),
    "train.tracking.mlflow.experiment": (st.sampled_from(["exp", "a b/c"]),
                                         st.sampled_from(["", "x" * 201, ["x"]])),
    # sbatch/profile.yaml names no fabric: "site" is refused there, as is gpu without GPUs.
    "preflight.fabric.min_busbw_gbps": (st.floats(0.01, 1000), st.sampled_from(
        ["site", 0, -1, "fast", True, 1e6])),
    "preflight.fabric.size_mb": (st.integers(1, 64), st.integers(-3, 0)),
    "preflight.gpu": (st.just(False), st.sampled_from([True, "yes", 1])),
    "preflight.gpu_free_gib": (st.floats(0, 80), st.floats(-5, -0.1)),
    "train.model": (st.sampled_from(["mlp", "resnet"]),
                    st.sampled_from(["net.py:build", "../x.py:f", "a b.py:f", "pkg.mod:", "x.py:1f"])),
    "train.loss": (st.just("cross_entropy"), st.sampled_from(["mse", "nope.py:f", "hinge"])),
    "train.pythonpath": (st.lists(hostile_text, max_size=2), st.just([""])),
    "train.data.kind": (st.just("synthetic"), st.sampled_from(["python", "hdf5", "csv"])),
    "train.data.args": (st.dictionaries(st.sampled_from(["n", "part", "seed"]), values, max_size=3),
                        st.dictionaries(hostile_text, values, max_size=2)),
    "train.eval.split": (st.floats(0, 0.5), st.floats(0.95, 2)),
    "train.optimizer.name": (st.sampled_from(["sgd", "adam", "adamw"]), st.just("lamb")),
    "train.schedule.decay": (st.sampled_from(["constant", "step", "cosine"]), st.just("linear")),
    "train.schedule.warmup_epochs": (st.floats(0, 5), st.floats(-3, -1)),
    "train.script": (st.just(None), st.sampled_from(["train.py", "x.sh", "../a.py"])),
    "train.args": (st.lists(hostile_text, max_size=3), st.just("--lr 1")),
    # sbatch/profile.yaml runs apptainer and allows /apps/images/ and docker://nvcr.io/nvidia/.
    "container.image": (st.sampled_from(["/apps/images/a.sif", "docker://nvcr.io/nvidia/pytorch:24.01-py3",
                                         "/apps/images/x/y.sif"]),
                        st.one_of(hostile_text, st.sampled_from([
                            "/apps/images/../../home/me/x.sif", "/home/me/x.sif", "/apps/images//x",
                            "docker://nvcr.io/nvidiax/y", "/apps/images/a.sif --bind /:/host",
                            "/apps/images/$(id).sif"]))),
    "container.binds": (st.lists(st.sampled_from(["/data", "/a/b:/c", "/x+y@z"]), max_size=3),
                        st.lists(st.one_of(hostile_text, st.sampled_from([
                            "data", "/a,/b", "/a:/b:/c", "/a/../etc", "/a:b", "/$(id)"])),
                            min_size=1, max_size=2)),
}


def _put(tree: dict, key: str, value) -> None:
    parts = key.split(".")
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = value


# YAML that is legal but wrong, and files that are not YAML at all.
MUTATIONS = [
    lambda text: text,
    lambda text: text,
    lambda text: text,
    lambda text: text + "name: again\n",
    lambda text: text + "seed_time: 1\nresources2: {time: 10:00}\n",
    lambda text: text.replace("name:", "output_dir: ''\nname:", 1),
    lambda text: text + "x: &a [1, 2]\ny: [*a, *a]\n",
    lambda text: text + "bomb: &b0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * 9) + "]\n" for i in range(1, 8)),
    lambda text: text + "deep: " + "[" * 200 + "]" * 200 + "\n",
    lambda text: text + "# " + "p" * (270 * 1024) + "\n",
    lambda text: text[: len(text) // 2],
    lambda text: text.replace(":", "::", 1),
    lambda text: "\t" + text,
    lambda text: text + "train: {lr: .nan}\n",
    lambda text: "- just\n- a list\n",
    lambda text: text + "resources: {time: 1:30:00}\n",
]


@st.composite
def spec_documents(draw) -> bytes:
    """Half the cases a valid spec (hostile text only where any text is allowed), the other
    half anything: wrong values, wrong types, YAML that is legal but wrong, broken files."""
    valid = draw(st.booleans())
    tree: dict = {"name": draw(st.sampled_from(["fz", "job-1", "a.b_c", "X" * 64]) if valid
                               else either(names))}
    for key, (good, bad) in SPEC_FIELDS.items():
        if draw(st.integers(0, 2)) == 0:
            _put(tree, key, draw(good if valid else either(st.one_of(good, bad))))
    text = yaml.safe_dump(tree, allow_unicode=True, sort_keys=False)
    if not valid:
        text = draw(st.sampled_from(MUTATIONS))(text)
    data = text.encode("utf-8", "surrogatepass")
    if not valid and draw(st.integers(0, 20)) == 0:
        data = data[:3] + b"\xff\xfe" + data[3:]
    return data


PROFILE_FIELDS = {   # key: (valid values, wrong ones)
    "name": (st.just("uni"), st.just("x y")),
    "contact": (st.just("hpc@uni.example"), st.just("x" * 300)),
    "python": (st.sampled_from(["python3", "/opt/py/bin/python"]), hostile_text),
    "modules": (st.lists(st.sampled_from(["gcc/12", "openmpi/4.1"]), max_size=2),
                st.lists(st.sampled_from(["a b", "x;y", "$(id)"]), min_size=1, max_size=2)),
    "module_paths": (st.lists(hostile_text, max_size=2), st.just("notalist")),
    "setup": (st.lists(st.sampled_from(["export A=1", "true", ": site"]), max_size=2),
              st.just([1, 2])),
    "allow_unlimited_time": (st.booleans(), st.just("yes please")),
    "env": (st.dictionaries(GOOD_ENV_NAMES, hostile_text, max_size=3),
            st.dictionaries(ENV_NAMES, hostile_text, max_size=3)),
    "mpi": (st.fixed_dictionaries({}, optional={
        "mca": st.dictionaries(st.sampled_from(["pml", "btl"]), hostile_text, max_size=2),
        "mpirun_args": st.lists(hostile_text, max_size=2),
        "srun_args": st.lists(hostile_text, max_size=2),
        "srun_mpi": st.sampled_from(["pmix", "pmi2", "none"]),
        "flavour": st.sampled_from(["openmpi", "openmpi5", "mpich", "intelmpi"])}),
        st.fixed_dictionaries({"srun_mpi": st.just("evil"), "mca": st.just({"X-Y": "1"}),
                               "flavour": st.sampled_from(["lam", "", "OpenMPI"])})),
    "defaults": (st.fixed_dictionaries({}, optional={
        "resources": st.fixed_dictionaries({}, optional={
            "partition": st.sampled_from(["batch", "other"]),
            "time": st.sampled_from(["00:20:00", "45"])}),
        "env": st.dictionaries(GOOD_ENV_NAMES, hostile_text, max_size=2),
        "preflight": st.fixed_dictionaries({"fabric": st.fixed_dictionaries(
            {"min_busbw_gbps": st.sampled_from([1, 2.5])})})}),
        st.fixed_dictionaries({"resources": st.fixed_dictionaries({"time": hostile_text})})),
    "container": (st.fixed_dictionaries({"runtime": st.sampled_from(
        ["apptainer", "singularity", "pyxis", "charliecloud"])}, optional={
            "allowed_images": st.lists(st.sampled_from(["/img/", "/img/*.sif", "reg.io#ml/"]),
                                       max_size=2),
            "binds": st.lists(st.sampled_from(["/scratch", "/a:/b"]), max_size=2),
            "options": st.lists(hostile_text, max_size=2), "python": st.just("python3")}),
        st.fixed_dictionaries({"runtime": st.sampled_from(["docker", "podman", ""])}, optional={
            "allowed_images": st.lists(hostile_text, min_size=1, max_size=2),
            "binds": st.lists(hostile_text, min_size=1, max_size=2),
            "python": hostile_text})),
    "tracking_uri": (st.sampled_from(["http://mlflow.site:5000", "/srv/mlruns"]),
                     st.sampled_from(["postgresql://db/ml", "https://", ""])),
    "locked": (st.lists(st.sampled_from(["resources.partition", "resources", "env.NOTE",
                                         "train.horovod", "site.python", "site.setup",
                                         "preflight", "train.tracking"]), max_size=3),
               st.lists(st.sampled_from(["resources.partitoin", "site.nosuch", "launcher."]),
                        min_size=1, max_size=2)),
}
PARTITION_FIELDS = {
    "account": (st.sampled_from(["physics", "ml-lab"]), st.sampled_from(["a b", "x#y", "-A"])),
    "qos": (st.sampled_from(["normal", "high"]), st.just("q'q")),
    "reservation": (st.just("maint"), st.just("")),
    "constraint": (st.sampled_from(["ib&haswell", "[a|b]*2"]), st.just("a b")),
    "max_time": (st.sampled_from(["01:00:00", "2-00:00:00", "30"]), st.just("forever")),
    "cpus_per_node": (st.integers(1, 64), st.integers(-1, 0)),
}


@st.composite
def profile_cases(draw) -> tuple[bytes, bytes]:
    """(site profile, job spec that pushes against it): half the profiles valid."""
    valid = draw(st.booleans())
    tree: dict = {}
    for key, (good, bad) in PROFILE_FIELDS.items():
        if draw(st.integers(0, 2)) == 0:
            tree[key] = draw(good if valid else either(st.one_of(good, bad)))
    if draw(st.integers(0, 3)):
        parts = {}
        for pname in draw(st.lists(st.sampled_from(["batch", "other"]) if valid else
                                   st.one_of(st.sampled_from(["batch", "other"]), hostile_text),
                                   max_size=2, unique=True)):
            parts[pname] = {k: draw(good if valid else either(st.one_of(good, bad)))
                            for k, (good, bad) in PARTITION_FIELDS.items() if draw(st.booleans())}
        tree["partitions"] = parts
    text = yaml.safe_dump(tree, allow_unicode=True, sort_keys=False)
    if not valid:
        text = draw(st.sampled_from(MUTATIONS[:9]))(text)
    spec: dict = {"name": "fz"}
    if draw(st.booleans()):
        spec["resources"] = {"partition": draw(st.sampled_from(["batch", "other"]))}
    if draw(st.booleans()):
        spec["env"] = {"NOTE": draw(st.sampled_from(["mine", "plain"]))}
    if draw(st.integers(0, 2)) == 0:
        spec["container"] = {"image": draw(st.sampled_from(["/img/a.sif", "/img/b/c.sif",
                                                            "reg.io#ml/x:1", "/home/me/x.sif"]))}
        if draw(st.booleans()):
            spec["launcher"] = "srun"
    if draw(st.integers(0, 4)) == 0:
        spec["preflight"] = {"fabric": {"min_busbw_gbps": draw(st.sampled_from([0.5, "site"]))}}
    if draw(st.integers(0, 4)) == 0:
        spec.setdefault("train", {})["tracking"] = {"mlflow": draw(st.sampled_from(
            [{}, {"experiment": "e"}, {"uri": "http://own:5000"}]))}
    if draw(st.integers(0, 3)) == 0:
        spec.setdefault("resources", {})["time"] = draw(st.sampled_from(["00:30:00", "3:00:00", "0"]))
    return (text.encode("utf-8", "surrogatepass"),
            yaml.safe_dump(spec, sort_keys=False).encode())


TEMPLATES = {
    # --licenses: an option the profile's sbatch_allowed lists (a --template-dir template
    # adds no other the job did not ask for)
    "licenses": '{% extends "builtin/horovod.sbatch.j2" %}\n'
               "{% block sbatch %}{{ super() }}#SBATCH --licenses={{ job.env.get('NOTE', 'none') }}\n"
               "{% endblock %}\n",
    "jobname": '{% extends "builtin/horovod.sbatch.j2" %}\n'
               "{% block sbatch %}#SBATCH --job-name={{ job.env.get('NOTE', 'x') }}{{ job.name }}\n"
               "{{ super() }}{% endblock %}\n",
    "body": '{% extends "builtin/horovod.sbatch.j2" %}\n'
            "{% block setup %}{{ super() }}\necho {{ job.env.get('NOTE', '') }} "
            "{{ job.train.checkpoint.dir }} {{ job.name }}\nCOPY={{ job.env.get('NOTE', '') }}\n"
            "{{ job.env.get('NOTE', ':') }}\n{% endblock %}\n",
}


@st.composite
def template_cases(draw) -> tuple[str, bytes]:
    """(template name, job spec whose values the template places)."""
    spec = {"name": draw(st.one_of(st.sampled_from(["fz", "a.b"]), names)),
            "env": {"NOTE": draw(st.one_of(hostile_text, st.sampled_from(
                ["plain", "a=b,c:d", "x/y.z", "1e-3", "%j", "a+b@c"])))}}
    if draw(st.booleans()):
        spec["train"] = {"checkpoint": {"dir": draw(hostile_text)}}
    return draw(st.sampled_from(sorted(TEMPLATES))), yaml.safe_dump(spec, allow_unicode=True).encode()


SUBCOMMANDS = [["render"], ["lint"], ["config", "show"], ["submit", "--dry-run"]]


@st.composite
def cli_cases(draw) -> list[str]:
    """argv for a login-node command, with odd values everywhere."""
    kind = draw(st.integers(0, 5))
    word = st.one_of(hostile_text, st.sampled_from(["", "-", "--", "-h", "--help", "horovod"]))
    if kind <= 1:
        argv = [*draw(st.sampled_from(SUBCOMMANDS)), "SPEC"]
        for _ in range(draw(st.integers(0, 3))):
            option = draw(st.sampled_from(["--set", "--profile", "--template-dir", "--json",
                                           "--origin", "--nosuch"]))
            if option == "--set":
                key = draw(st.one_of(st.sampled_from([
                    "resources.nodes", "resources.time", "train.lr", "env.NOTE", "env.SLURM_X",
                    "name", "resources", "train.horovod.op", "output_dir"]), hostile_text))
                argv += ["--set", f"{key}={draw(word)}"]
            elif option in ("--profile", "--template-dir"):
                argv += [option, draw(st.one_of(word, st.sampled_from(["PROFILE", "/", "/dev/null"])))]
            else:
                argv.append(option)
        return argv
    if kind == 2:
        sub = draw(st.sampled_from(["which", "show", "eject", "list", "validate"]))
        argv = ["templates", sub]
        if sub in ("which", "show", "eject"):
            argv.append(draw(word))
        if sub == "eject":
            argv += ["--to", "EJECT"] + (["--force"] if draw(st.booleans()) else [])
        if sub == "validate" and draw(st.booleans()):
            argv.append(draw(st.sampled_from(["/", "/dev/null", "nosuch"])))
        return argv
    if kind == 3:
        sub = draw(st.sampled_from(["status", "logs", "cancel"]))
        ident = draw(st.one_of(word, st.integers(0, 10**20).map(str), st.just("١٢٣")))
        if ident.isascii() and ident.isdigit():
            # A well-formed id reaches Slurm, which this tier has not got (the e2e tier has):
            # never cancel a real job, never wait on a missing controller.
            ident += "x"
        extra = ["-n", draw(st.sampled_from(["5", "-1", "x", "999999999999"]))] if sub == "logs" \
            and draw(st.booleans()) else []
        return [sub, ident, *extra]
    if kind == 4 and draw(st.booleans()):
        return ["completion", draw(st.one_of(st.sampled_from(["bash", "zsh", "fish"]), word))]
    if kind == 4:
        value = st.sampled_from(["0", "0.02", "0.999", "1", "-0", "1e-3", "nan", "inf", "1e309"])
        return ["study", "predict", "--params", "1000", "--step-ms", "10", "--nodes", "1,2",
                "--fabric", "ib-hdr", "--compute-cv", draw(st.one_of(value, word))]
    return draw(st.lists(word, max_size=3))


# ---------------------------------------------------------------------- running and checking

@dataclass
class Counts:
    cases: int = 0
    accepted: int = 0
    refused: int = 0
    failures: list = field(default_factory=list)   # (kind, detail)

    def add(self, outcome: str, detail: str = "") -> None:
        self.cases += 1
        if outcome in ("accepted", "refused"):
            setattr(self, outcome, getattr(self, outcome) + 1)
        else:
            self.failures.append((outcome, detail[:2000]))


class Hang(Exception):
    pass


@contextmanager
def deadline(seconds: int):
    def fire(signum, frame):
        raise Hang()

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def environment(work: Path) -> dict[str, str]:
    return {"HPCSUITE_SITE_DIR": str(work / "site"), "XDG_CONFIG_HOME": str(work / "xdg"),
            "XDG_CACHE_HOME": str(REPO / ".hypothesis" / "cache"), "HPCSUITE_PROFILE": "",
            "SLURM_CONF": "/nonexistent/slurm.conf", "HPCSUITE_DEBUG": ""}


def invoke(argv: list[str], work: Path):
    old = os.getcwd()
    os.chdir(work)
    try:
        with deadline(HANG_SECONDS):
            return CliRunner().invoke(main, argv, env=environment(work))
    finally:
        os.chdir(old)


ERROR_LINE = re.compile(r"^error: (?P<where>.+?): (?P<rest>.*)$")
_SEGMENT = r"""(?:[\w\-\[\]]+|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\.\.\.)(?:\[\d+\])*"""
# a long key is cut (``'abc'… (45 characters)``), and a list under it indexed after that
KEY = re.compile(rf"^(?:{_SEGMENT}(?:\.{_SEGMENT})*(?:…)?(?: \(\d+ characters\))?(?:\[\d+\])*|"
                 rf"\(top\)): ")
WHOLE_FILE = ("larger than", "not UTF-8", "expected a mapping of keys", "no such file",
              "values once aliases", "a value contains itself", "is a directory", "cannot read")


def refusal_problem(output: str, files: list[str]) -> str | None:
    """None when the output is a proper refusal: ``error: FILE[:LINE]: KEY: message``."""
    lines = output.rstrip("\n").splitlines()
    starts = [i for i, l in enumerate(lines) if l.startswith("error: ")]
    if not starts:
        if "Usage:" in output and "Error:" in output:
            return None   # Click's own usage error (exit 2), naming the option
        return "no error line"
    # several errors: one line each, every one `error: FILE: key: ...`
    for line in [l[len("error: "):] if l.startswith("error: ") else l for l in lines[starts[0]:]]:
        file = next((f for f in files if line.startswith(f)), None)
        if file is None:
            return f"names none of {files}: {line[:300]}"
        rest = line[len(file):]
        if re.match(r"^(?: \(rendered\))?:\d+: ", rest) or re.match(r"^: rendered line \d+: ", rest):
            continue
        rest = rest[2:] if rest.startswith(": ") else rest
        if KEY.match(rest) or any(w in rest for w in WHOLE_FILE):
            continue
        return f"names no key or line: {line[:300]}"
    return None


def expected_header(job, profile) -> dict[str, str | None]:
    r = job.resources
    want: dict[str, str | None] = {
        "job-name": job.name, "nodes": str(r.nodes), "ntasks-per-node": str(r.tasks_per_node),
        "cpus-per-task": str(r.cpus_per_task), "time": r.time,
        "output": f"{job.output_dir.rstrip('/')}/{job.name}/slurm-%j.out"}
    if r.partition:
        want["partition"] = r.partition
    if r.gpus_per_node:
        want["gpus-per-node"] = str(r.gpus_per_node)
    if r.mem:
        want["mem"] = r.mem
    part = profile.partitions.get(r.partition or "")
    for option in ("account", "qos", "reservation", "constraint"):
        if part is not None and getattr(part, option):
            want[option] = getattr(part, option)
    pre = job.train.preemption
    lead = pre.lead_seconds if pre.lead_seconds is not None else \
        (30 if job.train.checkpoint.every_steps or job.train.checkpoint.every_minutes else 0)
    if lead:
        want["signal"] = f"B:{pre.signal}@{lead}"
    if pre.requeue or pre.max_failures:
        want["requeue"] = None
        want["open-mode"] = "append"
    return want


def check_script(script: str, work: Path, want: dict, env: dict[str, str],
                 slurm: dict[str, str] | None = None) -> str | None:
    """None when the header holds exactly ``want`` and bash runs the body harmlessly
    (``slurm``: the job's Slurm variables beyond SLURM_JOB_ID, an array element's)."""
    from hpcsuite.submit.sbatch_header import parse_header

    for keep in (False, True):
        got = {o.name: o.value for o in parse_header(script, keep_escaped_space=keep)}
        if got != want:
            return f"header {got} != expected {want}"
    head = script.split("\n# OpenMPI refuses")[0]
    run = Path(tempfile.mkdtemp(dir=work))
    probe = head + f"\nenv -0 > {run}/env.bin\n"
    (run / "job.sh").write_text(probe)
    proc = subprocess.run(["bash", "job.sh"], cwd=run, capture_output=True, timeout=30,
                          env={"SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin", **(slurm or {})})
    canaries = list(work.rglob(CANARY)) + list(Path("/tmp").glob(CANARY))
    if canaries:
        return f"canary created: {canaries}"
    try:
        return _exported_problem(proc, run / "env.bin", env)
    finally:
        import shutil

        shutil.rmtree(run, ignore_errors=True)


def _exported_problem(proc, found: Path, env: dict[str, str]) -> str | None:
    if proc.returncode == 0:
        exported = dict(item.split("=", 1) for item in found.read_bytes().decode(errors="surrogateescape").split("\0")
                        if "=" in item) if found.exists() else {}
        if not found.exists():
            return "the body ran but wrote no environment dump"
        for k, v in env.items():
            if exported.get(k) != v:
                return f"env {k}: exported {exported.get(k)!r}, wanted {v!r}"
    return None


def classify_render(result, files: list[str], script_check) -> tuple[str, str]:
    if isinstance(result.exception, Hang):
        return "hang", ""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        return "traceback", "".join(traceback.format_exception(result.exception))
    if result.exit_code == 2:
        problem = refusal_problem(result.output, files)
        return ("refused", "") if problem is None else ("unnamed refusal", problem)
    if result.exit_code != 0:
        return f"exit {result.exit_code}", result.output
    problem = script_check()
    return ("accepted", "") if problem is None else ("unsafe script", problem)


def run_spec_case(data: bytes, work: Path) -> tuple[str, str]:
    spec = work / "job.yaml"
    spec.write_bytes(data)
    result = invoke(["render", str(spec), "--profile", str(PROFILE), "--json"], work)

    def script_check():
        import json

        from hpcsuite.submit.config import resolve

        r = resolve(str(spec), str(PROFILE), ambient=False)
        script = json.loads(result.stdout)["script"]
        return check_script(script, work, expected_header(r.job, r.profile), r.job.env) \
            or container_problem(script, r.job)

    return classify_render(result, [str(spec), str(PROFILE)], script_check)


def container_problem(script: str, job) -> str | None:
    """A job in a container: its launch line, split as bash splits it, holds the image as one
    word and every bind of the job as one element of the --bind list."""
    import shlex

    if job.container.image is None:
        return None
    line = next(l for l in script.splitlines() if l.startswith(("mpirun ", "srun ")))
    words = shlex.split(line.rstrip(" &"))
    if words.count(job.container.image) != 1:
        return f"image {job.container.image!r} is not one word of {words}"
    bound = words[words.index("--bind") + 1].split(",")
    missing = [b for b in job.container.binds if b not in bound]
    return f"binds {missing} not in --bind {bound}" if missing else None


def run_profile_case(case: tuple[bytes, bytes], work: Path) -> tuple[str, str]:
    profile_text, spec_text = case
    (work / "site").mkdir(exist_ok=True)
    profile = work / "site" / "profile.yaml"
    profile.write_bytes(profile_text)
    spec = work / "job.yaml"
    spec.write_bytes(spec_text)
    result = invoke(["render", str(spec), "--json"], work)

    def script_check():
        import json

        from hpcsuite.submit.config import resolve

        r = resolve(str(spec), str(profile), ambient=False)
        plain = work / "plain.yaml"
        plain.write_text("name: fz\n")
        base = resolve(str(plain), str(profile), ambient=False)   # what the site alone says
        locked = (yaml.safe_load(profile_text) or {}).get("locked") or []
        if any(l in ("resources", "resources.partition") for l in locked) and \
                r.job.resources.partition != base.job.resources.partition:
            return (f"locked partition {base.job.resources.partition!r} became "
                    f"{r.job.resources.partition!r}")
        if "env.NOTE" in locked and r.job.env.get("NOTE") != base.job.env.get("NOTE"):
            return f"locked env.NOTE {base.job.env.get('NOTE')!r} became {r.job.env.get('NOTE')!r}"
        script = json.loads(result.stdout)["script"]
        return check_script(script, work, expected_header(r.job, r.profile), r.job.env)

    return classify_render(result, [str(spec), str(profile)], script_check)


def run_template_case(case: tuple[str, bytes], work: Path) -> tuple[str, str]:
    name, spec_text = case
    tdir = work / "tpl"
    tdir.mkdir(exist_ok=True)
    template = tdir / "horovod.sbatch.j2"
    template.write_text(TEMPLATES[name])
    spec = work / "job.yaml"
    spec.write_bytes(spec_text)
    result = invoke(["render", str(spec), "--profile", str(PROFILE), "--template-dir", str(tdir),
                     "--json"], work)

    def script_check():
        import json

        from hpcsuite.submit.config import resolve

        r = resolve(str(spec), str(PROFILE), ambient=False)
        want = expected_header(r.job, r.profile)
        note = r.job.env.get("NOTE")
        if name == "licenses":
            want["licenses"] = note if note is not None else "none"
        if name == "jobname":
            want["job-name"] = r.job.name    # the built-in line comes later and wins
        script = json.loads(result.stdout)["script"]
        return check_script(script, work, want, r.job.env)

    return classify_render(result, [str(spec), str(PROFILE), str(template)], script_check)


def run_cli_case(argv: list[str], work: Path) -> tuple[str, str]:
    spec = work / "job.yaml"
    spec.write_text("name: fz\n")
    subst = {"SPEC": str(spec), "PROFILE": str(PROFILE), "EJECT": str(work / "ejected")}
    argv = [subst.get(a, a) for a in argv]
    result = invoke(argv, work)
    if isinstance(result.exception, Hang):
        return "hang", " ".join(argv)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        return "traceback", " ".join(map(repr, argv)) + "\n" + "".join(
            traceback.format_exception(result.exception))
    if result.exit_code not in (0, 2):
        return f"exit {result.exit_code}", " ".join(map(repr, argv)) + "\n" + result.output
    if result.exit_code == 2 and "error: " not in result.output and "Usage:" not in result.output:
        # Click answers a usage mistake (or a bare group) with its usage text and exit 2.
        return "unexplained refusal", " ".join(map(repr, argv)) + "\n" + result.output
    return ("accepted" if result.exit_code == 0 else "refused"), ""


# ---------------------------------------------------------------------- sweep files

SWEEP_BASE = "name: fzbase\nresources: {partition: debug, time: '00:10:00'}\n"
SWEEP_PROFILE = ("name: fz\npython: python3\npartitions: {debug: {cpus_per_node: 1, "
                 "max_time: '01:00:00'}}\nsweep_max_parallel: 4\nlocked: [train.precision]\n")
# Each axis key: the values it takes in a valid sweep (lists), with wrong keys among them.
SWEEP_AXES = {
    "train.lr": st.lists(st.floats(0.0001, 1).map(lambda v: float(f"{v:.4g}")), min_size=1,
                         max_size=3, unique=True),
    "train.seed": st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=3, unique=True),
    "train.optimizer.name": st.just(["sgd", "adam"]),
    "train.checkpoint.dir": st.lists(hostile_text, min_size=1, max_size=2, unique=True),
    "train.data.path": st.lists(hostile_text, min_size=1, max_size=2, unique=True),
    "train.precision": st.just(["fp32"]),
    "resources.time": st.just(["00:05:00"]),
    "env.NOTE": st.lists(hostile_text, min_size=1, max_size=1),
}
SWEEP_BAD_KEYS = st.one_of(st.sampled_from(["name", "train.lrr", "resources.nodes", "env.PATH",
                                            "train.precision", "output_dir", "train.args",
                                            "resources.extra_sbatch.array"]), hostile_text)
DISTRIBUTIONS = st.one_of(
    st.fixed_dictionaries({"log_uniform": st.lists(numbers, min_size=0, max_size=3)}),
    st.fixed_dictionaries({"uniform": st.tuples(st.floats(0, 1), st.floats(0, 2)).map(list)}),
    st.fixed_dictionaries({"randint": st.lists(st.integers(-5, 50), min_size=2, max_size=2)}),
    st.fixed_dictionaries({"choice": st.lists(scalars, max_size=3)}),
    st.dictionaries(hostile_text, values, max_size=2))


@st.composite
def sweep_cases(draw) -> bytes:
    """Half the cases a valid sweep file (hostile text only where any text may go), the other
    half anything: wrong keys and values, distributions, YAML that is legal but wrong."""
    valid = draw(st.booleans())
    keys = draw(st.lists(st.sampled_from(sorted(SWEEP_AXES)), min_size=1, max_size=3, unique=True))
    axes = {k: draw(SWEEP_AXES[k]) for k in keys}
    tree: dict = {"name": draw(st.sampled_from(["fz", "sw-1", "a.b_c"]) if valid else either(names)),
                  "base": "job.yaml", "axes": axes}
    if draw(st.booleans()):
        tree["max_parallel"] = draw(st.integers(1, 4) if valid else either(st.integers(-1, 9)))
    if not valid:
        for _ in range(draw(st.integers(1, 3))):
            what = draw(st.integers(0, 5))
            if what == 0:
                axes[draw(SWEEP_BAD_KEYS)] = draw(either(st.lists(scalars, max_size=3)))
            elif what == 1:
                tree["random"] = draw(either(st.fixed_dictionaries(
                    {"count": st.integers(-1, 1200), "seed": st.integers(-1, 2**33)})))
                axes[draw(st.sampled_from(sorted(SWEEP_AXES)))] = draw(DISTRIBUTIONS)
            elif what == 2:
                tree[draw(st.sampled_from(["base", "output_dir", "metric", "max_parallel"]))] = \
                    draw(values)
            elif what == 3:
                axes[draw(st.sampled_from(sorted(SWEEP_AXES)))] = draw(values)
            elif what == 4:
                tree["axes"] = draw(values)
            else:
                tree["metric"] = {"name": draw(either(st.sampled_from(["val_loss", "metrics.acc"]))),
                                  "goal": draw(either(st.sampled_from(["max", "min"])))}
    text = yaml.safe_dump(tree, allow_unicode=True, sort_keys=False)
    if not valid:
        text = draw(st.sampled_from(MUTATIONS))(text)
    return text.encode("utf-8", "surrogatepass")


def run_sweep_case(data: bytes, work: Path) -> tuple[str, str]:
    import json
    import shutil

    (work / "job.yaml").write_text(SWEEP_BASE)
    profile = work / "sweep-profile.yaml"
    profile.write_text(SWEEP_PROFILE)
    sweep = work / "sweep.yaml"
    sweep.write_bytes(data)
    shutil.rmtree(work / "sweeps", ignore_errors=True)
    result = invoke(["sweep", "run", str(sweep), "--dry-run", "--json", "--profile",
                     str(profile)], work)

    def script_check():
        from hpcsuite.submit.config import resolve

        planned = json.loads(result.stdout)
        if (work / "sweeps").exists():
            return "a dry run wrote the sweep directory"
        elements = planned["elements"]
        name = yaml.safe_load(data)["name"]
        for element in elements[:3]:     # each element's job holds its values exactly
            r = resolve(str(work / "job.yaml"), str(profile), [f"name={name}", *element["sets"]],
                        ambient=False)
            job = r.job.to_dict()
            for key, value in element["values"].items():
                got = job
                for part in key.split("."):
                    got = got[part]
                if got != value and not (isinstance(value, str) and got == value.strip()
                                         and key.startswith("env.")):
                    return f"element {element['index']}: {key} is {got!r}, the axis says {value!r}"
        want = expected_header(r.job, r.profile)
        want["output"] = want["output"].replace("%j", "%A_%a")
        n = len(elements)
        limit = min(yaml.safe_load(data).get("max_parallel") or 4, n)
        want["array"] = f"0-{n - 1}%{limit}" if n > 1 else "0"
        copy = Path(planned["sweep_dir"]) / "elements" / "0"
        copy.mkdir(parents=True)
        (copy / "job.json").write_text("{}")
        try:
            return check_script(planned["script"], work, want, r.job.env,
                                {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0"})
        finally:
            shutil.rmtree(work / "sweeps", ignore_errors=True)

    return classify_render(result, [str(sweep), str(profile)], script_check)


KINDS = {
    "job specs": (spec_documents(), run_spec_case),
    "site profiles": (profile_cases(), run_profile_case),
    "template inputs": (template_cases(), run_template_case),
    "command-line values": (cli_cases(), run_cli_case),
    "sweep files": (sweep_cases(), run_sweep_case),
}
