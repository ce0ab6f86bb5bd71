"""The step clock and the planted stall of bench/scale.py, shared by its three jobs: the
managed loop (``train.loss: scale_loss.py:per_sample``), the hpcsuite.api script
(scale_script.py) and the plain Horovod script (scale_plain.py).

Every training step passes through :func:`per_sample` once, on every rank: it appends the
wall time (``time.time()``, one clock for the bench and every rank, all on one host) to
STEPS_DIR/rank-R.txt, and at step ``stall_step`` it sleeps ``stall_seconds`` (a long
checkpoint save, on every rank), with ``stall BEGIN`` and ``resume END`` lines around it.
The settings come from scale_config.json beside this file (the bench writes one per job);
the file lies outside the run directory, so the bench's own bytes are not counted as
hpcsuite's.
"""

import json
import os
import time
from pathlib import Path

_CONFIG = json.loads(Path(__file__).with_name("scale_config.json").read_text())
_state = {"step": 0, "out": None}


def _rank() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def _line(text: str) -> None:
    if _state["out"] is None:
        path = Path(_CONFIG["steps_dir"]) / f"rank-{_rank()}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        _state["out"] = open(path, "a", buffering=1)   # noqa: SIM115 - open for the rank's life
    _state["out"].write(text + "\n")


def mark_step() -> None:
    """One training step begins: its time, and the stall at the configured step."""
    _state["step"] += 1
    _line(f"{time.time():.6f}")
    if _state["step"] == _CONFIG["stall_step"] and _CONFIG["stall_seconds"] > 0:
        _line(f"stall {time.time():.6f}")
        time.sleep(_CONFIG["stall_seconds"])
        _line(f"resume {time.time():.6f}")


def per_sample(outputs, targets):
    """Cross entropy per sample; the managed loop's ``train.loss``. Its shape check passes two
    samples first: not a step."""
    import torch.nn.functional as F

    if len(targets) > 2:
        mark_step()
    return F.cross_entropy(outputs, targets, reduction="none")


def build_mlp(input_width: int = 32, classes: int = 10):
    """The built-in mlp's layers (two hidden layers of 64), for the two scripts."""
    import torch.nn as nn

    return nn.Sequential(nn.Flatten(), nn.Linear(input_width, 64), nn.ReLU(),
                         nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, classes))
