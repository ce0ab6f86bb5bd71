"""hpcsuite's managed loop on a GPU against three plain Horovod loops, in one process per model,
rounds alternated (issue V, point 1).

Each model runs in a process of its own (one rank: `python bench/gpu_pipeline.py` starts it, no
mpirun needed), which builds one model and one DistributedOptimizer through hpcsuite's torch
backend and alternates, in rounds of --steps steps (the order reversed every other round):
  managed-host    Trainer.train_epoch as `hpcsuite train` runs it, train.data.on_device false:
                  the prefetch thread and the side-stream copy (hpcsuite/runtime/input/prefetch.py)
  managed-auto    the same with on_device auto (the default): the data on the GPU when it fits
                  a quarter of the free memory, each step's batch gathered there
  plain-read      each step gathers its batch from the same host arrays (x[ids]), pins it and
                  copies it non_blocking
  plain-prefetch  a background thread gathers and pins the next batches (a queue of 2), the
                  main thread copies the next one on a side CUDA stream (apex's data_prefetcher)
  plain-resident  Horovod's synthetic benchmark loop: one batch that stays on the GPU
  plain-gather    the data on the GPU (the copy managed-auto made), each step's batch gathered
                  there by two index_select: what a plain loop with resident data does
All five see the same model, optimizer, data (the sharding layer's ids), precision and loss. A
round's time is wall clock between two device synchronisations, divided by its steps; the first
round of each kind is warm-up and not counted. Printed per model: the median step of each kind,
plain/managed per round, median [quartiles] (>= 1: hpcsuite as fast or faster), and how far
each managed loop is from plain-resident.

Models: mlp (784-64-64-10, fp32) and the built-in resnet ([3, 32, 32], amp), batch 256.

    python3 bench/gpu_pipeline.py --out gpu_pipeline.json        # a GPU, under 4 minutes
    .venv/bin/python bench/gpu_pipeline.py --device cpu --steps 5 --rounds 2 --batch 32 \\
        --samples 1024                                            # the logic, on a CPU

On a CPU the managed loops run the GPU pipeline's CPU stand-in (the same thread and queue, no
pinning or streams): a check of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from budget import Budget, run_group  # noqa: E402

MODELS = {"mlp": {"model": "mlp", "shape": [784], "precision": "fp32", "samples": 32768},
          "resnet": {"model": "resnet", "shape": [3, 32, 32], "precision": "amp", "samples": 16384}}
KINDS = ("managed-host", "managed-auto", "plain-read", "plain-prefetch", "plain-resident",
         "plain-gather")
PLAIN_DEPTH = 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when there is one")
    ap.add_argument("--models", default="mlp,resnet", help="comma-separated: mlp, resnet")
    ap.add_argument("--rounds", type=int, default=16, help="rounds per model, after a warm-up one")
    ap.add_argument("--steps", type=int, default=200, help="steps per round and kind")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--samples", type=int, help="samples in the data (default per model)")
    ap.add_argument("--out", help="write the figures as JSON to this file")
    ap.add_argument("--one", help=argparse.SUPPRESS)           # a child: this model only
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    Budget.add_argument(ap, 200, "rounds")
    a = ap.parse_args()
    if a.rounds < 1 or a.steps < 1 or a.batch < 1 or (a.samples is not None and a.samples < a.batch):
        ap.error("--rounds, --steps and --batch must be at least 1, --samples at least --batch")
    budget = Budget.from_args(a)
    if a.one:
        measure(a, budget)
        return
    models = [m for m in a.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        ap.error(f"--models: {','.join(unknown) or 'none given'}; choose from {', '.join(MODELS)}")
    results: dict = {"models": {}}
    # A stop signal (timeout's SIGTERM) or the budget's end stops the model in flight (its
    # process group); the models done so far are in --out.
    with tempfile.TemporaryDirectory(prefix="gpu-pipeline-") as tmp, budget.watch():
        for i, name in enumerate(models):
            share = budget.remaining() / (len(models) - i)
            if share < 10:
                print(f"{name}: skipped, {share:.0f} s of the budget left", flush=True)
                continue
            out = Path(tmp) / f"{name}.json"
            argv = [sys.executable, __file__, "--one", name, "--child-out", str(out),
                    "--rounds", str(a.rounds), "--steps", str(a.steps), "--batch", str(a.batch),
                    "--budget", f"{max(1.0, share - 5):.0f}"]
            argv += ["--device", a.device] if a.device else []
            argv += ["--samples", str(a.samples)] if a.samples else []
            try:
                code = run_group(argv, timeout=share + 30).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"                       # its process group is stopped
            if code != 0 or not out.exists():
                print(f"{name}: the run failed (exit {code})", flush=True)
                results["models"][name] = {"error": f"exit {code}"}
            else:
                child = json.loads(out.read_text())
                results.update({k: v for k, v in child.items() if k != "model"})
                results["models"][name] = child["model"]
            if a.out:                                  # after each model: a timeout keeps it
                Path(a.out).write_text(json.dumps(results, indent=2) + "\n")
    failed = [m for m, r in results["models"].items() if "error" in r]
    budget.report(len(results["models"]) - len(failed), len(models), "models")
    sys.exit(budget.exit_code(1 if failed or not results["models"] else 0))


def quartiles(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2]}


def measure(a, budget: Budget) -> None:
    """One model: build it through hpcsuite's backend, alternate the five loops."""
    from hpcsuite.submit.knobs import environment
    from hpcsuite.submit.spec import spec_from_dict

    m = MODELS[a.one]
    samples = a.samples or m["samples"]
    job = spec_from_dict({
        "name": "gpu-pipeline", "resources": {"nodes": 1, "tasks_per_node": 1},
        "train": {"backend": "torch", "model": m["model"], "batch_size": a.batch, "lr": 0.01,
                  "precision": m["precision"], "epochs": 10 ** 6, "max_steps": 10 ** 9,
                  "data": {"kind": "synthetic", "samples": samples, "shape": m["shape"],
                           "classes": 10}}}, "bench")
    # The HOROVOD_* variables `hpcsuite train`'s batch script gives its ranks (cycle time,
    # fusion threshold, ...), where the environment does not set them: both sides run under them.
    for name, value in environment(job.train.horovod, {}).items():
        os.environ.setdefault(name, value)
    if a.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""      # the backend then picks the CPU
    import numpy as np
    import torch

    from hpcsuite.runtime.input.data import open_data
    from hpcsuite.runtime.session.loop import Policy, Progress, Trainer
    from hpcsuite.runtime.input.prefetch import Input
    from hpcsuite.runtime.input.sharding import Cursor, Sharder
    from hpcsuite.runtime.frameworks.torch_backend import TorchBackend

    backend = TorchBackend(job)
    device = backend.device
    cuda = device.startswith("cuda")
    if a.device == "cuda" and not cuda:
        print("--device cuda: no CUDA device here", file=sys.stderr)
        sys.exit(2)
    data = open_data(job.train.data, job.train.seed)
    backend.build(data)
    trainer = Trainer(job, Path(tempfile.mkdtemp(prefix="gpu-pipeline-")), backend)
    progress = Progress()
    free = None if cuda else (lambda: 1 << 40)           # the CPU stand-in: everything fits
    inputs = {kind: Input(torch, device, job.train.data.prefetch, setting, backend.rank, free)
              for kind, setting in (("managed-host", False), ("managed-auto", "auto"))}
    sharder = Sharder(len(data), backend.size, backend.rank, a.batch, job.train.seed)

    class Rounds(Policy):
        """The job's policy, done after the round's last step."""
        target = 0

        def done(self, step: int) -> bool:
            return step >= self.target

    policy = Rounds(job, 0, time.monotonic())

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def managed(kind: str):
        def run(n: int) -> float:
            backend._input = inputs[kind]
            policy.target = progress.step + n
            sync()
            t0 = time.perf_counter()
            while progress.step < policy.target:
                trainer.train_epoch(data, sharder, progress, policy)
                if progress.cursor.consumed >= len(data):
                    progress.cursor = Cursor(progress.cursor.epoch + 1, 0)
            sync()
            return (time.perf_counter() - t0) / n
        return run

    ids = [b.ids for e in range(2) for b in sharder.epoch(Cursor(e, 0))]
    model, opt, scaler = backend.model, backend.optimizer, backend.scaler
    cross_entropy = torch.nn.functional.cross_entropy

    def step(x, y):
        opt.zero_grad()
        if backend.mixed:
            with torch.autocast(**backend.autocast):
                out = model(x).float()
        else:
            out = model(x)
        loss = cross_entropy(out, y)
        if scaler:
            scaler.scale(loss).backward()
            opt.synchronize()
            scaler.unscale_(opt)
            with opt.skip_synchronize():
                scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    at = 0

    def plain(batch_of):
        def run(n: int) -> float:
            nonlocal at
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                step(*batch_of(at))
                at += 1
            sync()
            return (time.perf_counter() - t0) / n
        return run

    def host_batch(i: int, pin: bool):
        rows = ids[i % len(ids)]
        x, y = torch.from_numpy(data.x[rows]), torch.from_numpy(data.y[rows])
        return (x.pin_memory(), y.pin_memory()) if pin else (x, y)

    def read(i: int):
        x, y = host_batch(i, cuda)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    prefetcher = PlainPrefetch(torch, device, lambda i: host_batch(i, cuda), PLAIN_DEPTH)
    fixed = read(0)
    on_device = inputs["managed-auto"].resident(data)
    if on_device is not None:
        x_all, y_all = on_device.x, on_device.y
        rows = torch.as_tensor(np.stack(ids), device=device)

        def gather(i: int):
            r = rows[i % len(ids)]
            return x_all.index_select(0, r), y_all.index_select(0, r)
    else:                                  # the data does not fit: plain-read's batches
        gather = read
    kinds = {"managed-host": managed("managed-host"), "managed-auto": managed("managed-auto"),
             "plain-read": plain(read), "plain-prefetch": plain(prefetcher.next),
             "plain-resident": plain(lambda i: fixed), "plain-gather": plain(gather)}
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        for r in budget.each(range(a.rounds + 1)):
            order = KINDS if r % 2 else KINDS[::-1]
            for kind in order:
                t = kinds[kind](a.steps)
                if r:                                  # round 0 is warm-up
                    times[kind].append(t)
    finally:
        prefetcher.close()
    rounds = len(times["plain-read"])
    budget.report(rounds, a.rounds, "rounds")
    auto = inputs["managed-auto"].resident(data) is not None
    ratios = {f"{p}/{mk}": quartiles([x / y for x, y in zip(times[p], times[mk])])
              for mk in ("managed-host", "managed-auto")
              for p in ("plain-read", "plain-prefetch", "plain-resident", "plain-gather")}
    to_resident = {mk: statistics.median(times[mk]) / statistics.median(times["plain-resident"]) - 1
                   for mk in ("managed-host", "managed-auto", "plain-gather")}
    what = f"{a.one} {m['shape']} batch {a.batch} {m['precision']}"
    print(f"{what} on {device}, {rounds} rounds of {a.steps} steps; on_device auto put the data "
          f"{'on the GPU' if auto and cuda else 'on the device (CPU stand-in)' if auto else 'on the host'}")
    print("  median step: " + ", ".join(f"{k} {statistics.median(v) * 1e3:.3f} ms"
                                        for k, v in times.items()))
    for key, q in ratios.items():
        print(f"  {key:30s} {q['median']:.3f} [{q['q1']:.3f}-{q['q3']:.3f}]")
    for mk, d in to_resident.items():
        print(f"  {mk} is {100 * d:+.1f} % from plain-resident")
    sys.stdout.flush()
    props = torch.cuda.get_device_properties(device) if cuda else None
    out = {"device": props.name if props else "cpu", "torch": torch.__version__,
           "cuda": torch.version.cuda,
           "horovod_env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
           "model": {"what": what, "device": device, "rounds": rounds, "steps": a.steps,
                     "samples": samples, "auto_resident": auto,
                     "step_ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
                     "ratios": ratios, "to_plain_resident": to_resident,
                     "rounds_s": {k: v for k, v in times.items()}}}
    if a.child_out:
        Path(a.child_out).write_text(json.dumps(out))
    trainer.session.settle_vote()


class PlainPrefetch:
    """A plain loop's prefetcher: a thread gathers and pins the next batches into a queue, the
    main thread copies the next one on a side stream while the current one trains (apex's
    data_prefetcher)."""

    def __init__(self, torch, device: str, host_batch, depth: int):
        import queue
        import threading

        self.torch, self.device, self.cuda = torch, device, device.startswith("cuda")
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None

        def produce():
            i = 0
            while not self.stop.is_set():
                batch = host_batch(i)
                while not self.stop.is_set():
                    try:
                        self.q.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                i += 1

        self.thread = threading.Thread(target=produce, daemon=True)
        self.thread.start()
        self.ahead = None

    def _preload(self):
        x, y = self.q.get()
        if self.cuda:
            with self.torch.cuda.stream(self.stream):
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        self.ahead = (x, y)

    def next(self, i: int):
        if self.ahead is None:
            self._preload()
        x, y = self.ahead
        if self.cuda:
            current = self.torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)
            x.record_stream(current)
            y.record_stream(current)
        self._preload()
        return x, y

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)


if __name__ == "__main__":
    main()
