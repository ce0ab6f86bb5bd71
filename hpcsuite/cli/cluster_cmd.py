"""`hpcsuite cluster`: the project's own local Slurm cluster (2 nodes, or up to 64)."""

from __future__ import annotations

import click

from . import emit_json, main


def _cluster(port, gpus: int = 0, fabric: str | None = None, nodes: int | None = None):
    from ..site.cluster import DEFAULT_PORT, LocalCluster, cluster_dir

    return LocalCluster(cluster_dir(), port=port or DEFAULT_PORT, gpus=gpus, fabric=fabric,
                        nodes=nodes)


def _running_fabric():
    """(cluster, its fabric) of the running cluster started with --fabric; else one line."""
    from ..errors import UserError

    c = _cluster(None)
    f = c.fabric_running()
    if f is None or not c.running():
        raise UserError(f"the local cluster ({c.root}) is not running with a fabric: start it "
                        "with `hpcsuite cluster up --fabric RATE`")
    return c, f


port_option = click.option("--port", type=click.IntRange(1024, 65000), default=None,
                           help="slurmctld port (default 16817); node1's and node2's slurmd use "
                                "the next two, MariaDB and slurmdbd the two after, node3 and "
                                "later the ports after those.")


@main.group()
def cluster():
    """A local Slurm cluster (munge, MariaDB + slurmdbd for accounting, slurmctld, 2 to 64
    virtual nodes) for demos, tests and scale benchmarks.

    State, config, database and logs live in $HPCSUITE_CLUSTER_DIR
    (default /var/lib/hpcsuite/cluster, which every account can read: jobs run as the
    user who submits them); /etc/slurm and the system's MariaDB are never touched. Point your shell (Slurm's commands and hpcsuite) at it with
    eval "$(hpcsuite cluster env)": SLURM_CONF, and HPCSUITE_PROFILE for the cluster's own
    site profile (its partitions).
    """


@cluster.command()
@port_option
@click.option("--timeout", type=float, default=60, show_default=True,
              help="Seconds to wait for every node to be idle.")
@click.option("--nodes", type=click.IntRange(2, 64), default=None,
              help="Virtual nodes, each a slurmd of its own with 1 core (or one a GPU), "
                   "pinned in turn to this machine's cores  [default: 2, or as many as the "
                   "cluster had]. Changing it needs `cluster down`.")
@click.option("--gpus", type=click.IntRange(0, 8), default=0, show_default=True,
              help="GPUs per node declared to Slurm (gres gpu), backed by device files the "
                   "cluster makes in its own directory (nothing under /dev): jobs get "
                   "CUDA_VISIBLE_DEVICES from Slurm as on a GPU cluster, with no GPU here. "
                   "Each node then has one core per GPU. Changing it needs `cluster down`.")
@click.option("--fabric", metavar="RATE", default=None,
              help="Run each node (its slurmd and all a job starts there) in a network "
                   "namespace of its own with its own address, joined to the controller by "
                   "links shaped to RATE both ways (tc tbf; e.g. 1gbit, 250mbit), so MPI's "
                   "traffic between the nodes crosses a real, rate-limited link. Needs root. "
                   "Without it the nodes talk over loopback. `cluster fabric RATE` changes "
                   "the rate of a running cluster.")
def up(port, timeout, gpus, fabric, nodes):
    """Start the cluster (harmless when it already runs)."""
    if fabric is not None:
        from ..site.fabric import rate_bps

        rate_bps(fabric)
    c = _cluster(port, gpus, fabric, nodes)
    for note in c.up(timeout=timeout):
        click.echo(note)
    click.echo(f"nodes: {', '.join(f'{n}={s}' for n, s in c.node_states().items())}"
               + (f"; {c.declared_gpus()} GPUs each (gres gpu)" if c.declared_gpus() else ""))
    click.echo(f"network: {c.fabric_words()}")
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
    f = c.fabric_running()
    rates = f.shaped_rates() if f is not None else {}
    links = None if f is None else {
        n: {"addr": f.addr(n), "interface": f.host_if(n), "up": f.link_up(n),
            "rate": rates[n], **{f"{k}_bytes": v for k, v in f.counters(n).items()}}
        for n in f.nodes}
    if as_json:
        emit_json({"dir": str(c.root), "daemons": daemons, "nodes": nodes, "up": c.running(),
                   "fabric": None if f is None else {"rate": f.rate, "links": links}})
        return
    click.echo(f"cluster directory: {c.root}")
    for name, pid in daemons.items():
        click.echo(f"  {name:14} {'running (pid %d)' % pid if pid else 'stopped'}")
    if nodes:
        click.echo("nodes: " + ", ".join(f"{n}={s}" for n, s in nodes.items()))
    click.echo(f"network: {c.fabric_words()}")
    for n, link in (links or {}).items():
        click.echo(f"  {n}: {link['addr']} via {link['interface']}, "
                   f"{'up' if link['up'] else 'DOWN'}, shaped to {link['rate'] or 'nothing'}; "
                   f"sent {link['tx_bytes']} B, received {link['rx_bytes']} B")


@cluster.command("fabric")
@click.argument("rate")
@click.option("--node", "nodes", multiple=True, metavar="NODE",
              help="Shape only this node's link (repeatable), e.g. one node on a link ten "
                   "times slower than the others'. Default: every node's.")
def fabric_(rate, nodes):
    """Shape both ends of every node's link to RATE (e.g. 100mbit), on the running cluster
    started with `cluster up --fabric`. Jobs running go on at the new rate. The site
    profile keeps the rate the cluster was started with (what preflight.fabric checks)."""
    from ..errors import UserError
    from ..site.fabric import rate_bps

    rate_bps(rate, "cluster fabric")
    _, f = _running_fabric()
    for node in nodes:
        if node not in f.nodes:
            raise UserError(f"cluster fabric --node {node!r}: the nodes are {', '.join(f.nodes)}")
    f.shape(rate, nodes or None)
    click.echo(f"links of {', '.join(nodes or f.nodes)} shaped to {rate} both ways "
               f"(started at {f.rate})")


@cluster.command("link")
@click.argument("node")
@click.argument("state", type=click.Choice(["down", "up"]))
def link(node, state):
    """Take NODE's link down (nothing passes either way: a node that lost its network) or
    bring it back up, on the running cluster started with `cluster up --fabric`."""
    from ..errors import UserError

    c, f = _running_fabric()
    if node not in f.nodes:
        raise UserError(f"cluster link {node!r}: the nodes are {', '.join(f.nodes)}")
    f.set_link(node, state == "up")
    click.echo(f"{node}'s link ({f.host_if(node)}) is {state}")
    if state == "up" and c.resume_unresponsive(node):
        click.echo(f"Slurm had set {node} DOWN (not responding): resumed, as an admin does "
                   "once a link is mended")


@cluster.command()
def env():
    """Print the exports that point a shell at the cluster (SLURM_CONF, HPCSUITE_PROFILE).

    Use as: eval "$(hpcsuite cluster env)"."""
    import shlex

    for name, value in _cluster(None).client_env().items():
        click.echo(f"export {name}={shlex.quote(value)}")
