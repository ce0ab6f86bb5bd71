"""A sweep submitted as one Slurm job array, and one element submitted again.

Before anything is submitted every element is resolved through the site's layers and locks
(its axis values as ``--set``), linted and planned: :func:`plan_sweep` stops at the first
element that breaks a rule, naming the element and the key. Every element must render the
same batch script (the header, environment and launch), since a job array runs one script;
what differs between elements reaches the ranks through each element's ``job.json``, which
hpcsuite writes into the sweep directory and the script copies into the element's run
directory (``$SLURM_ARRAY_TASK_ID`` picks it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

from ..errors import ConfigError, UserError, show
from ..records import Record, record
from ..runs.results import write_json_atomic
from ..submit.plan import ArrayPlan, BatchRequest
from ..submit.schema import to_dict
from .spec import Element, Sweep, expand, load_sweep, set_text
from .sweepdir import SweepDir


@record
class PlannedSweep(Record):
    """Every element checked and planned: what `sweep run` submits, or prints with --dry-run."""

    sweep: Sweep
    source: str                       # the sweep file
    sd: SweepDir
    base: Path                        # the base job spec (absolute)
    workdir: Path                     # where sbatch runs and run directories are relative to
    elements: list                    # Element, with every --set it is prepared with
    jobs: list                        # each element's resolved JobSpec
    request: BatchRequest             # the array's script (every element renders the same)
    warnings: list                    # lint warnings, "FILE: key: message", once each
    site_profile: bool                # whether a site profile was in force

    @property
    def array(self) -> ArrayPlan:
        return self.request.array


def plan_sweep(sweep_path: str, directory: str | None = None, profile_path: str | None = None,
               template_dir: str | None = None, against_slurm: bool = True) -> PlannedSweep:
    """Check and plan every element of the sweep file (nothing is written or submitted)."""
    sweep = load_sweep(sweep_path)
    src = Path(sweep_path).resolve()
    base = src.parent / sweep.base
    if not base.is_file():
        raise ConfigError(sweep_path, "base", f"{show(sweep.base)}: no such file")
    sd = SweepDir(Path(directory) if directory else src.parent / sweep.output_dir / sweep.name)
    workdir = Path.cwd()
    elements = expand(sweep)
    limit = _max_parallel(sweep, sweep_path, base, profile_path, workdir)
    n = len(elements)
    array = ArrayPlan(spec=f"0-{n - 1}%{min(limit, n)}" if n > 1 else "0",
                      elements=str(sd.elements_dir), digest=_digest(base, elements))
    prepared, planned = [], []
    for element in elements:
        p, element = prepare_element(sweep_path, sweep, sd, base, element, workdir, profile_path,
                                     template_dir, array, against_slurm and not prepared)
        prepared.append(p)
        planned.append(element)
        if p.request.script != prepared[0].request.script:
            _refuse_different_script(sweep_path, sweep, sd, base, planned, prepared, workdir,
                                     profile_path, template_dir, array)
    _check_checkpoint_dirs(sweep_path, planned, [p.request.job for p in prepared])
    warnings = list(dict.fromkeys(f"{sweep.base}: {w.key}: {w.message}"
                                  for p in prepared for w in p.warnings))
    return PlannedSweep(sweep=sweep, source=sweep_path, sd=sd, base=base, workdir=workdir,
                        elements=planned, jobs=[p.request.job for p in prepared],
                        request=prepared[0].request, warnings=warnings,
                        site_profile=prepared[0].site_profile)


def prepare_element(sweep_path: str, sweep: Sweep, sd: SweepDir, base: Path, element: Element,
                    workdir: Path, profile_path, template_dir, array: ArrayPlan,
                    against_slurm: bool):
    """(the element prepared as an array element, the element with every --set it took):
    the sweep's name, its axis values, and its own checkpoint directory when its job saves
    checkpoints and names none (elements running at once must not share one)."""
    from ..runner import prepare

    sets = [f"name={sweep.name}", *element.sets]
    try:
        p = prepare(str(base), profile_path, template_dir, sets, against_slurm, cwd=workdir,
                    array=array)
        ck = p.request.job.train.checkpoint
        if ck.enabled and ck.dir is None:
            sets.append(f"train.checkpoint.dir="
                        f"{set_text('train.checkpoint.dir', str(sd.checkpoints(element.index)))}")
            p = prepare(str(base), profile_path, template_dir, sets, against_slurm, cwd=workdir,
                        array=array)
    except UserError as e:
        raise element_error(sweep_path, element, e) from None
    return p, dataclasses.replace(element, sets=sets[1:])


def element_error(sweep_path: str, element: Element, e: UserError) -> UserError:
    """What refused an element, said of the sweep file: ``SWEEP: elements[I].KEY: message
    (element I: its axis values)``; a lint's first error (and how many more)."""
    from ..runner import LintFailed

    where = f"elements[{element.index}]"
    values = f"(element {element.index}: {element.label()})"
    if isinstance(e, LintFailed) and e.errors:
        more = f"; {len(e.errors) - 1} more error(s)" if len(e.errors) > 1 else ""
        first = e.errors[0]
        return ConfigError(sweep_path, f"{where}.{first.key}", f"{first.message}{more} {values}")
    if isinstance(e, ConfigError) and e.key:
        message = str(e)[len(f"{e.source}: {e.key}: "):]
        inside = "" if e.source == "--set" else f" (in {e.source})"
        return ConfigError(sweep_path, f"{where}.{e.key}", f"{message}{inside} {values}")
    return ConfigError(sweep_path, where, f"{e} {values}")


def _max_parallel(sweep: Sweep, sweep_path: str, base: Path, profile_path, workdir: Path) -> int:
    """The sweep's max_parallel, within the site's sweep_max_parallel (its default)."""
    from ..submit.config import resolve

    site = resolve(str(base), profile_path, [f"name={sweep.name}"], cwd=workdir).profile
    ceiling = site.sweep_max_parallel
    if sweep.max_parallel is not None and sweep.max_parallel > ceiling:
        raise ConfigError(sweep_path, "max_parallel", f"{sweep.max_parallel} is above this "
                                                      f"site's sweep_max_parallel ({ceiling})")
    return sweep.max_parallel or ceiling


def _digest(base: Path, elements: list[Element]) -> str:
    """What the array's script names as its digest: the base spec and every element's sets."""
    text = json.dumps({"base": hashlib.sha256(base.read_bytes()).hexdigest(),
                       "elements": [e.sets for e in elements]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _refuse_different_script(sweep_path, sweep, sd, base, planned, prepared, workdir,
                             profile_path, template_dir, array) -> None:
    """Element -1 renders another script than element 0: find the axis that does it (element
    0 with that one value changed) and refuse, naming it and the first line that differs."""
    first, last = planned[0], planned[-1]
    script = prepared[0].request.script
    suspects = [k for k in sweep.axes if first.values[k] != last.values[k]]
    culprit = suspects[0] if len(suspects) == 1 else None
    for key in suspects if len(suspects) > 1 else ():
        values = {**first.values, key: last.values[key]}
        probe = Element(index=first.index, values=values,
                        sets=[f"{k}={set_text(k, v)}" for k, v in values.items()])
        p, _ = prepare_element(sweep_path, sweep, sd, base, probe, workdir, profile_path,
                               template_dir, array, False)
        if p.request.script != script:
            culprit = key
            break
    other = prepared[-1].request.script.splitlines()
    lineno, line = next(((i, b) for i, (a, b) in enumerate(zip(script.splitlines(), other), 1)
                         if a != b), (len(other), other[-1] if other else ""))
    where = f"axes.{culprit}" if culprit else "axes"
    what = f"{culprit}={last.values[culprit]}" if culprit else last.label()
    raise ConfigError(sweep_path, where, f"element {last.index} ({what}) renders another batch "
                      f"script than element 0 (line {lineno}: {line[:80]!r}); a job array runs "
                      "one script, so an axis may vary only what the ranks read from job.json, "
                      "not the #SBATCH header, environment or launch: sweep it in separate "
                      "sweeps")


def _check_checkpoint_dirs(sweep_path: str, elements: list[Element], jobs: list) -> None:
    seen: dict[str, int] = {}
    for element, job in zip(elements, jobs):
        ck = job.train.checkpoint
        if not ck.enabled:
            continue
        if ck.dir in seen:
            raise ConfigError(sweep_path, "train.checkpoint.dir", f"elements {seen[ck.dir]} and "
                              f"{element.index} would both keep checkpoints in {ck.dir}; leave "
                              "it unset (each element then gets its own in the sweep directory)")
        seen[ck.dir] = element.index


# ---------------------------------------------------------------------- acting

def create(planned: PlannedSweep) -> SweepDir:
    """Write the sweep directory: the sweep file, elements.json and each element's job.json
    (made aside and moved into place, so a failure leaves no half sweep)."""
    sd = planned.sd
    if sd.path.exists():
        raise UserError(f"{sd.path}: already exists; `hpcsuite sweep status {sd.path}` shows that "
                        "sweep, or give another --dir (or another name)")
    tmp = sd.path.with_name(f".{sd.path.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        staged = SweepDir(tmp)
        shutil.copyfile(planned.source, staged.sweep_file)
        for element, job in zip(planned.elements, planned.jobs):
            path = staged.element_job(element.index)
            path.parent.mkdir(parents=True)
            path.write_text(job_json(job))
        write_json_atomic(staged.elements_file, {
            "name": planned.sweep.name, "base": str(planned.base),
            "workdir": str(planned.workdir), "run_root": planned.request.run_root,
            "job_name": planned.request.job.name, "digest": planned.array.digest,
            "axes": planned.sweep.axes, "metric": to_dict(planned.sweep.metric),
            "random": to_dict(planned.sweep.random),
            "elements": [to_dict(e) for e in planned.elements]})
        os.replace(tmp, sd.path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sd


def job_json(job) -> str:
    """The element's job.json: the resolved job as the template writes a plain job's."""
    return json.dumps(job.to_dict(), sort_keys=True, ensure_ascii=True) + "\n"


def submit_array(sd: SweepDir, request: BatchRequest, indices: list[int], jobs: list,
                 waits_for: list[str] = ()) -> str:
    """Submit the array through :func:`hpcsuite.runner.submit` (``jobs``: its elements', each
    checked before sbatch like a plain job; ``waits_for``: jobs it starts after, all of them
    ended), which records it in the sweep directory and the run registry. Returns the array's
    job id."""
    from ..runner import submit

    if waits_for:
        request = dataclasses.replace(request, sbatch_argv=[
            *request.sbatch_argv, f"--dependency={throttle_dependency(request.job, waits_for)}"])
    return submit(request, jobs=jobs, sweep=sd, indices=indices, waits_for=waits_for).job_id


def run(planned: PlannedSweep) -> tuple[SweepDir, str]:
    """Write the sweep directory and submit every element as one job array."""
    sd = create(planned)
    indices = [e.index for e in planned.elements]
    return sd, submit_array(sd, planned.request, indices, planned.jobs)


def max_parallel(sd: SweepDir) -> int:
    """How many of the sweep's elements may run at once: the ``%N`` of its array as first
    submitted (every element at once when it had none)."""
    subs = sd.submissions()
    if not subs:
        return len(sd.elements())
    spec = str(subs[0].get("array", ""))
    limit = spec.rpartition("%")[2]
    return int(limit) if "%" in spec and limit.isdigit() else len(subs[0]["indices"])


def waits_for(sd: SweepDir, rows: dict[int, dict], limit: int) -> list[str]:
    """The jobs a resubmitted element must wait for (every one ended) so that no more than
    ``limit`` of the sweep's elements run at once. Slurm's ``%N`` throttles one array only:
    the first array's pending elements start as its running ones end, and a one-element array
    beside it is not counted. So it waits for all of the sweep's jobs that wait or run now
    but the newest ``limit - 1`` (oldest submission first, by index within one): once those
    have ended at most ``limit - 1`` of the others are left, and each later resubmission
    waits the same way, so at any moment the newest running job sees at most ``limit - 1``
    running beside it."""
    from ..runs.rundir import element_id

    live = []
    for sub in sd.submissions():
        for index in sub["indices"]:
            job_id = element_id(sub["array_job_id"], index)
            row = rows.get(index)
            if row and row["job_id"] == job_id and not row["finished"]:
                live.append(job_id)
    live = list(dict.fromkeys(live))
    return live[:len(live) - (limit - 1)] if len(live) >= limit else []


def throttle_dependency(job, ids: list[str]) -> str:
    """sbatch --dependency for a resubmission: the job's own ``after`` (which the command
    line would otherwise replace) and afterany on ``ids``."""
    from ..submit.plan import dependency

    own = dependency(list(job.after)) if job.after else ""
    return ",".join(p for p in (own, "afterany:" + ":".join(ids)) if p)


@record
class Resubmitted(Record):
    job_id: str                       # the one-element array's id
    waits_for: list                   # the sweep's jobs it starts after (max_parallel)
    max_parallel: int


def resubmit(sd: SweepDir, index: int, profile_path: str | None = None,
             template_dir: str | None = None, query=None,
             against_slurm: bool = True) -> Resubmitted:
    """Submit element ``index`` again, alone (a one-element array, ``--array=INDEX``), with
    the job it was first submitted with: resolved again now and refused when that differs
    (the base spec or a profile changed). Refused while its job is queued or running, or once
    it completed. It keeps the sweep's max_parallel: it waits (a dependency) for the sweep's
    jobs that would otherwise run beside it (:func:`waits_for`)."""
    from .status import element_rows

    d = sd.definition()
    elements = {e.index: e for e in sd.elements()}
    if index not in elements:
        raise UserError(f"{sd.path}: no element {index}; the sweep has elements 0 to "
                        f"{len(elements) - 1}")
    rows = element_rows(sd, query)[0]
    row = rows[index]
    if row["job_id"] and not row["finished"]:
        raise UserError(f"element {index} is {row['state']} as job {row['job_id']}; "
                        f"`hpcsuite cancel {row['job_id']}` first to run it again")
    if row["done"]:
        raise UserError(f"element {index} completed as job {row['job_id']}; nothing to resubmit")
    sweep = Sweep(name=d["name"], base=d["base"])
    workdir = Path(d["workdir"])
    array = ArrayPlan(spec=str(index), elements=str(sd.elements_dir), digest=d["digest"])
    p, _ = prepare_element(str(sd.elements_file), sweep, sd, Path(d["base"]), elements[index],
                           workdir, profile_path, template_dir, array, against_slurm)
    job = p.request.job
    recorded = json.loads(sd.element_job(index).read_text())
    now = json.loads(job_json(job))
    if recorded != now:
        key = _first_difference(recorded, now)
        raise UserError(f"{sd.element_job(index)}: element {index} now resolves to another job "
                        f"({key}); the base spec or a profile changed since the sweep was "
                        "submitted. Run a new sweep for the changed job")
    limit = max_parallel(sd)
    waits = waits_for(sd, rows, limit)
    return Resubmitted(job_id=submit_array(sd, p.request, [index], [job], waits),
                       waits_for=waits, max_parallel=limit)


def _first_difference(a, b, prefix: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{prefix}.{key}" if prefix
                                         else key)
    return f"{prefix}: {show(a)} then, {show(b)} now"
