"""`hpcsuite lint --build`: what a rank checks when it starts, done on the login node in one
process before submitting, so a mistake costs seconds instead of a queue wait.

It opens the job's data (calling a data factory), builds the model with the job's backend (the
user's builder, the backend of what it returns), runs two samples through the model and the
loss (output shape against the data, one loss per sample), exactly as a rank does, as a single
Horovod process. Run by :func:`hpcsuite.submit.lint.build_findings` in a subprocess (this imports the
framework; the CLI never does), which reads one JSON line: ``{"findings": [[key, message]]}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def check(job_path: str) -> list[tuple[str, str]]:
    from ... import usercode
    from ...errors import UserError
    from ..input.data import open_train_eval
    from ..rank.job_io import load_job
    from ..frameworks.managed import make_backend
    from ..rank.userframes import user_traceback

    job = load_job(job_path)
    t = job.train
    if t.script:
        return [("train.script", "script mode: the script builds its own model and data; "
                                 "--build has nothing to check (try it with `python SCRIPT`)")]
    try:
        data, held = open_train_eval(t, t.seed, usercode.search_dirs(t.pythonpath))
        backend = make_backend(job)
        backend.build(data)
        if held is not None:
            backend.check_output(backend_output_shape(backend, held), 2, held)
    except UserError as e:
        key, _, message = str(e).partition(": ")
        return [(key, message)] if key.startswith("train.") else [("train", str(e))]
    except BaseException as e:  # noqa: BLE001 - the user's code: name the key, show the trace
        import traceback

        key = getattr(e, "hpcsuite_key", None) or "train"
        what = traceback.format_exception_only(type(e), e)[0].strip()   # no notes, no trace
        where = user_traceback(e).splitlines()
        frame = next((l.strip() for l in reversed(where) if l.strip().startswith("File ")), "")
        return [(key.split(" ")[0], f"{key.partition(' ')[2].strip('()') or 'user code'} raised "
                                    f"{what}" + (f" ({frame})" if frame else ""))]
    return []


def backend_output_shape(backend, held):
    """The model's output shape for two held-out samples (the eval data must fit it too)."""
    import numpy as np

    x, _ = held.get(np.array([0, min(1, len(held) - 1)], dtype=np.int64))
    if backend.name == "torch":
        torch = backend.torch
        with torch.no_grad():
            return tuple(backend.model(torch.from_numpy(x).to(backend.device)).shape)
    return tuple(backend.model(x, training=False).shape)


def main() -> None:
    import logging

    logging.disable(logging.WARNING)
    findings = check(sys.argv[1])
    print(json.dumps({"findings": findings}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path.cwd()))
    main()
