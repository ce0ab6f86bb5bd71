"""What both framework backends share: Horovod's object collectives, the precision rules, the
model (built-in or the user's builder) and the checks that it fits the data.

A backend subclass adds the framework: the model's forward and backward pass, the optimizer,
the data adapter and its own tensor collectives (:mod:`.torch_backend`, :mod:`.tf_backend`).
"""

from __future__ import annotations

import logging
import os

import numpy as np

from ...errors import UserError
from ...runs import rundir
from ...submit.spec import JobSpec, precision_problem
from . import horovod_mpi
from ..rank import startup
from ..rank.startup import OFF
from ..input.blocks import block_size, plan_blocks
from ..input.workers import WORKER_BLOCK_BYTES, Workers

log = logging.getLogger(__name__)


class HorovodBackend:
    name = "?"

    def __init__(self, job: JobSpec, hvd, watch=OFF):
        self.job, self.train, self.hvd = job, job.train, hvd
        problem = precision_problem(self.name, self.train.precision)
        if problem:
            raise UserError(f"train.precision: {problem}")
        # the MPI library this Horovod links is the profile's mpi.flavour (runtime/frameworks/horovod_mpi.py)
        horovod_mpi.check(os.environ.get(rundir.ENV), getattr(hvd, "__file__", None))
        watch.mark(startup.IN_INIT)         # the startup watch names a hang in here
        hvd.init()
        watch.mark(startup.BEFORE_STEP)
        self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        self._workers = None                 # train.data.workers > 0: the run's loader workers

    # ---------------------------------------------------------------- the model
    def model_target(self, data):
        """The second argument of a model builder: the number of classes, or the target shape."""
        return data.classes if data.classes is not None else tuple(data.target_shape)

    def check_loss_fits(self, data) -> None:
        loss = self.train.loss
        if loss == "cross_entropy" and data.classes is None:
            raise UserError(f"train.loss: cross_entropy needs integer class labels; the data has "
                            f"float targets of shape {tuple(data.target_shape)} (use mse or your "
                            "own loss)")
        if loss == "mse" and data.classes is not None:
            raise UserError("train.loss: mse needs float targets; the data has integer class "
                            "labels (use cross_entropy)")

    def make_model(self, data):
        """The built-in model or the user's builder, called with (input shape, classes) and
        train.model_args."""
        from ... import models, usercode

        ref = usercode.parse(self.train.model)
        target = self.model_target(data)
        if ref is None:
            if data.classes is None:
                width = int(np.prod(target)) if target else 1
                return models.build(self.train.model, self.name, tuple(data.shape), width)
            return models.build(self.train.model, self.name, tuple(data.shape), data.classes)
        with usercode.blame("train.model", self.train.model):
            builder = usercode.load(ref, usercode.search_dirs(self.train.pythonpath))
            return builder(tuple(data.shape), target, **self.train.model_args)

    def user_loss(self):
        from ... import usercode

        ref = usercode.parse(self.train.loss)
        with usercode.blame("train.loss", self.train.loss):
            return usercode.load(ref, usercode.search_dirs(self.train.pythonpath)) if ref else None

    def check_output(self, out_shape, batch: int, data) -> None:
        """One line when the model's output does not fit the data."""
        out_shape = tuple(int(d) for d in out_shape)
        if data.classes is not None:
            want = (batch, data.classes)
            what = f"{data.classes} classes"
        else:
            want = (batch, *data.target_shape)
            what = f"targets of shape {tuple(data.target_shape)}"
        fits = out_shape == want or (data.classes is None and not data.target_shape
                                     and out_shape in ((batch,), (batch, 1)))
        if not fits:
            raise UserError(f"train.model: {self.train.model} gives outputs of shape {list(out_shape)} "
                            f"for a batch of {batch} inputs of shape {list(data.shape)}; the data "
                            f"needs {list(want)} ({what})")

    def check_per_sample(self, loss_shape, batch: int) -> None:
        if tuple(int(d) for d in loss_shape) != (batch,):
            raise UserError(f"train.loss: {self.train.loss} must return one loss per sample (shape "
                            f"[{batch}]) so padded samples can be left out; it returned shape "
                            f"{[int(d) for d in loss_shape]}")

    # ---------------------------------------------------------------- collectives on objects
    def broadcast_object(self, obj):
        return self.hvd.broadcast_object(obj, root_rank=0, name="hpcsuite.object")

    def allgather_object(self, obj):
        return self.hvd.allgather_object(obj, name="hpcsuite.gather")

    def common_versions(self) -> dict:
        import horovod

        return {"horovod": horovod.__version__, "numpy": np.__version__, "mpi": mpi_version()}

    def take_wait(self) -> float | None:
        """Seconds this rank waited in the gradients' allreduce since the last call; None
        where the backend cannot tell it from its own work (TensorFlow's allreduce runs inside
        the compiled step)."""
        return None

    # ---------------------------------------------------------------- loader workers
    def from_workers(self, data, batches):
        """(group, xs, ys) for each block of ``batches`` (a list, not empty) read by the run's
        loader workers (:mod:`hpcsuite.runtime.input.workers`: started on first use from the training data's recipe,
        stopped by :meth:`shutdown`): numpy arrays [k, B, ...] of their own."""
        if self._workers is None:
            self._workers = Workers(data.recipe, self.train.data.workers, self.train.data.prefetch)
        groups = plan_blocks(batches, block_size(data, len(batches[0].ids), WORKER_BLOCK_BYTES))
        return self._workers.feed(data, groups)

    def shutdown(self) -> None:
        if self._workers is not None:
            self._workers.close()
        self.hvd.shutdown()


def mpi_version() -> str | None:
    """The MPI library's name and version for results.json, or None (a Gloo-only Horovod).

    Asked of the libmpi this process loaded, with ``MPI_Get_library_version``, which MPI allows
    before ``MPI_Init`` and after ``MPI_Finalize``: not through mpi4py, whose import after
    Horovod's shutdown asked a finalised MPICH for its world's size and aborted rank 0 before it
    wrote its results (MPICH under srun --mpi=pmi2, one run in five)."""
    path = horovod_mpi.loaded_libmpi()
    version = horovod_mpi.library_version(path) if path else None
    if version is None:
        log.warning("results.json without the MPI version: %s", f"{path} does not answer "
                    "MPI_Get_library_version" if path else "this process loaded no libmpi")
    return version
