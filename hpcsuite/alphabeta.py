"""The α-β (latency-bandwidth) model of a ring allreduce, fitted to measured times.

A ring allreduce of S bytes over N ranks runs 2(N−1) steps (reduce-scatter, then allgather),
each paying a latency α and moving S/N bytes over a link of bandwidth B::

    t(S) = 2(N−1)·α + 2(N−1)/N · S/B

In the bandwidth-bound limit t ≈ 2(N−1)/N · S/B, so B is what nccl-tests call the bus
bandwidth (``busbw = S/t · 2(N−1)/N``) of large messages: the number to compare across world
sizes. :func:`fit` finds α and B from `hpcsuite bench allreduce` measurements; the result
predicts the communication time of a step from its gradient bytes::

    from hpcsuite.alphabeta import AlphaBeta
    model = AlphaBeta.from_json(report["fit"]["horovod"])
    seconds = model.predict(gradient_bytes, n=8, tensors=gradient_tensors)

numpy only: no framework is imported here. A core leaf: the rank program fits it in its
report (:mod:`hpcsuite.runtime.checks.allreduce_bench`), the login side reads and re-fits it
(`hpcsuite bench allreduce`, a study's report).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

__all__ = ["AlphaBeta", "FitError", "fit", "ring_terms", "algorithm_bandwidth", "bus_bandwidth",
           "large_busbw", "fit_check"]

MODEL = "t(S) = 2(N-1)*alpha + 2(N-1)/N * S/B"


class FitError(ValueError):
    """The measurements cannot determine α and B (too few points, N < 2, bad values)."""


def _integer(value, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise FitError(f"{what} must be an integer >= {least}, got {value!r}")
    return int(value)


def _ring_size(n) -> int:
    """The world size of a measured ring: one rank has none (nothing to fit or predict from)."""
    if isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n < 2:
        raise FitError(f"an allreduce over {n} rank(s) communicates nothing: the alpha-beta "
                       "model needs measurements on at least 2 ranks")
    return _integer(n, "the number of ranks", 2)


def ring_terms(size_bytes, n: int) -> tuple[float, np.ndarray | float]:
    """(latency steps, bytes over one link) of a ring allreduce: 2(N−1) and 2(N−1)/N·S."""
    n = _integer(n, "the number of ranks", 1)
    return 2.0 * (n - 1), 2.0 * (n - 1) / n * np.asarray(size_bytes, dtype=float)


def algorithm_bandwidth(size_bytes, seconds):
    """algbw = S/t in bytes per second (nccl-tests' definition)."""
    return np.asarray(size_bytes, dtype=float) / np.asarray(seconds, dtype=float)


def bus_bandwidth(size_bytes, seconds, n: int):
    """busbw = algbw·2(N−1)/N in bytes per second: the bandwidth each link sustains in a ring
    allreduce, comparable across world sizes (nccl-tests' definition)."""
    n = _integer(n, "the number of ranks", 1)
    return algorithm_bandwidth(size_bytes, seconds) * 2.0 * (n - 1) / n


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted ring-allreduce model: per-step latency ``alpha_s`` (seconds) and link
    bandwidth ``bandwidth_Bps`` (bytes/s), measured on ``n`` ranks. ``points``: how many
    (size, time) measurements it was fitted to; ``rms_rel_error`` / ``max_rel_error``: how far
    the model is from them, relative to each measured time (0.05 = 5 %)."""

    alpha_s: float
    bandwidth_Bps: float
    n: int
    points: int = 0
    rms_rel_error: float = 0.0
    max_rel_error: float = 0.0

    def __post_init__(self):
        _ring_size(self.n)
        if not (math.isfinite(self.alpha_s) and self.alpha_s >= 0):
            raise FitError(f"alpha_s must be a finite number >= 0, got {self.alpha_s!r}")
        if not (math.isfinite(self.bandwidth_Bps) and self.bandwidth_Bps > 0):
            raise FitError(f"bandwidth_Bps must be a finite number > 0, got {self.bandwidth_Bps!r}")

    def predict(self, size_bytes, n: int | None = None, tensors: int = 1):
        """Seconds to allreduce ``size_bytes`` in all over ``n`` ranks (default: the measured
        N) as ``tensors`` separate allreduce operations: each operation pays the latency term,
        the bytes pay the bandwidth term once. One rank communicates nothing (0 s).

        ``size_bytes`` may be an array (an array comes back). The model assumes the same α and
        B at another ``n``, true for a ring over identical links, so extrapolating in ``n`` is
        only as good as that assumption."""
        n = self.n if n is None else _integer(n, "the number of ranks", 1)
        tensors = _integer(tensors, "tensors", 1)
        size = np.asarray(size_bytes, dtype=float)
        if np.any(size < 0) or not np.all(np.isfinite(size)):
            raise FitError("size_bytes must be finite and >= 0")
        steps, link_bytes = ring_terms(size, n)
        t = tensors * steps * self.alpha_s + link_bytes / self.bandwidth_Bps
        return float(t) if t.ndim == 0 else t

    def in_words(self) -> str:
        """One line for people: α in µs, B in MB/s or GB/s, and the fit's error."""
        b = float(f"{self.bandwidth_Bps:.3g}")     # round first: 999.99e6 B/s is 1 GB/s
        bw = f"{_figures(b / 1e9)} GB/s" if b >= 1e9 else f"{_figures(b / 1e6)} MB/s"
        return (f"alpha {_figures(self.alpha_s * 1e6)} us, B {bw} (N={self.n}, "
                f"{self.points} sizes, rms error {self.rms_rel_error:.1%}, "
                f"max {self.max_rel_error:.1%})")

    def to_json(self) -> dict:
        return {"model": MODEL, "alpha_s": self.alpha_s, "bandwidth_Bps": self.bandwidth_Bps,
                "n": self.n, "points": self.points, "rms_rel_error": self.rms_rel_error,
                "max_rel_error": self.max_rel_error}

    @classmethod
    def from_json(cls, data: dict) -> AlphaBeta:
        if not isinstance(data, dict):
            raise FitError(f"an alpha-beta fit must be a JSON object, got {type(data).__name__}")
        missing = [k for k in ("alpha_s", "bandwidth_Bps", "n") if k not in data]
        if missing:
            why = f" (the fit failed: {data['error']})" if "error" in data else ""
            raise FitError(f"an alpha-beta fit needs {', '.join(missing)}{why}")
        return cls(alpha_s=float(data["alpha_s"]), bandwidth_Bps=float(data["bandwidth_Bps"]),
                   n=int(data["n"]), points=int(data.get("points", 0)),
                   rms_rel_error=float(data.get("rms_rel_error", 0.0)),
                   max_rel_error=float(data.get("max_rel_error", 0.0)))


# "The busbw of large allreduces" (nccl-tests' figure, what `study predict --bandwidth` asks
# for): a benchmark's sizes from 1 MiB up.
LARGE_BYTES = 1 << 20
# A fit further than this from one of its measured times (relative) does not describe the
# link: on the local cluster's 250 Mbit/s link MPI's fit said 22.5 MB/s, max error 28 %, while
# every size from 1 MiB up ran at 28.3-28.8 MB/s. Then the large sizes' busbw is the figure.
POOR_FIT = 0.10


def large_busbw(sizes_bytes: Sequence[float], seconds: Sequence[float], n: int,
                least: int = LARGE_BYTES) -> dict | None:
    """The bus bandwidth (bytes/s) of the measured sizes of ``least`` bytes and more: their
    median, min and max, and how many sizes; None when no size is that large."""
    busbw = [float(bus_bandwidth(s, t, n)) for s, t in zip(sizes_bytes, seconds)
             if s >= least and t and t > 0]
    if not busbw:
        return None
    return {"median_Bps": statistics.median(busbw), "min_Bps": min(busbw),
            "max_Bps": max(busbw), "sizes": len(busbw), "least_bytes": least}


def fit_check(model: AlphaBeta, sizes_bytes: Sequence[float], seconds: Sequence[float],
              n: int) -> dict:
    """Whether a fit describes its measurements: ``poor`` when its max relative error is over
    :data:`POOR_FIT`; ``large_busbw``: :func:`large_busbw`; ``use_Bps``: the bandwidth to
    quote, the large sizes' median busbw where the fit is poor (the fit's B where no size is
    large)."""
    large = large_busbw(sizes_bytes, seconds, n)
    poor = model.max_rel_error > POOR_FIT
    return {"poor": poor, "max_rel_error": model.max_rel_error, "bar": POOR_FIT,
            "large_busbw": large, "fit_Bps": model.bandwidth_Bps,
            "use_Bps": large["median_Bps"] if poor and large else model.bandwidth_Bps}


def _figures(x: float) -> str:
    """Three significant figures, without an exponent: 7190, not 7.19e+03."""
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


IRLS_ROUNDS = 50             # reweighting rounds of the absolute-error fit (it settles in ~10)
IRLS_FLOOR = 1e-4            # errors under 0.01 % weigh as 0.01 %


def fit(sizes_bytes: Sequence[float], seconds: Sequence[float], n: int) -> AlphaBeta:
    """Fit α ≥ 0 and B > 0 to measured allreduce times on ``n`` ranks.

    The least sum of *relative* errors |t_model − t|/t, so a 4-byte latency point counts as
    much as a 64 MiB bandwidth point (plain least squares would let the largest time decide
    everything), and a size the two terms cannot explain does not pull the fit off at every
    other size: the absolute error, not its square (iteratively reweighted least squares). On
    the local cluster's `--fabric` link a 1 KiB allreduce overlapped 12 µs of latency with its
    wire time; squared errors raised B 5 % above what 64 KiB to 64 MiB measured to fit it.
    Needs n >= 2 (one rank has no ring) and two distinct sizes; refuses times that do not
    grow with size (no bandwidth to fit)."""
    n = _ring_size(n)
    s = np.asarray(sizes_bytes, dtype=float).ravel()
    t = np.asarray(seconds, dtype=float).ravel()
    if s.shape != t.shape:
        raise FitError(f"{s.size} sizes but {t.size} times")
    if not (np.all(np.isfinite(s)) and np.all(s >= 0)):
        raise FitError("sizes must be finite and >= 0")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise FitError("times must be finite and > 0")
    if np.unique(s).size < 2:
        raise FitError("need at least two distinct sizes to separate latency from bandwidth")
    steps, link_bytes = ring_terms(s, n)
    # Rows divided by t: minimise sum(((steps*a + link_bytes*b) - t) / t)^2 over a=α, b=1/B.
    x = np.stack([np.full_like(s, steps), link_bytes], axis=1) / t[:, None]
    y = np.ones_like(t)
    scale = np.linalg.norm(x, axis=0)          # the columns differ by ~1e7: condition them
    scale[scale == 0] = 1.0

    def solve(columns: list[int], w: np.ndarray) -> np.ndarray:
        p = np.zeros(2)
        root = np.sqrt(w)
        sol = np.linalg.lstsq(x[:, columns] / scale[columns] * root[:, None], y * root,
                              rcond=None)[0]
        p[columns] = sol / scale[columns]
        return p

    def bounded(w: np.ndarray) -> np.ndarray | None:
        """Two unknowns with bounds: the optimum is the free solution or lies on one bound."""
        candidates = [p for p in (solve([0, 1], w), solve([1], w), solve([0], w))
                      if np.all(p >= 0)]
        return min(candidates, key=lambda p: float(np.sum(w * (x @ p - y) ** 2))) \
            if candidates else None

    best = bounded(np.ones_like(t))
    for _ in range(IRLS_ROUNDS if best is not None else 0):
        # Weights 1/|error| turn squared errors into absolute ones (the floor: no one point
        # the fit passes through takes all the weight).
        step = bounded(1.0 / np.maximum(np.abs(x @ best - y), IRLS_FLOOR))
        if step is None or np.allclose(step, best, rtol=1e-9, atol=0):
            break
        best = step
    if best is None or best[1] <= 0:
        raise FitError("the times do not grow with size, so no bandwidth can be fitted; "
                       "measure larger sizes")
    alpha, inv_b = float(best[0]), float(best[1])
    rel = (x @ best - y)                        # (model - t) / t
    return AlphaBeta(alpha_s=alpha, bandwidth_Bps=1.0 / inv_b, n=n, points=int(s.size),
                     rms_rel_error=float(np.sqrt(np.mean(rel ** 2))),
                     max_rel_error=float(np.max(np.abs(rel))))

