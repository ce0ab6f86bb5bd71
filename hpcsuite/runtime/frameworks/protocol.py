"""What a backend and the ranks' collectives offer the session: two protocols, no code.

:class:`Collectives` is what a :class:`~hpcsuite.runtime.session.session.Session` needs of the
ranks (the Horovod backends implement it on their own tensors, script mode over the script's
``hvd`` module, tests with threads); :class:`Backend` is what the managed loop
(:class:`~hpcsuite.runtime.session.loop.Trainer`) needs of a framework
(:mod:`.torch_backend`, :mod:`.tf_backend`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..input.sharding import Batch


class Collectives(Protocol):
    """What a session needs of the ranks: every call is collective (all ranks, same order)."""
    rank: int
    size: int

    def broadcast_object(self, obj): ...        # rank 0's ``obj`` on every rank
    def allgather_object(self, obj) -> list: ...   # every rank's ``obj``, by rank
    # The vote: an int32 Max allreduce of ``values``, started now and read later (it may
    # travel with the next step's gradients); every rank reads the same vector.
    def vote_start(self, values: list[int]) -> object: ...
    def vote_result(self, handle: object) -> list[int]: ...
    # Element-wise float64 sums over the ranks, on every rank (the same length on each): a
    # per-step series summed across the job in MPI's allreduce, not gathered rank by rank.
    def allreduce_sums(self, values: list[float]) -> list[float]: ...


class Backend(Collectives, Protocol):
    name: str
    rank: int
    size: int
    local_rank: int

    def build(self, data) -> None: ...
    # (batch, inputs): inputs is the backend's own handle on the micro-batch's tensors.
    def feed(self, data, batches: list[Batch]) -> Iterator[tuple[Batch, object]]: ...
    def micro_step(self, inputs, scale: float, last: bool, padded: bool) -> object: ...
    def eval_step(self, inputs) -> tuple[float, float]: ...
    def set_lr(self, lr: float) -> None: ...
    def losses_to_floats(self, losses: list) -> list[float]: ...   # in one call for many
    def state(self) -> tuple[dict[str, dict[str, np.ndarray]], dict]: ...
    def load_state(self, tensors: dict[str, dict[str, np.ndarray]], extra: dict) -> None: ...
    def broadcast_state(self) -> None: ...
    def checksum(self) -> str: ...
    def gradient_sizes(self) -> list[int]: ...
    def take_wait(self) -> float | None: ...   # seconds in the allreduce since the last call
    def precision_seen(self) -> dict: ...  # what the training steps computed in (results)
    def versions(self) -> dict: ...
    def shutdown(self) -> None: ...
