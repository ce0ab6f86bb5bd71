"""``hpcsuite.results.Results``, the path the README gave users for reading results.json; the
module is :mod:`hpcsuite.runs.results`."""

from .runs.results import Results  # noqa: F401
