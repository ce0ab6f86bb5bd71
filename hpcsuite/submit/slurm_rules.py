"""What changed in Slurm after 22.05 that changes what a rendered script does, as rules over the
script's text and the Slurm it meets (``hpcsuite lint --slurm``, ``submit`` and ``doctor``
apply them; docs/admin/slurm-versions.md lists them).

Each rule names the Slurm release it applies from and was read in Slurm's source at that tag
(CHANGELOG/slurm-X.md, src/common/slurm_opt.c, src/srun/launch.c, src/slurmctld/job_mgr.c,
src/plugins/mpi/pmix/mpi_pmix.c). A rule about what sbatch or srun parses uses the client's
version (``sbatch --version``); a rule about what the controller or slurmstepd does uses the
controller's (``SLURM_VERSION`` of ``scontrol show config``) and its settings. Pure: the
callers ask Slurm (``runner.against_slurm.ask``) and hand the answers in.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import field

from ..errors import UserError
from ..records import Record, record
from .sbatch_header import HeaderError, Option, parse_header

Version = tuple[int, int, int]


@record
class SlurmFacts(Record):
    """The Slurm a script meets: the client's version, the controller's and its settings."""

    client: Version                 # sbatch --version
    server: Version                 # scontrol show config: SLURM_VERSION
    config: dict = field(default_factory=dict)   # scontrol show config, "Key = value" lines

    @property
    def name(self) -> str:
        both = {dotted(self.client), dotted(self.server)}
        return dotted(self.server) if len(both) == 1 else \
            f"{dotted(self.server)} (sbatch {dotted(self.client)})"


def dotted(version: Version) -> str:
    """(22, 5, 8) -> "22.05.8", as Slurm spells its releases."""
    return f"{version[0]}.{version[1]:02d}.{version[2]}"


def parse_version(text: str) -> Version | None:
    """``sbatch --version`` ("slurm 24.11.5", Debian's "slurm-wlm 22.05.8") or a
    ``SLURM_VERSION`` value -> (24, 11, 5); None when it says no version."""
    m = re.search(r"(?:^|\s)(\d{2})\.(\d{2})\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {key: value}; its plugin sections ("MPI Plugins
    Configuration:", ...) are ``Key = value`` lines too, and "(null)" is kept as printed."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"([A-Za-z_][\w\[\]/.-]*)\s*=\s?(.*)$", line)
        if m:
            out.setdefault(m.group(1), m.group(2).strip())
    return out


def facts_from(sbatch_version: str, show_config: str) -> SlurmFacts:
    """:class:`SlurmFacts` from the two outputs; one that says no version is a UserError."""
    config = parse_config(show_config)
    client = parse_version(sbatch_version)
    server = parse_version(config.get("SLURM_VERSION", ""))
    if client is None or server is None:
        seen = (sbatch_version if client is None else config.get("SLURM_VERSION", "")).strip()
        what = "sbatch --version" if client is None else "scontrol show config's SLURM_VERSION"
        said = seen.splitlines()[-1][:120] if seen else "nothing"
        raise UserError(f"{what} says no Slurm version: {said!r}")
    return SlurmFacts(client=client, server=server, config=config)


# ------------------------------------------------------------------- the script, as Slurm reads it

@record
class Launch(Record):
    line: int
    text: str
    words: list         # argv, shell-split; the first is srun, mpirun or mpiexec
    options: dict       # srun's --name=value options before the program ("" for a flag)

    def option(self, name: str) -> str | None:
        return self.options.get(name)


@record
class Script(Record):
    header: list        # sbatch_header.Option, in order
    lines: list         # the script's lines (1-based: lines[n - 1])
    launches: list      # Launch, every srun / mpirun / mpiexec line

    def last(self, name: str) -> Option | None:
        return next((o for o in reversed(self.header) if o.name == name), None)


LAUNCHERS = ("srun", "mpirun", "mpiexec")


def read_script(text: str, client: Version) -> Script:
    """The header sbatch reads (with the tokeniser of the client's release) and the launch lines."""
    try:
        header = parse_header(text, keep_escaped_space=client > (22, 5, 99))
    except HeaderError:
        header = []          # lint's own header check names what is wrong
    lines = text.split("\n")
    launches = []
    for n, line in enumerate(lines, 1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        words = [w for w in words if w not in ("&", "exec")]
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            words = words[1:]             # VAR=value srun ...
        if words and words[0] in LAUNCHERS:
            launches.append(Launch(line=n, text=line.strip(), words=words,
                                   options=_launcher_options(words[1:])))
    return Script(header=header, lines=lines, launches=launches)


def _launcher_options(words: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for w in words:
        if not w.startswith("-"):
            break                          # the program: its own options are not the launcher's
        name, _, value = w.lstrip("-").partition("=")
        out.setdefault(name, value)
    return out


# ------------------------------------------------------------------------------------ the rules

@record
class Hit(Record):
    """One rule firing on one line of a script."""

    rule: str
    since: str          # the Slurm release it applies from
    level: str          # error: sbatch/srun/slurmctld refuse it; warning: it runs otherwise
    key: str            # the job key that wrote the line ("template": only a template can)
    line: int
    text: str           # the line, as rendered
    message: str        # what that Slurm does with it
    instead: str        # what to write instead

    def sentence(self, slurm: str) -> str:
        return (f"script line {self.line} {self.text!r}: {self.message} (Slurm {self.since} "
                f"and later; this Slurm is {slurm}); {self.instead}")


def _header_line(script: Script, o: Option) -> str:
    return script.lines[o.line - 1].strip()


def _gres_and_gpus_per_node(script: Script, facts: SlurmFacts) -> list[Hit]:
    gres, gpn = script.last("gres"), script.last("gpus-per-node")
    if not (gres and gpn and re.search(r"(^|,)(gres/)?gpu(:|,|$)", gres.value or "")):
        return []
    later = max((gres, gpn), key=lambda o: o.line)
    return [Hit("gres-and-gpus-per-node", "26.05.0", "error", "template",
                later.line, _header_line(script, later),
                f"sbatch stops with \"--gpus-per-node and --gres=gpu are mutually exclusive\" "
                f"(lines {gres.line} and {gpn.line} both ask for GPUs)",
                "ask once: hpcsuite writes the GPU request as the site profile's gpu_request "
                "says (gpus-per-node or gres); drop the template's own line")]


def _signal_reservation(script: Script, facts: SlurmFacts) -> list[Hit]:
    o = script.last("signal")
    flags = (o.value or "").split(":", 1)[0] if o and ":" in (o.value or "") else ""
    if not o or "R" not in flags.upper() or facts.config.get("PreemptMode", "OFF").upper() != "OFF":
        return []
    return [Hit("signal-R-without-preemption", "24.11.1", "error", "template",
                o.line, _header_line(script, o),
                "the controller refuses the job (ESLURM_PREEMPTION_REQUIRED): --signal=R: needs "
                "preemption and this cluster's PreemptMode is OFF",
                "drop the R: (hpcsuite's own warning signal is --signal=B:SIG@SECONDS, set by "
                "train.preemption), or ask the admins for a PreemptMode other than OFF")]


def _cpu_bind_rank(script: Script, facts: SlurmFacts) -> list[Hit]:
    out = []
    for launch in script.launches:
        value = launch.option("cpu-bind") or launch.option("cpu_bind")
        if launch.words[0] == "srun" and value and "rank" in value.lower().split(","):
            out.append(Hit("cpu-bind-rank", "24.11.0", "warning", "resources.binding.cpu_bind",
                           launch.line, launch.text,
                           "srun ignores --cpu-bind=rank (\"Ignoring --cpu-bind=rank. Rank binding "
                           "is obsolete.\"): the ranks get the task plugin's default binding",
                           "write cpu_bind: cores (one rank per core, as rank did on whole "
                           "nodes), or map_cpu:LIST for an exact placement"))
    return out


def _pmix_topology(script: Script, facts: SlurmFacts) -> list[Hit]:
    if facts.config.get("PMIxShareServerTopology", "no").lower() in ("yes", "true", "1"):
        return []
    out = []
    for launch in script.launches:
        mpi = launch.option("mpi") or ""
        per_node = launch.option("ntasks-per-node") or "1"
        if launch.words[0] == "srun" and mpi.startswith("pmix") and per_node.isdigit() \
                and int(per_node) > 1:
            out.append(Hit("pmix-topology", "25.11.0", "warning", "launcher", launch.line,
                           launch.text, PMIX_TOPOLOGY, PMIX_TOPOLOGY_FIX))
    return out


PMIX_TOPOLOGY = ("the PMIx server no longer hands its node's hwloc topology to the ranks "
                 "(PMIX_LOCAL_TOPO): each of a node's ranks discovers it itself as it starts "
                 "(a start-up cost per rank that grows with the node's cores and devices; the "
                 "job still runs)")
PMIX_TOPOLOGY_FIX = ("ask the admins for PMIxShareServerTopology=true in mpi.conf (PMIx v4+), "
                     "or use launcher: mpirun")


def _mpirun_cpus_per_task(script: Script, facts: SlurmFacts) -> list[Hit]:
    """22.05's srun ignored SLURM_CPUS_PER_TASK; from 23.11 it reads it again, and a CPU count
    implies --exact (src/srun/launch.c). mpirun's daemons start through an srun of one task
    per node inside the job: that step then holds cpus_per_task CPUs of each node, and with
    task/cgroup all of a node's ranks, children of its daemon, share them."""
    per_node, cpus = script.last("ntasks-per-node"), script.last("cpus-per-task")
    if "task/cgroup" not in facts.config.get("TaskPlugin", "") or per_node is None \
            or not (per_node.value or "").isdigit() or int(per_node.value) < 2:
        return []
    if any("external-launcher" in line or "SLURM_EXTERNAL_LAUNCHER" in line
           for line in script.lines):
        return []
    c = cpus.value if cpus is not None else "1"
    return [Hit("mpirun-cpus-per-task", "23.11.0", "warning", "launcher", launch.line,
                launch.text, f"the srun that starts {launch.words[0]}'s daemons reads "
                f"SLURM_CPUS_PER_TASK={c} and implies --exact: each node's {per_node.value} ranks "
                f"share that step's {c} CPU(s) (task/cgroup confines them)",
                "have the daemons' srun take the whole allocation with --external-launcher: "
                "Open MPI: mpi.mca: {plm_slurm_args: --external-launcher} in the site profile; "
                "MPICH: HYDRA_LAUNCHER_EXTRA_ARGS, Intel MPI: "
                "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS set to it; or use launcher: srun")
            for launch in script.launches if launch.words[0] in ("mpirun", "mpiexec")][:1]


def _exclusive_and_oversubscribe(script: Script, facts: SlurmFacts) -> list[Hit]:
    ex, over = script.last("exclusive"), script.last("oversubscribe")
    if not (ex and over):
        return []
    later = max((ex, over), key=lambda o: o.line)
    return [Hit("exclusive-and-oversubscribe", "23.02.0", "error", "resources.exclusive",
                later.line, _header_line(script, later),
                "sbatch stops with \"--exclusive and --oversubscribe options are mutually "
                "exclusive\" (before 23.02 the later one won)",
                "keep one: resources.exclusive, or oversubscribe in resources.extra_sbatch")]


def _constraint_counts(script: Script, facts: SlurmFacts) -> list[Hit]:
    """The controller's feature parser (src/slurmctld/job_scheduler.c, commit 7f915cc63d)."""
    o = script.last("constraint")
    value, depth, outside = (o.value or "") if o else "", 0, False
    for c in value:
        depth += (c == "[") - (c == "]")
        outside = outside or (c == "*" and depth == 0)
    features = [f for f in re.split(r"[&|,\[\]()]", re.sub(r"\*\d+", "", value)) if f]
    if not (outside and len(features) > 1):
        return []
    return [Hit("constraint-counts-outside-brackets", "23.02.0", "error", "resources.constraint",
                o.line, _header_line(script, o),
                "the controller refuses the job (Invalid feature specification): node counts "
                "(FEATURE*N) with more than one feature must stand inside square brackets",
                f"write resources.constraint: \"[{value}]\" (or the partition's constraint)")]


def _cpus_per_gpu(script: Script, facts: SlurmFacts) -> list[Hit]:
    per_gpu, per_task = script.last("cpus-per-gpu"), script.last("cpus-per-task")
    if not (per_gpu and per_task):
        return []
    return [Hit("cpus-per-gpu-and-cpus-per-task", "23.11.0", "error",
                "resources.extra_sbatch.cpus-per-gpu", per_gpu.line, _header_line(script, per_gpu),
                "sbatch stops with \"--cpus-per-task, --tres-per-task=cpu:#, and --cpus-per-gpu "
                f"are mutually exclusive\" (hpcsuite writes --cpus-per-task on line {per_task.line})",
                "drop cpus-per-gpu from resources.extra_sbatch and give resources.cpus_per_task")]


def _export_file(script: Script, facts: SlurmFacts) -> list[Hit]:
    o = script.last("export-file")
    if o is None:
        return []
    return [Hit("export-file-removed", "23.11.0", "error", "template",
                o.line, _header_line(script, o),
                "sbatch has no --export-file option any more (removed with the Moab integration)",
                "put the variables in the job's env: (exported by the script)")]


def _hint_with_layout(script: Script, facts: SlurmFacts) -> list[Hit]:
    hint = script.last("hint")
    layout = [o for o in (script.last("cores-per-socket"), script.last("sockets-per-node")) if o]
    if not (hint and layout):
        return []
    return [Hit("hint-with-layout", "25.11.0", "warning", "resources.extra_sbatch.hint", hint.line,
                _header_line(script, hint),
                f"sbatch ignores --hint next to --{layout[0].name} (line {layout[0].line}): "
                "they are mutually exclusive",
                f"keep either hint or {layout[0].name} in resources.extra_sbatch")]


# (rule, the release it applies from, which version decides: client or server)
RULES = (
    (_exclusive_and_oversubscribe, (23, 2, 0), "client"),
    (_constraint_counts, (23, 2, 0), "server"),
    (_cpus_per_gpu, (23, 11, 0), "client"),
    (_export_file, (23, 11, 0), "client"),
    (_mpirun_cpus_per_task, (23, 11, 0), "client"),
    (_cpu_bind_rank, (24, 11, 0), "client"),
    (_signal_reservation, (24, 11, 1), "server"),
    (_pmix_topology, (25, 11, 0), "server"),
    (_hint_with_layout, (25, 11, 0), "client"),
    (_gres_and_gpus_per_node, (26, 5, 0), "client"),
)


def script_hits(text: str, facts: SlurmFacts) -> list[Hit]:
    """Every rule that applies to ``facts``' Slurm and fires on the rendered script ``text``."""
    script = read_script(text, facts.client)
    out: list[Hit] = []
    for rule, since, side in RULES:
        if (facts.client if side == "client" else facts.server) >= since:
            out += rule(script, facts)
    return sorted(out, key=lambda h: h.line)


def pmix_topology_note(facts: SlurmFacts) -> str | None:
    """What doctor says of a Slurm from 25.11 whose PMIx server keeps its topology to itself
    (None: older, or PMIxShareServerTopology is set)."""
    if facts.server < (25, 11, 0) or \
            facts.config.get("PMIxShareServerTopology", "no").lower() in ("yes", "true", "1"):
        return None
    return (f"srun --mpi=pmix on Slurm {dotted(facts.server)}: {PMIX_TOPOLOGY}; "
            f"{PMIX_TOPOLOGY_FIX}")
