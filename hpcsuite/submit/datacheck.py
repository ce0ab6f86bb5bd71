"""What `lint` and `submit` can check of a job's data cheaply, on the login node: an HDF5
file's dataset names, shapes and dtypes, an npy directory's shard headers. Nothing is read
beyond metadata (h5py and numpy's .npy header reader are imported only for a job that has
such data), and a path this machine cannot see is left to the ranks, with a warning.

The ranks check the same and more when they open the data (:mod:`hpcsuite.runtime.input.data`);
here each problem is found before the queue wait, naming the spec key it is about."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import count
from .lint import Finding
from .spec import Data, JobSpec

SHARD = re.compile(r"^(inputs|labels)-(\d+)\.npy$")   # runtime/input/data.py's layout
_LISTED = 12     # datasets named in an error, at most


def data_findings(job: JobSpec, base: Path | None = None) -> list[Finding]:
    """Findings about ``train.data`` and ``train.eval.data`` (script mode brings its own)."""
    t = job.train
    if t.script is not None:
        return []
    out: list[Finding] = []
    for key, data in (("train.data", t.data), ("train.eval.data", t.eval.data if t.eval else None)):
        if data is None or data.kind not in ("hdf5", "npy") or not data.path:
            continue
        path = Path(data.path)
        if not path.is_absolute():
            path = (base or Path.cwd()) / path
        if not path.exists():
            out.append(Finding("warning", f"{key}.path", f"{data.path}: not found on this "
                               "machine, so not checked here; the ranks must find it"))
        elif data.kind == "hdf5":
            out += hdf5_findings(key, data, path)
        else:
            out += npy_findings(key, path)
    return out


def hdf5_findings(key: str, data: Data, path: Path) -> list[Finding]:
    """The file's two datasets exist, have rows to pair, and labels a rank can use."""
    try:
        import h5py
    except ImportError:          # the ranks need it, not the login node: they will say so
        return []
    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as e:
        return [Finding("error", f"{key}.path", f"{path}: not a readable HDF5 file ({e})")]
    with f:
        names: list[str] = []
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset)
                     else None)
        out, sets = [], {}
        for field in ("inputs", "labels"):
            name = getattr(data, field)
            obj = f.get(name)
            if isinstance(obj, h5py.Dataset):
                sets[field] = obj
                continue
            shown = ", ".join(sorted(names)[:_LISTED]) + (", ..." if len(names) > _LISTED else "")
            out.append(Finding("error", f"{key}.{field}",
                               f"{path}: no dataset {name!r}; the file's datasets: "
                               f"{shown or 'none'}"))
        if out:
            return out
        x, y = sets["inputs"], sets["labels"]
        if not x.shape or x.shape[0] == 0:
            return [Finding("error", f"{key}.inputs", f"{path}: {data.inputs} has no rows "
                                                      f"(shape {x.shape})")]
        if not y.shape or y.shape[0] != x.shape[0]:
            return [Finding("error", f"{key}.labels",
                            f"{path}: {data.labels} has {y.shape[0] if y.shape else 0} rows "
                            f"for the {x.shape[0]} rows of {data.inputs}")]
        kind = y.dtype.kind
        if kind in "iu" and len(y.shape) != 1:
            return [Finding("error", f"{key}.labels", f"{path}: integer labels {data.labels} "
                                                      f"must be one per row, not shape {y.shape}")]
        if kind not in "iuf":
            return [Finding("error", f"{key}.labels", f"{path}: {data.labels} holds {y.dtype}; "
                                                      "use integers (classes) or floats (targets)")]
    return []


def npy_findings(key: str, root: Path) -> list[Finding]:
    """The shards pair up, and each pair's headers agree (rows, sample shape, integer labels)."""
    from numpy.lib import format as npy

    if not root.is_dir():
        return [Finding("error", f"{key}.path", f"{root} is not a directory (npy data is a "
                                                "directory of inputs-NNNNN.npy/labels-NNNNN.npy)")]
    found: dict[str, dict[str, Path]] = {"inputs": {}, "labels": {}}
    for p in root.iterdir():
        m = SHARD.match(p.name)
        if m:
            found[m.group(1)][m.group(2)] = p
    if not found["inputs"]:
        return [Finding("error", f"{key}.path", f"{root}: no inputs-NNNNN.npy shards")]
    odd = sorted(found["inputs"].keys() ^ found["labels"].keys())
    if odd:
        return [Finding("error", f"{key}.path", f"{root}: {count(len(odd), 'shard')} "
                                                f"({', '.join(odd[:_LISTED])}) lack their "
                                                "inputs or labels file")]

    def header(p: Path):
        with open(p, "rb") as f:
            version = npy.read_magic(f)
            read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
            shape, _fortran, dtype = read(f)
        return shape, dtype

    first = None
    for shard in sorted(found["inputs"]):
        try:
            (xs, _), (ys, yt) = header(found["inputs"][shard]), header(found["labels"][shard])
        except (OSError, ValueError) as e:
            return [Finding("error", f"{key}.path", f"{root}: shard {shard} is not a readable "
                                                    f".npy array ({e})")]
        p = found["labels"][shard]
        if not xs or not ys or xs[0] != ys[0]:
            return [Finding("error", f"{key}.path", f"{p}: {ys[0] if ys else 0} labels for "
                                                    f"{xs[0] if xs else 0} inputs")]
        if yt.kind not in "iu":
            return [Finding("error", f"{key}.path", f"{p}: labels must be integers, not {yt}")]
        if first is not None and xs[1:] != first:
            return [Finding("error", f"{key}.path", f"{found['inputs'][shard]}: sample shape "
                                                    f"{xs[1:]} differs from {first} in the "
                                                    "first shard")]
        first = xs[1:] if first is None else first
    return []
