"""Reading the sample ledger (``train.ledger``): which sample ids each rank trained, per step.

Each attempt of a job writes ``ledger/rank-R-attempt-N.txt`` in its run directory, one line per
micro-batch: ``EPOCH STEP ID ID ...``, flushed with every checkpoint. An attempt that ended
without a checkpoint (a crash, a lost node) may have written lines past the step the next
attempt resumed from: that work was lost and is trained again, so :func:`committed` keeps an
attempt's lines only up to the next attempt's ``start_step``.
"""

from __future__ import annotations

import collections
from pathlib import Path

from ..errors import UserError
from .rundir import RunDir


def read(run_dir: str | Path) -> dict[int, list[tuple[int, int, list[int]]]]:
    """{attempt: [(epoch, step, ids), ...]} over every rank's file; a damaged line is a
    UserError naming the file and line."""
    out: dict[int, list] = collections.defaultdict(list)
    for f, attempt in RunDir(run_dir).ledger_files().items():
        text = f.read_text(errors="replace")
        lines = text.splitlines()
        for number, line in enumerate(lines, 1):
            fields = line.split()
            if len(fields) < 2 or not all(x.isdigit() for x in fields) or \
                    (number == len(lines) and not text.endswith("\n")):
                raise UserError(f"{f}:{number}: not a ledger line (EPOCH STEP ID...): "
                                f"{line[:60]!r}; the ledger is damaged")
            out[attempt].append((int(fields[0]), int(fields[1]), [int(x) for x in fields[2:]]))
    return dict(out)


def committed(run_dir: str | Path) -> dict[int, collections.Counter]:
    """{epoch: Counter(sample id -> times trained)} over the attempts' committed steps."""
    from .results import attempt_summaries

    starts = {a["attempt"]: a.get("start_step") for a in attempt_summaries(run_dir)}
    by_attempt = read(run_dir)
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for attempt, lines in sorted(by_attempt.items()):
        later = [starts[k] for k in sorted(starts) if k > attempt and starts[k] is not None]
        limit = later[0] if later else None
        for epoch, step, ids in lines:
            if limit is None or step <= limit:
                seen[epoch].update(ids)
    return dict(seen)


def exactly_once(run_dirs, samples: int, epochs: int) -> list[str]:
    """What is wrong with the claim "every sample exactly once per epoch" ([] if nothing)."""
    total: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for d in run_dirs:
        for epoch, counts in committed(d).items():
            total[epoch].update(counts)
    problems = []
    if sorted(total) != list(range(epochs)):
        problems.append(f"epochs seen {sorted(total)}, expected 0..{epochs - 1}")
    for epoch, counts in sorted(total.items()):
        missing = samples - len(set(counts) & set(range(samples)))
        repeated = sum(1 for c in counts.values() if c > 1)
        if missing or repeated:
            problems.append(f"epoch {epoch}: {missing} samples missing, {repeated} repeated")
    return problems
