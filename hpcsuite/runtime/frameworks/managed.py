"""The managed mode's backend for ``train.backend``: the one place that picks a framework (and
imports it, only when called)."""

from __future__ import annotations

from ..rank.startup import OFF


def make_backend(job, watch=OFF):
    """The backend, told the rank's startup watch (it marks Horovod's init)."""
    if job.train.backend == "tensorflow":
        from .tf_backend import TensorFlowBackend
        return TensorFlowBackend(job, watch)
    from .torch_backend import TorchBackend
    return TorchBackend(job, watch)
