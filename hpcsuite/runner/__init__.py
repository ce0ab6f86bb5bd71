"""The runner between the CLI and Slurm (TorchX's cli → runner → scheduler).

Four verbs, each one call for a command:

* :func:`prepare` resolves a spec, lints it (against Slurm's partitions too when asked) and
  plans it into a :class:`~hpcsuite.submit.plan.BatchRequest`; warnings are returned, not printed.
* :func:`submit` refuses what would go wrong in the job, hands the request to sbatch and
  records it: the one way to Slurm for a plain job, a study's point and a sweep's job array.
* :func:`wait` follows a job to its end: one :class:`Outcome` (state, results, log tail, exit
  class), whose :meth:`Outcome.error` is the exception a command raises for it.
* :func:`describe` is one :class:`StatusRecord` of a run, which
  ``status`` (text and ``--json``), ``runs`` and ``submit --wait``'s live line print.

Around them (:mod:`.control`): a job's :func:`state` (:func:`states` of many), its
:func:`slurm_log`, why it is :func:`waiting`, :func:`follow` (a log to the job's end),
:func:`tail`, :func:`cancel`. Every Slurm effect of the login node goes through this package.

Light: it imports only what a login-node command needs; the rest comes in where it is used.
"""

from __future__ import annotations

from .control import cancel, follow, slurm_log, state, states, tail, waiting
from .prepare import LintFailed, Prepared, check, prepare, slurm_findings, validate_templates
from .status import StatusRecord, describe, describe_many
from .submit import Submitted, held, submit
from .wait import (COMPLETED, EXIT_CODES, FAILED, INPUT_ERROR, NEVER_STARTS, STOPPED, Outcome,
                   wait)

__all__ = ["COMPLETED", "EXIT_CODES", "FAILED", "INPUT_ERROR", "NEVER_STARTS", "STOPPED",
           "LintFailed", "Outcome", "Prepared", "StatusRecord", "Submitted", "cancel", "check",
           "describe", "describe_many", "follow", "held", "prepare", "slurm_findings",
           "slurm_log", "state", "states", "submit", "tail", "validate_templates", "wait",
           "waiting"]
