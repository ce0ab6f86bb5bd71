"""hpcsuite's predicted scaling efficiency beside published Horovod results (docs/BENCHMARKS.md).

One model, one set of constants, stated before comparing: the `25gbe-roce` preset (3.0 GB/s
bus bandwidth, NCCL's 9.6 us per network step), hpcsuite's default knobs (64 MB fusion, 1 ms
cycle, fp32, no accumulation, flat ring), backward = 2/3 of a step, 4 GPUs per server, the
GPUs of a server linked as the servers are (their link was not published). Inputs: each
model's public parameter count and the published single-GPU throughput at batch 64. ResNet-101 has no published P100 throughput of its own: it is
predicted at both of its published neighbours' (ResNet-50 and ResNet-152, the same bottleneck
blocks, fewer and more of them), which bracket its own, and the row gives both ends.

Each row is predicted twice: every rank equally fast (cv 0, the model before issue O point 5),
and each step waiting for the slowest of the N GPUs at one per-rank compute spread for every
row, `study predict`'s default (hpcsuite.study.predict.DEFAULT_COMPUTE_CV: GPU-to-GPU
variation, Sinha et al., arXiv:2208.11035v3), or ``--compute-cv``.

    python bench/predict_published.py [--budget SECONDS] [--compute-cv CV]

Prints each row as it is computed; with a budget cut short it prints the rows so far and says so.
"""

from __future__ import annotations

import argparse
import sys

from budget import Budget
from hpcsuite.fabrics import PRESETS, Fabric
from hpcsuite.study.predict import DEFAULT_COMPUTE_CV, Knobs, Workload, point

HOROVOD = "horovod/horovod docs/benchmarks.rst, README (128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE)"
HOROVOD_EARLY = ("Horovod README before the 512-GPU run, as kept in github.com/alsrgv/horovod "
                 "(32 servers x 4 Pascal GPUs, 25 Gbit/s RoCE)")
TF_P100 = "tensorflow docs_src/performance/benchmarks.md, DGX-1 P100, synthetic, batch 64"
KERAS = "keras.io/api/applications (parameter count)"

MODELS = {   # name: (parameters, single-GPU images/s at batch 64: one, or the two that bracket it)
    "Inception V3": (23_851_784, (142.0,)),
    "VGG-16": (138_357_544, (154.0,)),
    "ResNet-101": (44_707_176, (219.0, 91.8)),      # ResNet-50's and ResNet-152's
}
PUBLISHED = [   # (model, servers, efficiency, source)
    ("Inception V3", 128, 0.90, HOROVOD),
    ("ResNet-101", 128, 0.90, HOROVOD),
    ("VGG-16", 128, 0.68, HOROVOD),
    ("Inception V3", 32, 0.90, HOROVOD_EARLY),
    ("ResNet-101", 32, 0.90, HOROVOD_EARLY),
    ("VGG-16", 32, 0.79, HOROVOD_EARLY),
]
GPUS_PER_SERVER, BATCH = 4, 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    Budget.add_argument(parser, 60, "rows")
    parser.add_argument("--compute-cv", type=float, default=DEFAULT_COMPUTE_CV,
                        help="per-rank compute spread of every row (default: study predict's)")
    args = parser.parse_args()
    budget = Budget.from_args(args)
    fabric = Fabric("25gbe-roce", PRESETS["25gbe-roce"])
    print(f"per-rank compute spread after: cv {args.compute_cv:.4f}, every row\n")
    print("| model | GPUs | published | predicted, cv 0 | difference | "
          f"predicted, cv {args.compute_cv:.4f} | difference (points) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    done = 0
    with budget.watch():
        for model, servers, published, source in budget.each(PUBLISHED):
            cells = [f"{model}", f"{servers * GPUS_PER_SERVER}", f"{published:.0%}"]
            for cv in (0.0, args.compute_cv):
                effs = efficiencies(model, servers, fabric, cv)
                cells.append(" to ".join(f"{e:.1%}" for e in effs))
                cells.append(" to ".join(f"{(e - published) * 100:+.1f}" for e in effs))
            print("| " + " | ".join(cells) + " |", flush=True)
            done += 1
    budget.report(done, len(PUBLISHED), "rows")
    print(f"\nsources: {HOROVOD}; {HOROVOD_EARLY}; throughput: {TF_P100}; {KERAS}")
    return budget.exit_code()


def efficiencies(model: str, servers: int, fabric: Fabric, cv: float) -> list[float]:
    """The predicted efficiency at each of the model's single-GPU throughputs, lowest first."""
    params, throughputs = MODELS[model]
    return sorted(point(Workload(params * 4.0, BATCH / per_gpu, BATCH, compute_cv=cv), servers,
                        GPUS_PER_SERVER, fabric, Knobs())["efficiency"]
                  for per_gpu in throughputs)


if __name__ == "__main__":
    sys.exit(main())
