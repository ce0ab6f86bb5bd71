"""Known failures of users' training scripts, each with where the docs answer it: the hint a
failing rank adds to its report (``FAILED-attempt-N``, the job's log, ``status``,
``submit --wait``)."""

from __future__ import annotations

KERAS_3 = ("Horovod's TF2/Keras examples do not run under Keras 3 (Horovod issue #4290): "
           "docs/user/your-code.md#keras-3 says what to change")

# (a piece of the exception's "Type: message" line, the hint)
KNOWN = (
    ("experimental_run_tf_function", KERAS_3),                    # model.compile(...) of the examples
    # Keras 3 variables given to Horovod: hvd.DistributedGradientTape, hvd.broadcast_variables
    ("'Variable' object has no attribute 'ref'", KERAS_3),
    ("'SymbolicTensor' object has no attribute 'assign'", KERAS_3),
)


def hint(raised: str) -> str | None:
    """The hint for an exception whose one-line ``Type: message`` is ``raised``, or None."""
    return next((text for piece, text in KNOWN if piece in raised), None)
