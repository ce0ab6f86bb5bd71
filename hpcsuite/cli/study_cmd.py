"""Scaling studies: study run, status, report, rerun, compare."""

from __future__ import annotations

import time
from pathlib import Path

import click

from . import FilePath, emit_json, main, profile_option, remote_option


@main.group()
def study():
    """Scaling studies: sweep a job over nodes, ranks, batch and Horovod knobs, then explain.

    \b
    A study spec (YAML) names a base job spec and the axes to sweep:
      name: weak-mlp
      base: job.yaml            # relative to the study file
      mode: weak                # weak: batch_size per rank; strong: the global batch
      axes: {nodes: [1, 2], horovod.fusion_threshold_mb: [0, 64]}
      repeats: 2                # jobs per point: the spread of the results
      warmup_steps: 10          # left out of the timing
      steps: 50                 # measured steps per job
    Each configuration also runs without the gradient allreduce (the no-communication
    limit), and each multi-rank allocation runs an allreduce benchmark, so the report can
    say how close each point comes to what the hardware allows, and why.

    \b
      hpcsuite study run STUDY.yaml --wait     # bundle, submit every point, follow them
      hpcsuite study report studies/NAME      # table, CSV, JSON, PNG plots
      hpcsuite study rerun studies/NAME       # the same study again, from the bundle alone
      hpcsuite study compare A B              # inputs and results side by side
    """


def _say(message: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {message}", err=True)


@study.command("run")
@click.argument("target", type=FilePath(exists=True))
@click.option("--dir", "directory", type=FilePath(file_okay=False),
              help="The study directory (default: OUTPUT_DIR/NAME beside the study file).")
@profile_option
@click.option("--wait", is_flag=True, help="Follow the points until every one has ended, "
              "submitting more as jobs finish (max_in_flight at a time).")
@click.option("--timeout", type=float, default=None, help="With --wait: stop following after "
              "SECONDS (the jobs go on; run again to continue).")
@click.option("--dry-run", is_flag=True, help="Make the bundle and check every point against "
              "the site's rules; submit nothing (versions not cached for this installation "
              "are asked by the first real run).")
@remote_option
def run_cmd(target, directory, profile_path, wait, timeout, dry_run):
    """Render and submit every point of TARGET (a study spec, or a study directory to go on).

    The first run makes the study directory: a bundle of the study spec, the base spec's
    directory (spec, user code, data), each point's resolved job spec and rendered script,
    versions and sha256 of every input. Every point is checked against the site's limits
    before anything is submitted. Running it again keeps finished points and submits the
    missing or failed ones (up to 3 attempts each); Ctrl-C loses nothing.
    """
    from ..study.points import StudyDir, create
    from ..study.run import run

    if Path(target).is_dir():
        sd = StudyDir(Path(target))
        sd.points()
    else:
        sd = create(target, directory, profile_path, ask_tools=not dry_run)
    points = sd.points()
    _say(f"study {sd.path.name}: {len(points)} jobs in {sd.path}")
    if dry_run:
        for p in points:
            click.echo(f"{p.id}\t{p.kind}\t{', '.join(f'{k}={v}' for k, v in p.axes.items())}\t"
                       f"{sd.point_script(p)}")
        return
    try:
        done = run(sd, profile_path, wait, timeout, _say)
    except KeyboardInterrupt:
        click.echo(f"interrupted; jobs already submitted go on. `hpcsuite study run {sd.path}` "
                   "picks up where this left off", err=True)
        raise SystemExit(130) from None
    if wait and done.failed:
        from ..errors import JobFailed

        raise JobFailed(f"study {sd.path.name}: {done.failed} point(s) failed {3} times; "
                        f"`hpcsuite study status {sd.path}` lists them")
    if wait:
        click.echo(f"study {sd.path.name} complete; `hpcsuite study report {sd.path}`")
    else:
        click.echo(str(sd.path))


@study.command("status")
@click.argument("target", type=FilePath(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@remote_option
def status_cmd(target, as_json):
    """Where each point of a study is (TARGET: study directory or study spec): the study's
    own status and Slurm's state of the point's job, asked now (state.json's, with a note,
    when Slurm cannot be asked)."""
    from ..study.points import open_study
    from ..study.status import status

    rows, note = status(open_study(target))
    if note:
        click.echo(f"note: {note}", err=True)
    if as_json:
        emit_json(rows)
        return
    click.echo(f"{'point':<10} {'kind':<9} {'job':>8} {'status':<14} {'slurm':<24} axes")
    for r in rows:
        axes = ", ".join(f"{k}={v}" for k, v in r["axes"].items())
        slurm = (r["slurm"] or "-") + (" (state.json)" if r["slurm_from"] == "state.json" else "")
        click.echo(f"{r['point']:<10} {r['kind']:<9} {r['job_id'] or '-':>8} {r['status']:<14} "
                   f"{slurm:<24} {axes}")


@study.command("report")
@click.argument("target", type=FilePath(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the table.")
@remote_option
def report_cmd(target, as_json):
    """Throughput, speedup and efficiency (median, min, max of the repeats) against the
    smallest point (with each swept Horovod knob at its axis's first value) and the
    no-communication limit, the ring-allreduce model's reading of each
    point and the knob that would help most. A configuration whose repeats spread more than
    1.25x, or whose no-communication limit does not grow with the ranks, is FLAGGED instead of
    diagnosed. Versions a study failed to record are warnings. Writes report.{txt,csv,json}
    and throughput.png, efficiency.png into the study's report/ directory."""
    from ..study.points import open_study
    from ..study.report import table, write

    sd = open_study(target)
    report, paths = write(sd)
    if as_json:
        emit_json(report)
        return
    click.echo(table(report))
    click.echo("wrote " + ", ".join(str(p) for p in paths))


@study.command("rerun")
@click.argument("bundle", type=FilePath(exists=True, file_okay=False))
@click.option("--dir", "directory", type=FilePath(file_okay=False),
              help="The new study directory (default: BUNDLE-rerun-TIMESTAMP).")
@profile_option
@click.option("--wait", is_flag=True, help="Follow the points to their end.")
@click.option("--timeout", type=float, default=None, help="With --wait: stop following after SECONDS.")
@remote_option
def rerun_cmd(bundle, directory, profile_path, wait, timeout):
    """Run the study in BUNDLE again, from the bundle alone: its inputs (checked against their
    sha256), its resolved job specs, into a fresh study directory."""
    from ..study.points import rerun
    from ..study.run import run

    sd = rerun(Path(bundle), Path(directory) if directory else None)
    _say(f"re-running {Path(bundle).name} in {sd.path}")
    try:
        run(sd, profile_path, wait, timeout, _say)
    except KeyboardInterrupt:
        click.echo(f"interrupted; `hpcsuite study run {sd.path}` picks up where this left off",
                   err=True)
        raise SystemExit(130) from None
    click.echo(str(sd.path))


@study.command("compare")
@click.argument("a", type=FilePath(exists=True, file_okay=False))
@click.argument("b", type=FilePath(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def compare_cmd(a, b, as_json):
    """What differs between studies A and B: inputs (sha256), resolved job specs, versions, and
    each configuration's throughput, marked where it differs by more than the repeats' spread."""
    from ..study.points import open_study
    from ..study.compare import compare, compare_text

    c = compare(open_study(a), open_study(b))
    if as_json:
        emit_json(c)
    else:
        click.echo(compare_text(c))


_POSITIVE = click.FloatRange(min=0.0, min_open=True)


@study.command("predict")
@click.argument("target", required=False, type=FilePath(exists=True, file_okay=False))
@click.option("--nodes", required=True, metavar="N,N,...", help="Node counts, e.g. 1,2,4,8,16.")
@click.option("--gpus-per-node", type=click.IntRange(1, 1024), default=1, show_default=True)
@click.option("--fabric", metavar="NAME", help="A fabric preset: 10gbe-tcp, 25gbe-tcp, "
              "100gbe-tcp, 25gbe-roce, 100gbe-roce, ib-edr, ib-hdr, ib-ndr; or measured: the "
              "link the study's own allreduce benchmark measured across nodes (MPI's busbw of "
              "1 MiB and larger, its fitted latency) (default: the site profile's `fabric`).")
@click.option("--bandwidth", type=_POSITIVE, help="Instead of --fabric: bus bandwidth between "
              "nodes in GB/s (nccl-tests' busbw of large allreduces).")
@click.option("--latency", type=click.FloatRange(min=0.0), help="With --bandwidth: latency per "
              "ring step in microseconds.")
@click.option("--intra-node", metavar="NAME", help="The link between a node's GPUs: "
              "nvlink-a100 or nvlink-h100 (default: as between nodes).")
@click.option("--params", type=click.IntRange(min=1), help="Without a study: the model's "
              "parameter count (4 bytes of gradient each).")
@click.option("--model-bytes", type=click.IntRange(min=1), help="Without a study: gradient "
              "bytes per step (float32).")
@click.option("--step-ms", type=_POSITIVE, help="Without a study: one GPU's time per "
              "micro-batch (forward, backward, optimizer) in ms.")
@click.option("--throughput", type=_POSITIVE, help="Without a study: one GPU's samples/s "
              "(with --batch) instead of --step-ms.")
@click.option("--batch", type=click.IntRange(min=1), help="Samples per GPU per micro-batch; "
              "with a study, which of its per-rank batches to read (default: the smallest).")
@click.option("--tensors", type=click.IntRange(min=1), help="Gradient tensors per step (lets "
              "the model try fusion off).")
@click.option("--backward-fraction", type=click.FloatRange(0.0, 1.0), default=None,
              help="Share of a step spent in the backward pass, where allreduces overlap "
              "[default: 2/3; with a study whose ranks had one core each, 0, as its report "
              "reads it: the allreduce and the computation take turns on the core].")
@click.option("--cycle-ms", type=click.FloatRange(min=0.0), default=1.0, show_default=True,
              help="Horovod's cycle time.")
@click.option("--fusion-mb", type=click.FloatRange(min=0.0), default=64.0, show_default=True,
              help="Horovod's fusion threshold (0: off).")
@click.option("--fp16", is_flag=True, help="fp16 gradient compression.")
@click.option("--accumulation", type=click.IntRange(1, 4096), default=1, show_default=True,
              help="Micro-batches per allreduce.")
@click.option("--hierarchical", is_flag=True, help="Hierarchical allreduce (rings inside "
              "nodes and across nodes).")
@click.option("--threshold", type=click.FloatRange(0.0, 1.0), default=0.8, show_default=True,
              help="Report the first node count whose efficiency falls under this.")
@click.option("--compute-cv", metavar="CV", help="The coefficient of variation of one rank's "
              "compute per step (0 <= CV < 1): a step waits for the slowest of N ranks. "
              "Default: the study's measured ranks, else 0.0148 (GPU-to-GPU variation, "
              "Sinha et al. arXiv:2208.11035v3).")
@click.option("--csv", "csv_path", type=FilePath(dir_okay=False), help="Write the rows here.")
@click.option("--png", "png_path", type=FilePath(dir_okay=False), help="Write the efficiency "
              "plot here (one line per knob setting).")
@click.option("--json", "as_json", is_flag=True, help="Print the prediction as JSON.")
@profile_option
def predict_cmd(target, nodes, gpus_per_node, fabric, bandwidth, latency, intra_node, params,
                model_bytes, step_ms, throughput, batch, tensors, backward_fraction, cycle_ms,
                fusion_mb, fp16, accumulation, hierarchical, threshold, compute_cv, csv_path,
                png_path, as_json, profile_path):
    """Predict throughput and scaling efficiency at each of --nodes on a described fabric.

    From a measured study (TARGET: its directory: gradient bytes from its results, the step
    time of its smallest no-communication point, and at each node count where it measured a
    no-communication limit that limit's step; a point it reads that the study's report
    FLAGGED is named in a warning) or from --params/--model-bytes and --step-ms/--throughput.
    The model: gradients become ready over the backward pass and go to the wire in
    fusion-threshold buckets at Horovod's cycle ticks, one at a time, each a ring
    allreduce (flat, or hierarchical) costed by the fabric's bandwidth and latency. Each knob
    (fp16, accumulation, fusion, cycle, hierarchical) is also tried alone; the one that helps
    most at the largest node count is named. Every step waits for the slowest rank: the
    expected slowest of N per-rank computations, each varying by --compute-cv.

    \b
      hpcsuite study predict --params 25557032 --throughput 360 --batch 64 \\
          --nodes 1,2,4,8,16,32 --gpus-per-node 8 --fabric ib-hdr --intra-node nvlink-a100
    """
    from ..study.predict import Knobs, predict
    from ..study.predict_basis import basis
    from ..study.predict_io import (fabric_for, parse_cv, parse_nodes, spread_for, table,
                                    workload_for, write)

    node_list, given_cv = parse_nodes(nodes), parse_cv(compute_cv)
    chosen = fabric_for(fabric, bandwidth, latency, intra_node, hierarchical,
                        None if fabric or bandwidth is not None else _site_fabric(profile_path),
                        target)
    workload = workload_for(target, params, model_bytes, step_ms, throughput, batch,
                            backward_fraction, tensors)
    workload, spread_source = spread_for(target, workload, given_cv)
    knobs = Knobs(cycle_ms, fusion_mb, fp16, accumulation, hierarchical)
    if fusion_mb == 0 and not workload.tensors:
        from ..errors import UserError

        raise UserError("--fusion-mb: 0 (fusion off) needs --tensors (how many allreduces)")
    read = basis(target, workload, gpus_per_node, node_list)
    result = predict(workload, node_list, gpus_per_node, chosen, knobs, threshold,
                     spread_source, read["computes"])
    result.update(compute_from=read["compute_from"], flagged=read["flagged"],
                  warnings=read["warnings"])
    paths = write(result, csv_path, None, png_path)
    if as_json:
        emit_json(result)
        return
    click.echo(table(result))
    if paths:
        click.echo("wrote " + ", ".join(str(p) for p in paths))


def _site_fabric(profile_path):
    """The site profile's `fabric`, or None (no profile, or none named there)."""
    from ..study.predict_io import profile_fabric

    return profile_fabric(profile_path)
