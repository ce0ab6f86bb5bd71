"""Framework state as numpy arrays: what ``run.save()`` takes and ``Restored.state`` gives back,
``{group: {name: numpy array}}``, for PyTorch and Keras 3 (re-exported by :mod:`hpcsuite.api`).

The frameworks are imported here only, inside the functions, when a script calls them.
"""

from __future__ import annotations

import numpy as np

from ...errors import UserError

def torch_state(model, optimizer=None) -> dict[str, dict[str, np.ndarray]]:
    """``{"model": ..., "optimizer": ...}`` of a torch module and optimizer, as numpy arrays:
    the model's state_dict, the optimizer's per-parameter state (``state.I.KEY``: moments, step
    counts) and its numeric hyperparameters (``group.G.KEY``: lr, betas, ...; a scheduler's
    changes survive the restart)."""
    import torch

    def array(t):
        t = t.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()

    out = {"model": {k: array(v) for k, v in model.state_dict().items()}}
    if optimizer is not None:
        sd = optimizer.state_dict()
        optim = {}
        for idx, entry in sd["state"].items():
            for key, value in entry.items():
                optim[f"state.{idx}.{key}"] = array(value) if torch.is_tensor(value) else np.asarray(value)
        for g, group in enumerate(sd["param_groups"]):
            for key, value in group.items():
                if key != "params" and _numeric(value):
                    optim[f"group.{g}.{key}"] = np.asarray(value, dtype=np.float64)
        out["optimizer"] = optim
    return out


def _numeric(value) -> bool:
    items = value if isinstance(value, (tuple, list)) else [value]
    return bool(items) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items)


def load_torch_state(model, optimizer, state: dict) -> None:
    """Put ``torch_state(model, optimizer)`` (from ``restored.state``) back; ``optimizer``
    may be None. A checkpoint of another model or optimizer is a UserError naming the key."""
    import torch

    params = {k: torch.from_numpy(np.array(v)) for k, v in _group(state, "model").items()}
    try:
        model.load_state_dict(params, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise UserError(f"checkpoint: model: does not fit this model ({' '.join(first[:2])})") from None
    if optimizer is None:
        return
    current = optimizer.state_dict()
    groups = [dict(g) for g in current["param_groups"]]
    per_param: dict[int, dict] = {}
    for name, value in _group(state, "optimizer").items():
        kind, index, key = (name.split(".", 2) + ["", ""])[:3]
        if kind == "state" and index.isdigit():
            per_param.setdefault(int(index), {})[key] = torch.from_numpy(np.array(value))
        elif kind == "group" and index.isdigit() and int(index) < len(groups) and key:
            was, value = groups[int(index)].get(key), np.asarray(value)
            if isinstance(was, (tuple, list)) or value.ndim:
                groups[int(index)][key] = type(was or ())(float(x) for x in value.ravel())
            else:    # the type it has here (int, float), or a float (a scheduler's initial_lr)
                groups[int(index)][key] = type(was)(value) if isinstance(was, (int, float)) \
                    else float(value)
        else:
            raise UserError(f"checkpoint: optimizer.{name}: not a state of this optimizer "
                            f"({type(optimizer).__name__} with {len(groups)} parameter group(s))")
    count = sum(len(g["params"]) for g in groups)
    if per_param and max(per_param) >= count:
        raise UserError(f"checkpoint: optimizer: state for parameter {max(per_param)}, this "
                        f"optimizer has {count}")
    optimizer.load_state_dict({"state": per_param, "param_groups": groups})


def keras_state(model, optimizer=None) -> dict[str, dict[str, np.ndarray]]:
    """``{"model": ..., "optimizer": ...}`` of a Keras 3 model and optimizer by variable path
    (the optimizer's iterations, moments and learning rate are its ``variables``)."""
    out = {"model": _by_path(model.variables, "model")}
    if optimizer is not None:
        out["optimizer"] = _by_path(optimizer.variables, "optimizer")
    return out


def load_keras_state(model, optimizer, state: dict) -> None:
    """Assign ``keras_state(model, optimizer)`` (from ``restored.state``) back; builds the
    optimizer on the model's trainable variables first when it has not been built."""
    groups = [("model", model.variables)]
    if optimizer is not None:
        if not getattr(optimizer, "built", True):
            optimizer.build(model.trainable_variables)
        groups.append(("optimizer", optimizer.variables))
    for group, variables in groups:
        saved = _group(state, group)
        names = [v.path for v in variables]
        missing, unknown = sorted(set(names) - set(saved)), sorted(set(saved) - set(names))
        if missing or unknown:
            raise UserError(f"checkpoint: {group}: variables differ from this {group}'s "
                            f"(missing {missing[:3]}, unexpected {unknown[:3]})")
        for v in variables:
            if tuple(saved[v.path].shape) != tuple(v.shape):
                raise UserError(f"checkpoint: {group}.{v.path}: shape {list(saved[v.path].shape)}, "
                                f"this {group} has {list(v.shape)}")
            v.assign(saved[v.path])


def _by_path(variables, group: str) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for v in variables:
        if v.path in out:
            raise UserError(f"{group}: two variables named {v.path!r}: give the layers "
                            "distinct names to checkpoint them")
        out[v.path] = np.asarray(v.numpy())
    return out


def _group(state: dict, group: str) -> dict:
    """``state[group]`` ({name: array}); the optimizer group may be absent (nothing to load)."""
    if not isinstance(state, dict) or not isinstance(state.get(group, {}), dict):
        raise UserError(f"checkpoint: expected {{{group!r}: {{name: array}}}} (what "
                        "torch_state/keras_state make)")
    if group != "optimizer" and group not in state:
        raise UserError(f"checkpoint: no {group!r} group (it holds {sorted(state)})")
    return state.get(group, {})
