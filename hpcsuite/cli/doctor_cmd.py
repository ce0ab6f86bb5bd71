"""`doctor`: the cluster checked against the site profile before a job is sent to it."""

from __future__ import annotations

import click

from . import FilePath, emit_json, main, profile_option, remote_option


@main.command()
@click.argument("spec", required=False, type=FilePath(dir_okay=False))
@profile_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--no-compute", is_flag=True,
              help="Skip the compute-node probe (an srun that imports the frameworks there).")
@remote_option
def doctor(spec, profile_path, as_json, no_compute):
    """Check the cluster against the site profile before a job finds out.

    \b
    profile     the site profile says pinned: true but is not /etc/hpcsuite/profile.yaml,
                so pinning does nothing (a warning; no line when all is well)
    slurm       the controller answers; the profile's partitions exist and are up
    slurm-rules Slurm's version (sbatch and controller) and what changed since 22.05 on
                the profile's scripts (or SPEC's): options removed or now refused
    accounting  sacct answers (slurmdbd): finished jobs stay findable (warns without)
    pmi         srun --mpi=list has the profile's mpi.srun_mpi
    mpi         the flavour's launcher (mpirun or mpiexec): MPI family and version
    horovod     Horovod's build as horovodrun --check-build marks it (asked of
                horovod.torch and horovod.tensorflow, seconds instead of check-build's
                ~35 s): frameworks, MPI controller, NCCL where the profile has GPU partitions
    horovod-mpi the libmpi that Horovod's library resolves to (ldd) and what it says it is,
                against the launcher on PATH: a Horovod built against another MPI fails
    infiniband  devices, against the profile's pml
    network     interfaces named by NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, UCX_NET_DEVICES
                or the profile's btl/oob_tcp_if_include exist
    gpus        NVIDIA GPUs (NVML, else nvidia-smi); through NVML their health, as a
                job's preflight.gpu judges it: ECC, pending retirement/remapping,
                slowed clocks, other processes
    fabric      the profile's fabric and the busbw preflight.fabric (site) asks, or
                why site cannot be used (the profile names no fabric)
    compute     one srun on a compute node as a job runs there (the partition's account,
                the profile's module_init, modules and setup first): Python, numpy,
                torch, TensorFlow, Horovod, and its GPUs' health

    The slow checks (horovod, horovod-mpi, compute) run side by side; stderr says what
    doctor waits for and when each is done. With SPEC, its launcher, partition and env
    are checked too. Exit 0 when nothing failed (warnings allowed), 1 when a check failed, 2 on bad
    input."""
    from ..submit.config import resolve
    from ..site.doctor import FAIL, report, run_checks
    from ..runner.against_slurm import profile_scripts
    from ..submit.pinning import pinned_in_vain

    # Without a spec only the profile matters; the job layer needs a name to resolve.
    r = resolve(spec, profile_path, () if spec else ("name=doctor",))
    job = r.job if spec else None
    checks = run_checks(r.profile, launcher=job.launcher if job else None,
                        partition=job.resources.partition if job else None,
                        env=dict(job.env) if job else None, compute=not no_compute,
                        progress=lambda text: click.echo(f"doctor: {text}", err=True),
                        scripts=profile_scripts(r, whole_profile=not spec),
                        pinned=pinned_in_vain(profile_path))
    if as_json:
        emit_json([c.to_json() for c in checks])
    else:
        click.echo(report(checks))
    if any(c.status == FAIL for c in checks):
        raise click.exceptions.Exit(1)
