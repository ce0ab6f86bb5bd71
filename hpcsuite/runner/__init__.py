"""The runner between the CLI and Slurm (TorchX's cli → runner → scheduler).

Four verbs, each one call for a command:

* :func:`prepare` resolves a spec, lints it (against Slurm's partitions too when asked) and
  plans it into a :class:`~hpcsuite.submit.plan.BatchRequest`; warnings are returned, not printed.
* :func:`submit` refuses what would go wrong in the job and hands the request to sbatch.
* :func:`wait` follows a job to its end: one :class:`Outcome` (state, results, log tail, exit
  class), whose :meth:`Outcome.error` is the exception a command raises for it.
* :func:`describe` is one :class:`StatusRecord` of a run, which
  ``status`` (text and ``--json``), ``runs`` and ``submit --wait``'s live line print.

Light: it imports only what a login-node command needs; the rest comes in where it is used.
"""

from __future__ import annotations

from .prepare import LintFailed, Prepared, check, held, prepare, submit, validate_templates
from .status import StatusRecord, describe, describe_many
from .wait import (COMPLETED, EXIT_CODES, FAILED, INPUT_ERROR, NEVER_STARTS, STOPPED, Outcome,
                   wait)

__all__ = ["COMPLETED", "EXIT_CODES", "FAILED", "INPUT_ERROR", "NEVER_STARTS", "STOPPED",
           "LintFailed", "Outcome", "Prepared", "StatusRecord", "check", "describe",
           "describe_many", "held", "prepare", "submit", "validate_templates", "wait"]
