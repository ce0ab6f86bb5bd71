"""The α-β ring-allreduce model, kept at its old path: it lives in the core,
:mod:`hpcsuite.alphabeta`, where the rank program may import it too.

Nothing here but the names. This module stays while code still imports them from study
(``study/report.py``; code written against ``hpcsuite.study.alphabeta``); new code imports
``hpcsuite.alphabeta``.
"""

from ..alphabeta import (MODEL, AlphaBeta, FitError, algorithm_bandwidth, bus_bandwidth, fit,
                         ring_terms)

__all__ = ["MODEL", "AlphaBeta", "FitError", "fit", "ring_terms", "algorithm_bandwidth",
           "bus_bandwidth"]
