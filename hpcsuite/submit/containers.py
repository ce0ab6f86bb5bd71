"""Ranks in containers: a job names an image (``container.image``), the site profile the
runtime that starts it (``container.runtime``) and the images it allows.

Two models. Apptainer/Singularity and Charliecloud are the *hybrid* model: the host's launcher
(mpirun's daemons, or srun) starts every rank as ``RUNTIME ... IMAGE python -m hpcsuite train``,
so the MPI library inside the image talks to the host's launcher (PMIx) and must be ABI
compatible with the host's MPI (the same OpenMPI major version). Pyxis is Slurm's SPANK plugin:
srun itself puts each rank in the image (``--container-image``) and wires PMIx, so it needs
launcher: srun.

Every container gets the submit directory, the job name's run root (the run directory and the
default checkpoints), every path the job names outside them (data, checkpoints, user code,
absolute or reaching out with ``..``), the site's binds and the job's, each at the same path
inside. Relative paths and ``$RUN_DIR`` are bound through shell variables of the batch script,
so the rendered script does not depend on where it was rendered.
"""

from __future__ import annotations

import re
from typing import ClassVar

from ..errors import UserError
from ..records import Record, record
from ..shell import Raw, quote
from .site_profile import ContainerSite
from .spec import JobSpec

SUBMIT_DIR = Raw('"$SLURM_SUBMIT_DIR"')
RUN_ROOT = Raw('"${RUN_DIR%/*}"')     # OUTPUT_DIR/NAME: the run directory and the checkpoints
# Characters a path bound into a container cannot hold: apptainer and pyxis separate binds
# with ',', every runtime host from guest with ':'.
BIND_UNSAFE = ",:"


# ------------------------------------------------------------------ the site's allow-list

def _glob(pattern: str) -> re.Pattern:
    """A glob whose * and ? stay within one path segment (/images/*.sif is not /images/a/b.sif)."""
    out = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in pattern)
    return re.compile(out)


def image_allowed(image: str, allowed: list[str]) -> bool:
    """Whether ``image`` is on the site's allow-list (empty: any image). An entry is an image,
    a prefix ending in / or # (a directory, a registry), or a glob."""
    if not allowed:
        return True
    for entry in allowed:
        if any(c in entry for c in "*?"):
            if _glob(entry).fullmatch(image):
                return True
        elif image == entry or (entry.endswith(("/", "#")) and image.startswith(entry)):
            return True
    return False


# ------------------------------------------------------------------ what gets bound

def job_paths(job: JobSpec) -> list[tuple[str, str]]:
    """(job key, path) for every host path a rank opens besides the run directory."""
    t = job.train
    out = [("train.data.path", t.data.path),
           ("train.eval.data.path", t.eval.data.path if t.eval and t.eval.data else None),
           ("train.checkpoint.dir", t.checkpoint.dir),
           ("train.monitor.prometheus_dir", t.monitor.prometheus_dir)]
    out += [(f"train.pythonpath[{i}]", p) for i, p in enumerate(t.pythonpath)]
    return [(key, path) for key, path in out if path]


def _outside(path: str) -> bool:
    """Whether ``path`` (relative to the submit directory) may lie outside it."""
    return path.startswith("/") or ".." in path.split("/")


def problems(job: JobSpec, site: ContainerSite) -> list[tuple[str, str]]:
    """(job key, message) for what cannot run in the site's containers."""
    image = job.container.image
    if image is None:
        if job.container.binds:
            return [("container.binds", "binds without container.image: there is no container")]
        return []
    if site.runtime is None:
        return [("container.image", "this site names no container runtime (the site "
                                    "profile's container.runtime); ranks run on the host only")]
    out = []
    if not image_allowed(image, site.allowed_images):
        out.append(("container.image", f"{image!r} is not an image this site allows; it "
                                       f"allows: {', '.join(site.allowed_images)}"))
    if site.runtime == "pyxis" and job.launcher != "srun":
        out.append(("launcher", "the site's container runtime pyxis starts ranks through srun "
                                "(--container-image); set launcher: srun"))
    for key, path in job_paths(job):
        bad = next((c for c in BIND_UNSAFE if c in path), None)
        if bad and _outside(path):
            out.append((key, f"{path!r} is bound into the container, and a bound path cannot "
                             f"hold {bad!r}"))
    return out


@record
class Bind(Record):
    """One bind mount of a container: host path to guest path."""
    host: object      # a quoted shell word (Raw) or a plain path
    guest: object

    def pair(self) -> Raw:
        """HOST:GUEST as one shell word."""
        return Raw(f"{quote(self.host)}:{quote(self.guest)}")

    def word(self) -> Raw:
        """HOST alone when it is bound at the same path, else HOST:GUEST."""
        return Raw(quote(self.host)) if self.host == self.guest else self.pair()


def binds(job: JobSpec, site: ContainerSite) -> list[Bind]:
    """The submit directory and run root, paths the job names outside them, then the site's
    and the job's binds; each once."""
    out = [Bind(SUBMIT_DIR, SUBMIT_DIR), Bind(RUN_ROOT, RUN_ROOT)]
    for _, path in job_paths(job):
        if path.startswith("/"):
            out.append(Bind(path, path))
        elif _outside(path):
            word = Raw(f'"$SLURM_SUBMIT_DIR"/{quote(path)}')
            out.append(Bind(word, word))
    for text in (*site.binds, *job.container.binds):
        host, _, guest = text.partition(":")
        out.append(Bind(host, guest or host))
    return list({(str(b.host), str(b.guest)): b for b in reversed(out)}.values())[::-1]


# ------------------------------------------------------------------ the runtimes

@record
class ContainerLaunch(Record):
    """How a rank starts inside the site's container runtime."""
    command: tuple[object, ...]          # what the launcher starts on every rank
    srun_options: tuple[object, ...] = ()  # options srun itself needs (pyxis)
    setup: tuple[Raw, ...] = ()          # batch-script lines before the launch
    env_names: tuple[str, ...] = ()      # variables mpirun must pass on (-x)


GUARD = Raw('case "$SLURM_SUBMIT_DIR" in *[,:]*) echo "hpcsuite: the submit directory '
            '$SLURM_SUBMIT_DIR holds , or :, which a container bind cannot name" >&2; exit 2;; esac')


class Runtime:
    name: ClassVar[str]

    def launch(self, job: JobSpec, site: ContainerSite, args: list[object]) -> ContainerLaunch:
        """``args``: what follows the interpreter (-m hpcsuite train --job ...)."""
        raise NotImplementedError


class Apptainer(Runtime):
    """``apptainer exec``: binds as one comma-separated --bind, the submit directory as cwd."""

    name = "apptainer"

    def launch(self, job, site, args):
        bound = ",".join(b.word() for b in binds(job, site))
        return ContainerLaunch(command=(self.name, "exec", "--bind", Raw(bound), "--pwd",
                                        SUBMIT_DIR, *site.options, job.container.image,
                                        site.python, *args), setup=(GUARD,))


class Singularity(Apptainer):
    name = "singularity"


class Charliecloud(Runtime):
    """``ch-run``: one -b per bind (each guest path must exist in the image: ch-run mounts it
    read-only and cannot make a missing mount point), $USER set (ch-run refuses to start
    without it), env passed through."""

    name = "charliecloud"

    def launch(self, job, site, args):
        flags: list[object] = []
        for b in binds(job, site):
            flags += ["-b", b.word()]
        return ContainerLaunch(
            command=("ch-run", *flags, "-c", SUBMIT_DIR, *site.options, job.container.image,
                     "--", site.python, *args),
            setup=(GUARD, Raw('export USER="${USER:-$(id -un)}"')), env_names=("USER",))


class Pyxis(Runtime):
    """srun's pyxis plugin: the image, mounts (HOST:GUEST, comma-separated) and working
    directory are srun options; the command is the image's interpreter."""

    name = "pyxis"

    def launch(self, job, site, args):
        mounts = ",".join(b.pair() for b in binds(job, site))
        return ContainerLaunch(
            command=(site.python, *args),
            srun_options=(f"--container-image={job.container.image}",
                          Raw(f"--container-mounts={mounts}"),
                          Raw(f"--container-workdir={SUBMIT_DIR}"), *site.options),
            setup=(GUARD,))


RUNTIMES: dict[str, type[Runtime]] = {
    cls.name: cls for cls in (Apptainer, Singularity, Charliecloud, Pyxis)}


def launch(job: JobSpec, site: ContainerSite, args: list[object]) -> ContainerLaunch:
    """How the ranks of ``job`` start in its image; refuses what :func:`problems` finds."""
    found = problems(job, site)
    if found:
        key, message = found[0]
        raise UserError(f"{key}: {message}")
    return RUNTIMES[site.runtime]().launch(job, site, args)
