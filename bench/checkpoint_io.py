"""Checkpoint save speed against a raw write of the same bytes (quality bar: >= 0.8x).

Both sides write the same amount of data to the same directory and fsync it; the checkpoint
side also serialises to safetensors, hashes every file (sha256, overlapped with the writes),
writes the manifest and marker, renames and fsyncs the directory. Alternating repeats.
    .venv/bin/python bench/checkpoint_io.py [--mb 256] [-n 5] [--dir DIR] [--budget SECONDS]
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
from hpcsuite.runtime.session.checkpoint import CheckpointStore


def raw_write(path: Path, arrays: dict[str, np.ndarray]) -> float:
    t0 = time.perf_counter()
    path.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        with open(path / name, "wb") as f:
            f.write(memoryview(arr).cast("B"))
            f.flush()
            os.fsync(f.fileno())
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir under /tmp)")
    Budget.add_argument(ap, 300, "repeats")
    args = ap.parse_args()
    budget = Budget.from_args(args)
    rng = np.random.default_rng(0)
    per = args.mb * (1 << 20) // 8 // 4
    raw, ckpt = [], []
    with budget.watch():
        arrays = {f"layer{i}.weight": rng.standard_normal(per, dtype=np.float32) for i in range(8)}
        nbytes = sum(a.nbytes for a in arrays.values())
        root = Path(tempfile.mkdtemp(prefix="hpcsuite-bench-", dir=args.dir))
        try:
            for i in budget.each(range(args.n)):
                raw_s = raw_write(root / f"raw{i}", arrays)
                shutil.rmtree(root / f"raw{i}")
                store = CheckpointStore(root / "ckpt", keep=1)
                ckpt_s = store.save(i, {"model": arrays}, {"cursor": {"epoch": 0, "consumed": 0}}).seconds
                raw.append(raw_s)        # a repeat counts once both sides are done
                ckpt.append(ckpt_s)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    budget.report(len(raw), args.n, "repeats")
    r, c = statistics.median(raw), statistics.median(ckpt)
    print(f"{nbytes / 2**20:.0f} MiB, {len(raw)} repeats (medians)")
    print(f"raw write + fsync     {r:8.3f} s  {nbytes / r / 2**20:8.1f} MiB/s")
    print(f"checkpoint save       {c:8.3f} s  {nbytes / c / 2**20:8.1f} MiB/s")
    print(f"ratio (save / raw)    {r / c:8.2f}x")
    sys.exit(budget.exit_code())


if __name__ == "__main__":
    main()
