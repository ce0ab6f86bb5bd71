"""`hpcsuite cluster`: the project's own local two-node Slurm cluster."""

from __future__ import annotations

import click

from . import emit_json, main


def _cluster(port, gpus: int = 0):
    from ..site.cluster import DEFAULT_PORT, LocalCluster, cluster_dir

    return LocalCluster(cluster_dir(), port=port or DEFAULT_PORT, gpus=gpus)


port_option = click.option("--port", type=click.IntRange(1024, 65000), default=None,
                           help="slurmctld port; the two slurmd use the next two (default 16817).")


@main.group()
def cluster():
    """A local Slurm cluster (munge, MariaDB + slurmdbd for accounting, slurmctld, two
    virtual nodes) for demos and tests.

    State, config, database and logs live in $HPCSUITE_CLUSTER_DIR
    (default /var/lib/hpcsuite/cluster, which every account can read: jobs run as the
    user who submits them); /etc/slurm and the system's MariaDB are never touched. Point your shell (Slurm's commands and hpcsuite) at it with
    eval "$(hpcsuite cluster env)": SLURM_CONF, and HPCSUITE_PROFILE for the cluster's own
    site profile (its partitions).
    """


@cluster.command()
@port_option
@click.option("--timeout", type=float, default=60, show_default=True,
              help="Seconds to wait for both nodes to be idle.")
@click.option("--gpus", type=click.IntRange(0, 8), default=0, show_default=True,
              help="GPUs per node declared to Slurm (gres gpu), backed by device files the "
                   "cluster makes in its own directory (nothing under /dev): jobs get "
                   "CUDA_VISIBLE_DEVICES from Slurm as on a GPU cluster, with no GPU here. "
                   "Each node then has one core per GPU. Changing it needs `cluster down`.")
def up(port, timeout, gpus):
    """Start the cluster (harmless when it already runs)."""
    c = _cluster(port, gpus)
    for note in c.up(timeout=timeout):
        click.echo(note)
    click.echo(f"nodes: {', '.join(f'{n}={s}' for n, s in c.node_states().items())}"
               + (f"; {c.declared_gpus()} GPUs each (gres gpu)" if c.declared_gpus() else ""))
    click.echo("accounting: " + ("slurmdbd + MariaDB (sacct works)" if c.accounting else
                                 "off (install Debian's slurmdbd and mariadb-server for sacct)"))
    click.echo('for your shell: eval "$(hpcsuite cluster env)"')


@cluster.command()
def down():
    """Stop every daemon the cluster started."""
    for note in _cluster(None).down():
        click.echo(note)


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status_(as_json):
    """Show which daemons run and the node states."""
    c = _cluster(None)
    daemons = c.states()
    nodes = c.node_states()
    if as_json:
        emit_json({"dir": str(c.root), "daemons": daemons, "nodes": nodes, "up": c.running()})
        return
    click.echo(f"cluster directory: {c.root}")
    for name, pid in daemons.items():
        click.echo(f"  {name:14} {'running (pid %d)' % pid if pid else 'stopped'}")
    if nodes:
        click.echo("nodes: " + ", ".join(f"{n}={s}" for n, s in nodes.items()))


@cluster.command()
def env():
    """Print the exports that point a shell at the cluster (SLURM_CONF, HPCSUITE_PROFILE).

    Use as: eval "$(hpcsuite cluster env)"."""
    import shlex

    for name, value in _cluster(None).client_env().items():
        click.echo(f"export {name}={shlex.quote(value)}")
