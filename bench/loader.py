"""The sharded npy loader against raw memory-map reads of the same rows (bar: >= 0.9x).

Same batches (Sharder, seed 1) read three ways:
  raw shards: the same shard files memory-mapped by hand (np.load mmap_mode="r"), each
              batch's rows picked per shard with numpy and concatenated: the baseline;
  raw single: all rows in one memory-mapped file, one fancy-indexing gather per batch (a floor
              that sharded data cannot reach: it needs one gather per shard);
  hpcsuite:   NpyShards.get.
The page cache is dropped before each run where possible (needs root).
    .venv/bin/python bench/loader.py [--mb 512] [--batch 256] [-n 3] [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from budget import Budget
from hpcsuite.runtime.input.data import NpyShards, write_shards
from hpcsuite.runtime.input.sharding import Cursor, Sharder
from hpcsuite.submit.spec import Data


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def read_single(root: Path, batches) -> float:
    t0 = time.perf_counter()
    flat = np.load(root / "flat.npy", mmap_mode="r")
    for ids in batches:
        flat[ids]
    return time.perf_counter() - t0


def read_raw_shards(root: Path, batches) -> float:
    t0 = time.perf_counter()
    files = sorted((root / "shards").glob("inputs-*.npy"))
    maps = [np.load(f, mmap_mode="r") for f in files]
    labels = [np.load(str(f).replace("inputs-", "labels-"), mmap_mode="r") for f in files]
    starts = np.cumsum([0] + [len(m) for m in maps])
    for ids in batches:
        xs, ys = [], []
        for m, lab, lo, hi in zip(maps, labels, starts[:-1], starts[1:]):
            sel = ids[(ids >= lo) & (ids < hi)] - lo
            xs.append(m[sel])
            ys.append(lab[sel])
        np.concatenate(xs), np.concatenate(ys)
    return time.perf_counter() - t0


def read_hpcsuite(root: Path, batches) -> float:
    t0 = time.perf_counter()
    data = NpyShards(Data(kind="npy", path=str(root / "shards")), 0)
    for ids in batches:
        data.get(ids)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("-n", type=int, default=3)
    Budget.add_argument(ap, 600, "repeats")
    args = ap.parse_args()
    budget = Budget.from_args(args)
    n = args.mb * (1 << 20) // (args.features * 4)
    cold = False
    raw_t, single_t, ours_t = [], [], []
    with budget.watch():
        root = Path(tempfile.mkdtemp(prefix="hpcsuite-bench-"))
        try:
            rng = np.random.default_rng(0)
            x = rng.standard_normal((n, args.features), dtype=np.float32)
            y = rng.integers(0, 10, n)
            np.save(root / "flat.npy", x)
            write_shards(root / "shards", x, y, shards=8)
            del x
            batches = [b.ids for b in Sharder(n, 1, 0, args.batch, seed=1).epoch(Cursor())]
            for _ in budget.each(range(args.n)):
                cold = drop_caches()
                single = read_single(root, batches)
                drop_caches()
                raw = read_raw_shards(root, batches)
                drop_caches()
                ours = read_hpcsuite(root, batches)
                single_t.append(single)      # a repeat counts once all three reads are done
                raw_t.append(raw)
                ours_t.append(ours)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    budget.report(len(raw_t), args.n, "repeats")
    r, o, f = statistics.median(raw_t), statistics.median(ours_t), statistics.median(single_t)
    mib = n * args.features * 4 / 2**20
    print(f"{mib:.0f} MiB, {len(batches)} batches of {args.batch}, page cache "
          f"{'dropped' if cold else 'NOT dropped (not root)'} before each run; medians of {len(raw_t)}")
    print(f"raw single file     {f:7.3f} s  {mib / f:8.1f} MiB/s")
    print(f"raw shards          {r:7.3f} s  {mib / r:8.1f} MiB/s")
    print(f"hpcsuite            {o:7.3f} s  {mib / o:8.1f} MiB/s")
    print(f"ratio hpcsuite / raw shards       {r / o:6.2f}x")
    print(f"ratio hpcsuite / raw single file  {f / o:6.2f}x")
    sys.exit(budget.exit_code())


if __name__ == "__main__":
    main()
