"""hpcsuite's costs at 128, 1,000 and 10,000 ranks, predicted from bench/scale.py's figures at
2 to 32 (issue 53, point 6).

    .venv/bin/python bench/scale_predict.py BEFORE.json AFTER.json [--ranks-per-node 8]

BEFORE and AFTER are two `bench/scale.py --out` files (the product before and after the
changes of issue 53). The bench ran one rank a node; a cluster runs several. So each figure is
predicted by the form the code gives it, with the constant measured here:

  connections/s in a long stall   before: c·R·(M−1) (every rank asked every other node every
                                  2 s); after: c·M (one watch a node, two neighbours, backoff)
  metadata ops/s in a long stall  before: f·R + d·R·(M−1); after: f·R + d·M (f: the failure
                                  watch's stat a rank a second; d: the network watch's stats)
  Slurm RPCs at a verdict         before: one `scontrol ping` from every rank that saw a peer
                                  fail (up to R at once); after: from the nodes that saw a
                                  neighbour fail (at most 3); in a stall with no fault: 0
  results.json bytes              a + b·R (fitted over the bench's N)
  hpcsuite's time to first step   managed minus plain, RUNNING -> every rank's first step: no
                                  work of a rank before its first step grows with R (its two
                                  neighbours' records are read in the watch's thread), so the
                                  prediction is the bench's median difference, with its spread
  the end-of-run gather           before: every rank unpickles every rank's note with its loss
                                  series (R·B bytes a rank; B: a --steps-step run's); after: rank
                                  0 opens and parses R notes without series (R file opens at
                                  --open-ms each), the loss summed in one allreduce of 8 bytes a
                                  step; unpickle and JSON rates measured here, on this machine

R ranks on M = R / --ranks-per-node nodes; --open-ms is the cost of opening a small file on a
Lustre-like shared filesystem (a lookup and an open on the metadata server: 1 ms by default). c, d and f are least-squares fits through the
origin of the measured per-second counts against the form's term, at every N the bench ran;
their spread is printed. A form whose constant comes out as 0 (nothing counted) predicts 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

AT = (128, 1000, 10000)


def rows(path: str, mode: str) -> dict[int, dict]:
    data = json.loads(Path(path).read_text())
    return {r["n"]: r for r in data["rows"] if r["mode"] == mode and r.get("state") == "COMPLETED"}


def through_origin(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(c, relative spread) of y = c·x by least squares."""
    xs_, ys_ = np.array(xs, float), np.array(ys, float)
    if not xs_.any():
        return 0.0, 0.0
    c = float(xs_ @ ys_ / (xs_ @ xs_))
    spread = [abs(y / (c * x) - 1) for x, y in zip(xs, ys) if x and c]
    return c, max(spread) if spread else 0.0


def line(ns: list[int], ys: list[float]) -> tuple[float, float, float]:
    """(a, b, largest residual) of a + b·n."""
    b, a = np.polyfit(ns, ys, 1)
    return float(a), float(b), float(max(abs(a + b * n - y) for n, y in zip(ns, ys)))


def per_s(row: dict, kind: str) -> float:
    return float(row.get(f"stall_{kind}_per_s") or 0.0)


def fmt(x: float) -> str:
    if x >= 1e9:
        return f"{x / 1e9:.2f} G"
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    if x >= 1e4:
        return f"{x / 1e3:.0f} k"
    return f"{x:.3g}"


def rates(steps: int, open_ms: float) -> dict:
    """B, the note of a ``steps``-step run (its loss series, as the bench's notes carry it),
    and how fast this machine unpickles it (what Horovod's allgather_object did on every rank)
    and parses it as JSON (what rank 0 does now)."""
    import pickle
    import time

    note = {"loss_sums": [0.1234567 + i for i in range(steps)], "samples": 64 * steps,
            "elapsed": 3600.0, "checksum": "0" * 64, "host": "node0001"}
    pickled, text = pickle.dumps(note), json.dumps(note)

    def rate(fn, data) -> float:
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 0.5:
            fn(data)
            n += 1
        return n * len(data) / (time.perf_counter() - t0)

    small = json.dumps({k: v for k, v in note.items() if k != "loss_sums"} |
                       {"own_s": 0.01, "wait_s": 0.002, "noticed": None, "signal": None,
                        "after_signal": None, "utilisation": [], "energy_j": None})
    return {"note_bytes": len(text), "small_note_bytes": len(small),
            "unpickle_bps": rate(pickle.loads, pickled), "json_bps": rate(json.loads, text),
            "open_s": open_ms / 1e3, "steps": steps}


def predict(before: str, after: str, per_node: int, mode: str, rates: dict) -> list[str]:
    out = []
    plain_b, plain_a = rows(before, "plain"), rows(after, "plain")
    for label, path, plain, old in (("before", before, plain_b, True),
                                    ("after", after, plain_a, False)):
        got = rows(path, mode)
        ns = sorted(got)
        if not ns:
            out.append(f"| {label} | no completed {mode} run in {path} | | | |")
            continue
        # one rank a node: R = M = n
        term = (lambda n: n * (n - 1)) if old else (lambda n: n)
        c, c_spread = through_origin([term(n) for n in ns], [per_s(got[n], "connect") for n in ns])
        f, f_spread = through_origin(ns, [per_s(plain[n], "stat") if n in plain else 0.0
                                          for n in ns])
        d, d_spread = through_origin([term(n) for n in ns],
                                     [per_s(got[n], "stat") - f * n for n in ns])
        first = [got[n]["running_to_first_step_s"] - plain[n]["running_to_first_step_s"]
                 for n in ns if n in plain and got[n].get("running_to_first_step_s") is not None
                 and plain[n].get("running_to_first_step_s") is not None]
        share = statistics.median(first) if first else 0.0
        low, high = (min(first), max(first)) if first else (0.0, 0.0)
        ra, rb, rr = line(ns, [got[n]["results_json_bytes"] for n in ns])

        def at(r: int) -> dict:
            m = max(r // per_node, 1)
            node_term = r * (m - 1) if old else m
            note = rates["note_bytes"] if old else rates["small_note_bytes"]
            gather = (r * note / rates["unpickle_bps"] if old else
                      r * (rates["open_s"] + note / rates["json_bps"]))
            return {"conn": c * node_term, "meta": f * r + d * node_term,
                    "rpc": r if old else min(3, m), "results": ra + rb * r,
                    "gather": gather, "bytes": r * note}

        preds = [at(r) for r in AT]
        out.append(f"| {label}: connections/s in a long stall | "
                   + " | ".join(fmt(p["conn"]) for p in preds)
                   + f" | c = {c:.3g} (spread {100 * c_spread:.0f} %) |")
        out.append(f"| {label}: metadata ops/s in a long stall | "
                   + " | ".join(fmt(p["meta"]) for p in preds)
                   + f" | f = {f:.3g} a rank, d = {d:.3g} (spread {100 * d_spread:.0f} %) |")
        out.append(f"| {label}: Slurm RPCs at a verdict (none in a stall without a fault) | "
                   + " | ".join(fmt(p["rpc"]) for p in preds) + " | from the code |")
        out.append(f"| {label}: results.json (bytes) | "
                   + " | ".join(fmt(p["results"]) for p in preds)
                   + f" | {ra:.0f} + {rb:.1f}·R (residual ≤ {rr:.0f}) |")
        out.append(f"| {label}: hpcsuite's time to first step (s) | "
                   + " | ".join(f"{max(share, 0.0):.1f}" for _ in preds)
                   + f" | managed − plain at N = {ns[0]}..{ns[-1]}: median {share:+.1f} s, "
                   f"{low:+.1f} to {high:+.1f} (the machine's noise) |")
        if old:
            said = (f"every rank unpickles R notes with their loss series: "
                    f"{fmt(preds[1]['bytes'])}B a rank at 1,000 ranks")
        else:
            said = (f"rank 0 opens and parses R notes of {rates['small_note_bytes']} B "
                    f"({fmt(preds[1]['bytes'])}B at 1,000 ranks); the loss series is one "
                    f"allreduce of {fmt(8 * rates['steps'])}B a rank, at any R")
        out.append(f"| {label}: end-of-run gather, s | "
                   + " | ".join(f"{p['gather']:.2g}" for p in preds) + f" | {said} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--mode", default="managed", choices=["managed", "script"])
    ap.add_argument("--steps", type=int, default=100_000, help="the run's steps, for B")
    ap.add_argument("--open-ms", type=float, default=1.0)
    args = ap.parse_args()
    measured = rates(args.steps, args.open_ms)
    print(f"B = {fmt(measured['note_bytes'])}B ({args.steps} steps); unpickled at "
          f"{measured['unpickle_bps'] / 1e6:.0f} MB/s, JSON parsed at "
          f"{measured['json_bps'] / 1e6:.0f} MB/s here; a file opened in {args.open_ms:g} ms")
    print(f"{args.mode} job, {args.ranks_per_node} ranks a node; the bench's N is ranks on as "
          "many nodes")
    print("| figure | 128 ranks | 1,000 ranks | 10,000 ranks | form and constant |")
    print("| --- | --- | --- | --- | --- |")
    for row in predict(args.before, args.after, args.ranks_per_node, args.mode, measured):
        print(row)


if __name__ == "__main__":
    main()
