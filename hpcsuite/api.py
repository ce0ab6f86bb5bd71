"""hpcsuite.api: what your own Horovod training script gets from hpcsuite (script mode).

With ``train.script: train.py`` in the job spec, the template launches ``train.py`` on every
rank, with the job's environment, Horovod knobs, signal forwarding and run directory. The
script brings its own model and loop; this module gives it the parts that make a job safe to
stop and resume, framework-neutral (it only needs the ``horovod.torch`` or
``horovod.tensorflow`` module the script already initialised)::

    import horovod.torch as hvd
    from hpcsuite import api

    hvd.init()
    run = api.Run(hvd)                          # the job: spec, run directory, rank, size
    restored = run.restore()                    # the latest good checkpoint, on every rank
    if restored:                                # the model and the optimizer's moments
        api.load_torch_state(model, optimizer, restored.state)
    for batch in run.batches(len(data)):        # this rank's share, every sample once per epoch
        x, y = data[batch.ids]
        loss = step(x, y, batch.weights)        # weight 0 marks padding: leave it out of the loss
        run.log(loss=float(loss))               # once per optimizer step: results.json metrics
        if run.should_stop():                   # all ranks agree: a preemption signal came
            run.save(api.torch_state(model, optimizer))
            break
        if run.checkpoint_due():
            run.save(api.torch_state(model, optimizer))
    run.finish(params=api.torch_state(model)["model"])   # results.json; preempted runs requeue

The slow rank: ``optimizer = run.time_allreduce(hvd.DistributedOptimizer(...))`` times the
gradients' allreduce (``with run.waiting(): ...`` times a script's own), so each rank's own work
per step rides ``should_stop``'s vote and rank 0 names a rank the others wait for, by the
managed loop's rule (status, report, results.json ``rank_balance``).

Keras 3: ``api.keras_state(model, optimizer)`` and ``api.load_keras_state(model, optimizer,
restored.state)`` (the optimizer's variables: iterations, moments, its learning rate).

Everything here is collective where it says so: every rank must call ``restore``,
``should_stop``, ``finish`` (and iterate ``batches``) the same number of times.

Outside a job (trying a script by hand, one process): ``HPCSUITE_SPEC=job.yaml python
train.py``, or ``api.Run(hvd, spec="job.yaml")``, resolves the spec through the site, user and
project profiles the way ``hpcsuite submit`` would and runs it here, in
``OUTPUT_DIR/NAME/local/TIME`` (checkpoints in ``OUTPUT_DIR/NAME/local/checkpoints``, so a
second try resumes the first, and a Slurm job's checkpoints are never touched).
"""

from __future__ import annotations

# The public face only: the code is the runtime's (runtime/script/script_run.py, script_job.py,
# framework_state.py), where nothing imports back up to here.
from .runtime.frameworks.framework_state import keras_state, load_keras_state, load_torch_state, torch_state
from .runtime.script.script_run import Restored, Run, active, load_checkpoint  # noqa: F401 (active)
from .runtime.input.sharding import Batch

__all__ = ["Run", "Restored", "Batch", "torch_state", "load_torch_state", "keras_state",
           "load_keras_state", "load_checkpoint"]
