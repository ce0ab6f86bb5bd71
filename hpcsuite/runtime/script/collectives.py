"""Script mode's :class:`~hpcsuite.runtime.frameworks.protocol.Collectives` over the script's own
Horovod module.

The script initialised ``horovod.torch`` or ``horovod.tensorflow``; both give object collectives,
so script mode needs no framework tensor of its own: its vote is an allgather of the vote vector
and the Max taken here, at once (a script asks ``should_stop`` and wants the answer now).
"""

from __future__ import annotations


class Single:
    """Stand-in for a Horovod module outside a job (one process): for trying a script."""

    @staticmethod
    def rank():
        return 0

    @staticmethod
    def size():
        return 1

    @staticmethod
    def broadcast_object(obj, root_rank=0, name=None):
        return obj

    @staticmethod
    def allgather_object(obj, name=None):
        return [obj]

    @staticmethod
    def allreduce(tensor, op=None, name=None):
        return tensor

    Sum = None


class HorovodObjects:
    """The session's collectives over ``hvd`` (a Horovod framework module, or :class:`Single`)."""

    def __init__(self, hvd=None):
        self.hvd = hvd or Single()
        self.rank, self.size = int(self.hvd.rank()), int(self.hvd.size())

    def broadcast_object(self, obj):
        return self.hvd.broadcast_object(obj, root_rank=0, name="hpcsuite.api.object")

    def allgather_object(self, obj) -> list:
        return self.hvd.allgather_object(obj, name="hpcsuite.api.gather")

    def vote_start(self, values: list[int]) -> list[int]:
        rows = self.hvd.allgather_object([int(v) for v in values], name="hpcsuite.api.poll")
        return [max(column) for column in zip(*rows)]

    def vote_result(self, handle: list[int]) -> list[int]:
        return handle

    def allreduce_sums(self, values: list[float]) -> list[float]:
        """Over the script's own framework: horovod.torch's allreduce takes a torch tensor,
        horovod.tensorflow's a TensorFlow one (a stand-in outside a job: the values)."""
        name = getattr(self.hvd, "__name__", "")
        if name.startswith("horovod.torch"):
            import torch

            tensor = torch.tensor(values, dtype=torch.float64)
        elif name.startswith("horovod."):
            import tensorflow as tf

            tensor = tf.constant(values, tf.float64)
        else:
            return self.hvd.allreduce(list(values), op=self.hvd.Sum, name="hpcsuite.api.sums")
        done = self.hvd.allreduce(tensor, op=self.hvd.Sum, name="hpcsuite.api.sums")
        return (done.numpy() if hasattr(done, "numpy") else done).tolist()
