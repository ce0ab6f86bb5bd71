"""hpcsuite's predicted scaling efficiency beside published Horovod results (docs/BENCHMARKS.md).

One model, one set of constants, stated before comparing: the `25gbe-roce` preset (3.0 GB/s
bus bandwidth, NCCL's 9.6 us per network step), hpcsuite's default knobs (64 MB fusion, 1 ms
cycle, fp32, no accumulation, flat ring), backward = 2/3 of a step, 4 GPUs per server, the
GPUs of a server linked as the servers are (their link was not published). Inputs: each
model's public parameter count and the published single-GPU throughput at batch 64. ResNet-101 has no published P100 throughput of its own: it is
predicted at both of its published neighbours' (ResNet-50 and ResNet-152, the same bottleneck
blocks, fewer and more of them), which bracket its own, and the row gives both ends.

    python bench/predict_published.py [--budget SECONDS]

Prints each row as it is computed; with a budget cut short it prints the rows so far and says so.
"""

from __future__ import annotations

import argparse
import sys

from budget import Budget
from hpcsuite.fabrics import PRESETS, Fabric
from hpcsuite.study.predict import Knobs, Workload, point

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
    budget = Budget.from_args(parser.parse_args())
    fabric = Fabric("25gbe-roce", PRESETS["25gbe-roce"])
    print("| model | GPUs | published | predicted | difference (points) |")
    print("| --- | --- | --- | --- | --- |")
    done = 0
    with budget.watch():
        for model, servers, published, source in budget.each(PUBLISHED):
            params, throughputs = MODELS[model]
            effs = sorted(point(Workload(params * 4.0, BATCH / per_gpu, BATCH), servers,
                                GPUS_PER_SERVER, fabric, Knobs())["efficiency"]
                          for per_gpu in throughputs)
            predicted = " to ".join(f"{e:.1%}" for e in effs)
            points = " to ".join(f"{(e - published) * 100:+.1f}" for e in effs)
            print(f"| {model} | {servers * GPUS_PER_SERVER} | {published:.0%} | {predicted} | "
                  f"{points} |", flush=True)
            done += 1
    budget.report(done, len(PUBLISHED), "rows")
    print(f"\nsources: {HOROVOD}; {HOROVOD_EARLY}; throughput: {TF_P100}; {KERAS}")
    return budget.exit_code()


if __name__ == "__main__":
    sys.exit(main())
