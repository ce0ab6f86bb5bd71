"""Model definitions for both frameworks. One name means one architecture and parameter count
in PyTorch and in TensorFlow; frameworks are imported inside the builders only."""

from __future__ import annotations

from importlib import import_module

MODELS = ("mlp",)


def build(name: str, backend: str, features: int, classes: int):
    if name not in MODELS:
        from hpcsuite.errors import UserError, close_match
        raise UserError(f"unknown model {name!r}{close_match(name, MODELS)}; "
                        f"models: {', '.join(MODELS)}")
    module = import_module(f"{__name__}.{name}")
    return getattr(module, f"build_{backend}")(features, classes)
