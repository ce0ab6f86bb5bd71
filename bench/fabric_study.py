"""Scaling studies, `study predict` and Horovod's knobs on the local cluster's shaped link
(`cluster up --fabric RATE`, issue 44, points 3 and 4).

    .venv/bin/python bench/fabric_study.py studies --rate 250mbit [--sizes 1mb,8mb] [-r 2]
    .venv/bin/python bench/fabric_study.py knobs --rate 250mbit [--size 8mb] [-r 3]
    .venv/bin/python bench/fabric_study.py table
    (all: [--dir DIR] [--port P] [--budget S])

The workload is the built-in MLP (flatten -> 64 -> 64 -> 10) on synthetic samples whose width
sets the gradient: 4096 inputs give 1.07 MB of float32 gradients, 32768 give 8.41 MB.

studies: per size, a weak-scaling study 1 -> 2 nodes (one rank each, `hpcsuite study run
--wait`: training points, their no-communication limits, an allreduce benchmark) on a private
fabric cluster at RATE, into DIR/RATE-SIZE, then the table.

knobs: on 2 nodes at RATE, the study's configuration (DIR/RATE-SIZE must exist) and each knob
changed alone, in rounds (every setting once per round, back to back, each round starting at
another): fp16 compression, accumulation 2 and 4, fusion off, cycle 0.5 and 5 ms. Printed:
each knob's measured speed-up (median samples/s over the baseline's), `study predict`'s (the
study with its measured busbw and the knob's option) and the study report's advice's for the
2-node point; the advice's first knob (a bigger batch) is measured as its accumulation twin.
Written to DIR/knobs-RATE-SIZE.json.

table: for every study under DIR: the measured efficiency at 2 nodes; the report's α-β
reading (the limit's step plus the fitted allreduce of the gradient, against the measured
step); the report's step model; `study predict DIR --bandwidth B --latency A` from the 1-node
step and the study's measured MPI busbw; and for every other study of the same size, the
prediction from that study's 1-node step at this study's busbw (the cross-rate prediction).
Errors are in points of efficiency (predicted - measured) and, for steps, in per cent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from budget import Budget, run_group
from fabric_link import cli, fabric_cluster

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "hpcsuite"]
SIZES = {"1mb": 4096, "8mb": 32768}          # gradient size -> the MLP's input width
BATCH = {"1mb": 512, "8mb": 256}             # per-rank batch: compute of the same order as the link
SAMPLES = {"1mb": 8192, "8mb": 2048}         # 128 and 256 MB of samples per node

JOB = """name: fab{size}
resources: {{nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: "00:10:00"}}
train:
  backend: torch
  model: mlp
  data: {{kind: synthetic, samples: {samples}, shape: [{width}], classes: 10}}
  batch_size: {batch}
  lr: 0.01
"""

STUDY = """name: {name}
base: job.yaml
mode: weak
axes: {{nodes: [1, 2]}}
repeats: {repeats}
warmup_steps: {warmup}
steps: {steps}
output_dir: .
"""

KNOBS = {                       # label -> (job overrides, `study predict` options)
    "baseline": ([], []),
    "fp16 compression": (["train.horovod.compression=fp16"], ["--fp16"]),
    "accumulation 2": (["train.grad_accumulation=2"], ["--accumulation", "2"]),
    "accumulation 4": (["train.grad_accumulation=4"], ["--accumulation", "4"]),
    "fusion off": (["train.horovod.fusion_threshold_mb=0"], ["--fusion-mb", "0"]),
    "cycle 0.5 ms": (["train.horovod.cycle_time_ms=0.5"], ["--cycle-ms", "0.5"]),
    "cycle 5 ms": (["train.horovod.cycle_time_ms=5"], ["--cycle-ms", "5"]),
}


def write_inputs(where: Path, size: str, name: str, repeats: int, warmup: int, steps: int):
    where.mkdir(parents=True, exist_ok=True)
    (where / "job.yaml").write_text(JOB.format(size=size, samples=SAMPLES[size],
                                               width=SIZES[size], batch=BATCH[size]))
    (where / "study.yaml").write_text(STUDY.format(name=name, repeats=repeats, warmup=warmup,
                                                   steps=steps))


def study_dir(base: Path, rate: str, size: str) -> Path:
    return base / f"{rate}-{size}" / f"{rate}-{size}"


def node_sysctls(cluster, settings: list[str]) -> None:
    """``--sysctl KEY=VALUE`` in each node's network namespace (net.* keys are per namespace)."""
    for node in cluster.fabric.nodes:
        for setting in settings:
            subprocess.run(["ip", "netns", "exec", cluster.fabric.netns(node), "sysctl", "-q",
                            "-w", setting], check=True)


def studies(args, budget: Budget) -> int:
    sizes = args.sizes.split(",")
    with budget.watch(), fabric_cluster(args.port, args.rate) as (cluster, env, _root):
        node_sysctls(cluster, args.sysctl)
        for size in budget.each(sizes):
            where = args.dir / f"{args.rate}-{size}"
            if study_dir(args.dir, args.rate, size).is_dir():
                print(f"{where}: already measured; remove it to measure again", file=sys.stderr)
                continue
            write_inputs(where, size, f"{args.rate}-{size}", args.repeats, args.warmup,
                         args.steps)
            start = time.monotonic()
            done = run_group([*CLI, "study", "run", "study.yaml", "--wait"], env=env, cwd=where,
                             capture_output=True, text=True, timeout=1200)
            print(f"study {args.rate}-{size}: exit {done.returncode} in "
                  f"{time.monotonic() - start:.0f} s", file=sys.stderr)
            if done.returncode != 0:
                print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
    budget.report(sum(study_dir(args.dir, args.rate, s).is_dir() for s in sizes), len(sizes),
                  "studies")
    print(table_text(args.dir))
    return budget.exit_code()



def report_of(sd: Path) -> dict:
    done = subprocess.run([*CLI, "study", "report", str(sd), "--json"], capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"study report {sd}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def link_of(sd: Path):
    """The link the study's own allreduce benchmark measured (`study predict --fabric
    measured`): MPI's busbw of large allreduces and its fitted per-step latency."""
    from hpcsuite.errors import UserError
    from hpcsuite.study.predict_io import measured_fabric

    try:
        return measured_fabric(str(sd)).inter
    except UserError:
        return None


def predicted(sd: Path, link=None, *options: str, nodes: str = "1,2") -> dict:
    """`study predict` of the study at ``link`` (a Link), or else at its own measured one."""
    given = ["--bandwidth", f"{link.bandwidth_GBps:.6g}", "--latency", f"{link.latency_us:.6g}"] \
        if link is not None else ["--fabric", "measured"]
    argv = [*CLI, "study", "predict", str(sd), "--nodes", nodes, *given, "--json", *options]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"study predict {sd}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def two_node(report: dict) -> dict | None:
    return next((r for r in report["rows"] if r["ranks"] == 2), None)


def table_text(base: Path) -> str:
    found = sorted(p.parent for p in base.glob("*/*/points.json"))
    if not found:
        return f"no study under {base}"
    info = {}
    for sd in found:
        rate, size = sd.name.rsplit("-", 1)
        report, fit = report_of(sd), link_of(sd)
        info[sd] = (rate, size, report, fit, two_node(report))
    lines = ["2 nodes against 1 (one rank each), the built-in MLP; eff: efficiency, "
             "pts: points of efficiency, predicted - measured", "",
             f"{'study':>13} {'busbw MB/s':>10} {'1-node ms':>9} {'2-node ms':>9} "
             f"{'limit ms':>8} {'eff':>6} {'α-β step':>9} {'err':>7} {'model step':>10} "
             f"{'err':>7} {'predict eff':>11} {'pts':>6}"]
    for sd, (rate, size, report, fit, row) in info.items():
        one = next((r for r in report["rows"] if r["ranks"] == 1), None)
        if row is None or fit is None or not row["efficiency"]:
            lines.append(f"{sd.name:>13} (not measured)")
            continue
        m = row["model"] or {}
        ab = (row["limit_step_s"]["median"] or 0) + m.get("predicted_comm_s", 0)
        step = row["step_s"]["median"]
        eff = predicted(sd)["series"]["current"][-1]["efficiency"]
        model_step = row.get("predicted_step_s")
        lines.append(
            f"{sd.name:>13} {fit.bandwidth_Bps / 1e6:10.1f} {one['step_s']['median'] * 1e3:9.1f} "
            f"{step * 1e3:9.1f} {row['limit_step_s']['median'] * 1e3:8.1f} "
            f"{row['efficiency']:6.3f} {ab * 1e3:9.1f} {(ab - step) / step:+7.1%} "
            + (f"{model_step * 1e3:10.1f} {(model_step - step) / step:+7.1%} "
               if model_step else f"{'-':>10} {'-':>7} ")
            + f"{eff:11.3f} {(eff - row['efficiency']) * 100:+6.1f}")
    cross = []
    for sd, (rate, size, report, fit, row) in info.items():
        for other, (orate, osize, _, ofit, orow) in info.items():
            if other == sd or osize != size or orow is None or ofit is None or row is None:
                continue
            eff = predicted(sd, ofit)["series"]["current"][-1]["efficiency"]
            cross.append(f"{sd.name:>13} -> {orate:>8}: predicted {eff:.3f}, measured "
                         f"{orow['efficiency']:.3f} ({(eff - orow['efficiency']) * 100:+.1f} pts)")
    if cross:
        lines += ["", "cross-rate: the 1-node step of one study at the other rate's measured busbw",
                  *cross]
    return "\n".join(lines)


def table(args, budget: Budget) -> int:
    print(table_text(args.dir))
    return 0


def throughput(results: dict, warmup: int, steps: int) -> float | None:
    from hpcsuite.study.report import throughput as measured

    got = measured(results, warmup, steps)
    return got[0] if got else None


def advised(row: dict | None) -> tuple[list[str], dict[str, float], int | None]:
    """The study report's advice for its 2-node point: the knobs it names, best first; the
    speed-up over now it predicts for each measured setting it covers (the fraction of the
    no-communication limit it predicts over the measured one); the accumulation it advises."""
    from hpcsuite.study.advice import scale_to_reach

    m = (row or {}).get("model") or {}
    options = m.get("knobs") or []
    if not options:
        return [], {}, None
    now, c, o = m["now_of_limit"], m["compute_s"], m["measured_overhead_s"]
    names = [k["knob"] for k in options]
    k = scale_to_reach(c, o)
    out = {f"accumulation {n}": n * c / (n * c + o) / now for n in (2, 4, k)}
    for option in options:
        if option["knob"] == "train.horovod.compression":
            out["fp16 compression"] = option["of_limit"] / now
        elif option["knob"] == "train.horovod.cycle_time_ms":
            cycle = option["how"].split(":")[0]
            out[f"cycle {cycle} ms"] = option["of_limit"] / now
        elif option["knob"] == "train.horovod.fusion_threshold_mb":
            out["fusion off"] = 1.0           # it advises fusing more, never less
    return names, out, k


def knobs(args, budget: Budget) -> int:
    sd = study_dir(args.dir, args.rate, args.size)
    if not sd.is_dir():
        raise SystemExit(f"{sd}: no study at {args.rate} of {args.size}; run `studies` first")
    report, fit = report_of(sd), link_of(sd)
    names, advice, k = advised(two_node(report))
    settings = dict(KNOBS)
    first = None
    if k and names and names[0] in ("train.batch_size", "train.grad_accumulation"):
        # The advice's first knob, measured as its memory-free twin: k micro-batches per
        # allreduce is k times the computation for the same allreduce, as k times the batch.
        first = f"accumulation {k}"
        settings.setdefault(first, ([f"train.grad_accumulation={k}"],
                                    ["--accumulation", str(k)]))
    labels = list(settings)
    measured: dict[str, list[float]] = {k: [] for k in labels}
    base = sd.parent / "job.yaml"
    steps, warmup = args.steps, args.warmup
    rounds = list(range(args.repeats))
    with budget.watch(), fabric_cluster(args.port, args.rate) as (cluster, env, root):
        node_sysctls(cluster, args.sysctl)
        for r in budget.each(rounds):
            order = labels[r % len(labels):] + labels[:r % len(labels)]
            for label in order:
                sets = [*settings[label][0], "resources.nodes=2", f"output_dir={root}/runs",
                        f"train.max_steps={warmup + steps}", "train.epochs=1000000"]
                argv = ["submit", str(base), "--wait", "--json",
                        *[a for s in sets for a in ("--set", s)]]
                done = cli(*argv, env=env, cwd=root, timeout=900)
                if done.returncode != 0:
                    print(f"{label}: exit {done.returncode}: {done.stderr.strip()[-400:]}",
                          file=sys.stderr)
                    continue
                got = throughput(json.loads(done.stdout)["results"], warmup, steps)
                if got:
                    measured[label].append(got)
                    print(f"round {r} {label}: {got:.1f} samples/s", file=sys.stderr)
    base_pred = predicted(sd, None, nodes="2")["series"]["current"][0]["throughput"]
    base_thr = statistics.median(measured["baseline"]) if measured["baseline"] else None
    lines = [f"{args.rate}, {args.size} of gradients, 2 nodes: each knob's speed-up over the "
             f"baseline, measured (median samples/s of {args.repeats} rounds), by `study "
             f"predict {sd.name} --fabric measured` (busbw "
             f"{fit.bandwidth_Bps / 1e6:.1f} MB/s) and by the study report's advice", "",
             f"{'knob':>17} {'samples/s':>10} {'measured':>9} {'predict':>8} {'advice':>7}"]
    out = {"rate": args.rate, "size": args.size, "study": str(sd), "advice": names,
           "advice_first_measured_as": first,
           "busbw_Bps": fit.bandwidth_Bps if fit else None, "rows": []}
    for label in labels:
        values = measured[label]
        pred = predicted(sd, None, *settings[label][1], nodes="2")["series"]["current"][0]
        speed = statistics.median(values) / base_thr if values and base_thr else None
        p_speed = pred["throughput"] / base_pred
        a_speed = advice.get(label) if label != "baseline" else 1.0
        lines.append(f"{label:>17} {statistics.median(values) if values else 0:10.1f} "
                     f"{speed if speed else 0:9.3f} {p_speed:8.3f} "
                     f"{f'{a_speed:.3f}' if a_speed else '(none)':>7}")
        out["rows"].append({"knob": label, "samples_per_s": values, "measured_speedup": speed,
                            "predicted_speedup": p_speed, "advice_speedup": a_speed})
    done_rows = [r for r in out["rows"] if r["measured_speedup"] and r["knob"] != "baseline"]
    if done_rows:
        best = max(done_rows, key=lambda r: r["measured_speedup"])
        lines.append(f"\nhelps most, measured: {best['knob']} ({best['measured_speedup']:.3f}x)")
    if names:
        lines.append(f"the report's advice for the 2-node point, best first: {', '.join(names)}"
                     + (f"; its first measured as {first}" if first else ""))
    (args.dir / f"knobs-{args.rate}-{args.size}.json").write_text(json.dumps(out, indent=1))
    print("\n".join(lines))
    budget.report(len(measured["baseline"]), args.repeats, "rounds")
    return budget.exit_code()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["studies", "knobs", "table"])
    ap.add_argument("--rate", default="250mbit")
    ap.add_argument("--sizes", default="1mb,8mb")
    ap.add_argument("--size", default="8mb", choices=sorted(SIZES))
    ap.add_argument("-r", "--repeats", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/hpcsuite-fabric-study"))
    ap.add_argument("--port", type=int, default=17417)
    ap.add_argument("--sysctl", action="append", default=[], metavar="KEY=VALUE",
                    help="set in each node's network namespace before the jobs, e.g. "
                         "net.ipv4.tcp_slow_start_after_idle=0 (repeatable)")
    Budget.add_argument(ap, 1080, "studies or rounds")
    args = ap.parse_args()
    if args.what == "studies" and set(args.sizes.split(",")) - set(SIZES):
        ap.error(f"--sizes: one or more of {', '.join(SIZES)}")
    args.dir = args.dir.resolve()
    args.dir.mkdir(parents=True, exist_ok=True)
    budget = Budget.from_args(args)
    return {"studies": studies, "knobs": knobs, "table": table}[args.what](args, budget)


if __name__ == "__main__":
    sys.exit(main())
