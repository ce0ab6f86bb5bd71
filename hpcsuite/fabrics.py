"""Interconnects as the step model sees them: a link's achievable bus bandwidth and its latency
per ring step, and the presets a site profile or `hpcsuite study predict --fabric` can name.

A core leaf (the standard library only): the site profile validates ``fabric:`` against these
names (:mod:`hpcsuite.submit.site_profile`), `study predict` reads them
(:mod:`hpcsuite.study.predict`).

Where each number comes from (docs/BENCHMARKS.md cites them in full):

* bandwidth is nccl-tests' *bus bandwidth* (``busbw``) of large allreduces, the number that
  does not depend on the ring size. NCCL's developers quote ~12 GB/s per 100 Gb/s NIC and
  ~24 GB/s per 200 Gb/s NIC as the peak (NVIDIA/nccl-tests#119, #29): 0.96 of the line rate.
  The other RDMA presets (25 Gb/s RoCE, 400 Gb/s NDR) apply that same 0.96 to their line rate.
  TCP sockets reach at most ~60 % of the wire speed in NCCL (NVIDIA/nccl#209): the TCP presets
  are 0.6 of the line rate. NVLink: ~230 GB/s busbw on A100 (NVIDIA/nccl-tests#149), ~370 GB/s
  on H100 with the ring algorithm (NVIDIA/nccl-tests#212).
* latency per ring step is NCCL's own cost model (src/graph/tuning.cc, ring, Simple protocol):
  9.6 us for a step over the network, 3.4 us over NVLink, plus 8.4 us once per allreduce.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Link", "Fabric", "PRESETS", "INTRA_PRESETS", "BASE_LATENCY_US", "preset",
           "intra_preset", "unknown_preset", "from_profile", "PREFLIGHT_SHARE",
           "preflight_bar_GBps"]

# NCCL's per-operation latency of a ring allreduce (tuning.cc baseLat, ring/Simple), in us.
BASE_LATENCY_US = 8.4
NET_LATENCY_US = 9.6       # tuning.cc hwLat[NET], ring/Simple
NVLINK_LATENCY_US = 3.4    # tuning.cc hwLat[NVLINK], ring/Simple
RDMA_OF_LINE_RATE = 0.96   # 12 GB/s of a 100 Gb/s NIC (12.5 GB/s line rate)
TCP_OF_LINE_RATE = 0.6     # NCCL over TCP sockets: at most ~60 % of wire speed


@dataclass(frozen=True)
class Link:
    """One kind of link: bus bandwidth in GB/s (1e9 bytes/s), latency per ring step in us."""

    bandwidth_GBps: float
    latency_us: float

    @property
    def bandwidth_Bps(self) -> float:
        return self.bandwidth_GBps * 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


@dataclass(frozen=True)
class Fabric:
    """The network between nodes, and the link between the GPUs of one node. ``two_level``:
    the site runs a ring inside each node and a ring across nodes (Horovod's hierarchical
    allreduce); otherwise one flat ring over every GPU. ``intra`` None: the GPUs of a node talk
    over the same kind of link as the nodes do (the conservative assumption).
    ``base_latency_us``: paid once by every allreduce, NCCL's for the presets; 0 for a fabric
    fitted to measured allreduces, whose per-step latency already holds all of it."""

    name: str
    inter: Link
    intra: Link | None = None
    two_level: bool = False
    base_latency_us: float = BASE_LATENCY_US

    def intra_link(self) -> Link:
        return self.intra or self.inter

    def in_words(self) -> str:
        text = (f"{self.name}: {self.inter.bandwidth_GBps:g} GB/s, {self.inter.latency_us:g} us "
                "per step between nodes")
        if self.intra:
            text += f"; {self.intra.bandwidth_GBps:g} GB/s, {self.intra.latency_us:g} us inside a node"
        return text + ("; two-level rings" if self.two_level else "; one flat ring")


def _gbit(line_rate_gbit: float, share: float) -> Link:
    return Link(round(line_rate_gbit / 8 * share, 3), NET_LATENCY_US)


PRESETS: dict[str, Link] = {
    "10gbe-tcp": _gbit(10, TCP_OF_LINE_RATE),
    "25gbe-tcp": _gbit(25, TCP_OF_LINE_RATE),
    "100gbe-tcp": _gbit(100, TCP_OF_LINE_RATE),
    "25gbe-roce": _gbit(25, RDMA_OF_LINE_RATE),
    "100gbe-roce": _gbit(100, RDMA_OF_LINE_RATE),
    "ib-edr": Link(12.0, NET_LATENCY_US),        # 100 Gb/s: quoted by NCCL's developers
    "ib-hdr": Link(24.0, NET_LATENCY_US),        # 200 Gb/s: quoted by NCCL's developers
    "ib-ndr": _gbit(400, RDMA_OF_LINE_RATE),
}
INTRA_PRESETS: dict[str, Link] = {
    "nvlink-a100": Link(230.0, NVLINK_LATENCY_US),
    "nvlink-h100": Link(370.0, NVLINK_LATENCY_US),
}


def unknown_preset(name: str, presets: dict | None = None) -> str | None:
    """Why ``name`` is no preset (None: it is one), with the valid names."""
    presets = PRESETS if presets is None else presets
    if name in presets:
        return None
    return f"{name!r} is not a fabric preset; presets: {', '.join(presets)}"


def preset(name: str) -> Link:
    problem = unknown_preset(name)
    if problem:
        raise ValueError(problem)
    return PRESETS[name]


def intra_preset(name: str) -> Link:
    problem = unknown_preset(name, INTRA_PRESETS)
    if problem:
        raise ValueError(problem)
    return INTRA_PRESETS[name]


def from_profile(value) -> Fabric | None:
    """The site profile's ``fabric`` (a preset name, or the validated record with bandwidth,
    latency, topology and intra_node) as a :class:`Fabric`; None when the site names none."""
    if value is None:
        return None
    if isinstance(value, str):
        return Fabric(value, preset(value))
    intra = value.intra_node
    return Fabric("site profile", Link(value.bandwidth, value.latency),
                  Link(intra.bandwidth, intra.latency) if intra else None,
                  value.topology == "two-level")


# A job's preflight with ``min_busbw_gbps: site`` (and `doctor`, `bench allreduce`, which show
# that bar): this share of the site's bus bandwidth. Below it a link is slower than the site's
# own figure by more than a measurement on a busy node varies.
PREFLIGHT_SHARE = 0.8


def site_busbw_GBps(value) -> float | None:
    """The site's bus bandwidth (GB/s) from the site profile's ``fabric`` (a preset name, the
    validated record, or its JSON in profile.json); None when the site names none."""
    if value is None:
        return None
    if isinstance(value, str):
        return preset(value).bandwidth_GBps
    return float(value["bandwidth"] if isinstance(value, dict) else value.bandwidth)


def preflight_bar_GBps(value) -> float | None:
    """The busbw (GB/s) a node pair must reach under ``min_busbw_gbps: site`` (None when the
    site names no fabric)."""
    bandwidth = site_busbw_GBps(value)
    return None if bandwidth is None else round(bandwidth * PREFLIGHT_SHARE, 6)
