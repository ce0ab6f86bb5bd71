"""Model definitions for both frameworks. One name means one architecture and one parameter
count in PyTorch and in TensorFlow (a test checks); frameworks are imported inside builders.

Inputs arrive channels-first (``[C, H, W]`` for images) in both frameworks, as the data layer
stores them; the TensorFlow models transpose to channels-last internally, which adds no
parameters.
"""

from __future__ import annotations

from importlib import import_module

MODELS = ("mlp", "resnet")


def build(name: str, backend: str, shape: tuple[int, ...], classes: int):
    """A model for ``backend`` ("torch" or "tensorflow") taking inputs of ``shape``."""
    if name not in MODELS:
        from hpcsuite.errors import UserError, close_match
        raise UserError(f"unknown model {name!r}{close_match(name, MODELS)}; "
                        f"models: {', '.join(MODELS)}")
    module = import_module(f"{__name__}.{name}")
    return getattr(module, f"build_{backend}")(tuple(shape), classes)
