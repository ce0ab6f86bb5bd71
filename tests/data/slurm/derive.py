"""Writes the fixtures of the Slurm releases this machine cannot run, from the one it can.

22.05.8/ was recorded on the local cluster (`sbatch --version`, `scontrol show config`,
`srun --mpi=list`, 2026-11-28). Each later release's files are that output with what its
source (github.com/SchedMD/slurm at the tag named below) prints differently: the version line
(upstream builds say "slurm X", Debian's "slurm-wlm X"), SLURM_VERSION, defaults that changed
(TreeWidth 50 -> 16 in 23.11), the MPI plugin section of src/plugins/mpi/pmix/mpi_pmix.c
(PMIxShareServerTopology from 25.11), and the site settings each fixture stands for (a site
with task/cgroup; 26.05: a site with preemption and a shared PMIx topology). Run it from the
repository root after changing it: python tests/data/slurm/derive.py
"""

from pathlib import Path

HERE = Path(__file__).parent
BASE = (HERE / "22.05.8" / "scontrol-show-config.txt").read_text()

# release: (tag, sbatch --version, {key: value} to change, share topology (None: no such key))
RELEASES = {
    "23.02.7": ("slurm-23-02-7-1", "slurm 23.02.7", {}, None),
    "23.11.10": ("slurm-23-11-10-1", "slurm 23.11.10", {}, None),
    "24.05.8": ("slurm-24-05-8-1", "slurm 24.05.8", {}, None),
    # Debian 13's: its sbatch --version, run in the Debian 13 root (scripts/debian13.sh), says so
    "24.11.5": ("slurm-24-11-5-1", "slurm-wlm 24.11.5", {}, None),
    "25.05.5": ("slurm-25-05-5-1", "slurm 25.05.5", {}, None),
    "25.11.2": ("slurm-25-11-2-1", "slurm 25.11.2", {}, "no"),
    "26.05.3": ("slurm-26-05-3-1", "slurm 26.05.3",
                {"PreemptMode": "REQUEUE", "PreemptType": "preempt/partition_prio"}, "yes"),
}
SITE = {"TaskPlugin": "task/affinity,task/cgroup", "ProctrackType": "proctrack/cgroup",
        "TaskPluginParam": "(null type)"}


def derive(version: str, changes: dict, share: str | None) -> str:
    values = {**SITE, "SLURM_VERSION": version, "TreeWidth": "16", **changes}
    out = []
    for line in BASE.splitlines():
        key = line.split("=", 1)[0].strip() if "=" in line else None
        if key in values:
            line = f"{key:<23} = {values[key]}"
        if key == "PMIxTimeout" and share is not None:
            out.append(f"{'PMIxShareServerTopology':<23} = {share}")
        out.append(line)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    for version, (tag, banner, changes, share) in RELEASES.items():
        d = HERE / version
        d.mkdir(exist_ok=True)
        (d / "sbatch-version.txt").write_text(banner + "\n")
        (d / "scontrol-show-config.txt").write_text(derive(version, changes, share))
        (d / "SOURCE").write_text(f"derived by ../derive.py from ../22.05.8 and {tag}\n")
