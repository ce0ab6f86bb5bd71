"""prepare: a spec resolved, linted and planned into a BatchRequest, which
:func:`hpcsuite.runner.submit` hands to sbatch after the checks that need the file
system."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from pathlib import Path

from ..errors import UserError
from ..submit.lint import Finding
from ..submit.plan import BatchRequest
from ..records import Record, record


class LintFailed(UserError):
    """The spec breaks a rule (one line per error, ``FILE: key: message``); ``errors`` and
    ``warnings`` are the findings, for a caller that words them otherwise (a study point)."""

    def __init__(self, source: str, errors: list[Finding], warnings: list[Finding]):
        self.errors, self.warnings = errors, warnings
        super().__init__("\nerror: ".join(f"{source}: {f.key}: {f.message}" for f in errors))


@record
class Prepared(Record):
    """A planned job: the request, the warnings its lint found, and whether a site profile
    was in force (when not, only hpcsuite's own checks applied)."""

    request: BatchRequest
    warnings: list = field(default_factory=list)
    site_profile: bool = True
    # each "KEY: what to know", e.g. "after: job 5 already completed ...": a dependency
    # already satisfied, the site's python running the ranks instead of this one
    notes: list = field(default_factory=list)


def check(resolved, base: Path | None = None, against_slurm: bool = False) -> list[Finding]:
    """Every finding about a resolved job; Slurm is asked only when nothing else is wrong."""
    from ..submit.datacheck import data_findings
    from ..submit.lint import ignored_findings, lint

    findings = lint(resolved.job, resolved.profile, base) + data_findings(resolved.job, base) \
        + ignored_findings(resolved.job, resolved.origins)
    if against_slurm and not any(f.level == "error" for f in findings):
        findings += slurm_findings(resolved.job)
    return findings


def slurm_findings(job) -> list[Finding]:
    """What Slurm says of the job (its partition's limits, asked of sinfo and scontrol)."""
    from ..submit import lint

    return lint.slurm_findings(job)


def prepare(spec: str, profile_path: str | None = None, template_dir: str | None = None,
            sets=(), against_slurm: bool = False, cwd: Path | None = None,
            after: tuple[str, ...] = (), array=None) -> Prepared:
    """Resolve, lint and plan SPEC. ``cwd``: the directory the spec's relative paths and the
    job's submission start from (default: here). ``after``: dependencies beyond the spec's
    (``submit --after``); names become job ids, and with ``against_slurm`` each is checked
    against Slurm. ``array``: plan it as a job array's script
    (:class:`~hpcsuite.submit.plan.ArrayPlan`). Raises :class:`LintFailed` on errors; a
    UserError raised by planning carries the lint's ``warnings`` too."""
    from ..submit.config import resolve
    from ..submit.plan import plan
    from ..submit.templating import SearchPath

    r = resolve(spec, profile_path, sets, **({"cwd": cwd} if cwd is not None else {}))
    findings = check(r, cwd, against_slurm)
    warnings = [f for f in findings if f.level == "warning"]
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise LintFailed(spec, errors, warnings)
    notes: list[str] = []
    try:
        job = anchored(r.job, cwd or Path.cwd())
        if job.after or after:
            job, notes = with_dependencies(job, after, spec, cwd or Path.cwd(), against_slurm)
        path = SearchPath.default(template_dir, cwd, site_only="template" in r.locks)
        request = plan(job, r.profile, path, r.locks, array)
    except UserError as e:
        e.warnings = warnings
        raise
    if against_slurm:        # what changed in Slurm after 22.05, on the script it will read
        from .against_slurm import rule_findings

        more = rule_findings(request.script)
        warnings += [f for f in more if f.level == "warning"]
        if any(f.level == "error" for f in more):
            raise LintFailed(spec, [f for f in more if f.level == "error"], warnings)
    # Absolute: sbatch runs there, so a path under it given relative to here (the staged
    # script's) would be taken from inside it a second time.
    request = dataclasses.replace(request, spec=str(Path(spec).resolve()),
                                  **({"workdir": str(Path(cwd).absolute())} if cwd is not None
                                     else {}))
    return Prepared(request=request, warnings=warnings, notes=notes + python_notes(job, r.profile),
                    site_profile=any(layer.name == "site" for layer in r.layers))


def python_notes(job, profile) -> list[str]:
    """Said when the profile's ``python`` (an absolute path) runs the ranks and hpcsuite runs
    under another interpreter: what a user installed in a venv of their own is then not the
    job's. A command name is looked up on the job's PATH, so it is not judged here; a job in
    a container runs the image's Python."""
    import os
    import sys

    python = profile.python
    if not python or not os.path.isabs(python) or job.container.image is not None:
        return []
    if same_interpreter(python, sys.executable):
        return []
    return [f"python: the ranks run the site profile's python ({python}), not the one hpcsuite "
            f"runs under ({sys.executable}): packages installed only there are not the job's"]


def same_interpreter(a: str, b: str) -> bool:
    """Whether two interpreter paths are one environment's: the same file, reached from the same
    directory (a venv's bin/python is a link to the base interpreter, so its target alone would
    make every venv of one Python the same)."""
    import os

    return (os.path.realpath(os.path.dirname(a)) == os.path.realpath(os.path.dirname(b))
            and os.path.realpath(a) == os.path.realpath(b))


def anchored(job, workdir: Path):
    """``job`` with a relative train.checkpoint.dir made absolute against ``workdir``, the
    submit directory: job.json then names one directory for the ranks (whose working
    directory that is) and for every later reader on the login node (``status`` from any
    directory, ``attempt end``), which would otherwise each resolve it against their own.
    A directory the job neither writes nor resumes from stays as written (a study point's,
    whose bundle must not name where it was made)."""
    ck = job.train.checkpoint
    if not ck.dir or Path(ck.dir).is_absolute() or not (ck.enabled or ck.resume):
        return job
    where = str(Path(workdir).absolute() / ck.dir)
    return dataclasses.replace(job, train=dataclasses.replace(
        job.train, checkpoint=dataclasses.replace(ck, dir=where)))


def with_dependencies(job, extra: tuple[str, ...], spec: str, workdir: Path, ask_slurm: bool):
    """(``job`` with ``after`` plus ``extra`` as job ids, notes on those already satisfied)."""
    import re

    from ..submit.values import AFTER, AFTER_HELP
    from . import after

    for entry in extra:
        if not re.fullmatch(AFTER, entry):
            raise UserError(f"--after: {entry[:80]!r} is not valid: {AFTER_HELP}")
    pending, notes = after.job_ids_to_wait_for(job.after, workdir, ask_slurm, source=f"{spec}: after")
    more, more_notes = after.job_ids_to_wait_for(list(extra), workdir, ask_slurm, source="--after")
    return (dataclasses.replace(job, after=list(dict.fromkeys(pending + more))),
            [f"after: {note}" for note in notes + more_notes])


def validate_templates(path, names: list[str], specs: list[Path],
                       profile_path: str | None) -> list[str]:
    """Render every template in ``names`` against every example spec (one with its own
    profile-NAME.yaml, a container site, with that profile); problems as strings, each once
    however many specs it broke (a template's error is the template's, not each spec's)."""
    from ..submit.config import resolve
    from ..submit.plan import plan

    problems: dict[str, list[str]] = {}
    for spec in specs:
        from ..submit.golden import profile_of

        resolved = resolve(str(spec), profile_of(spec, profile_path), ambient=False)
        for name in names:
            job = dataclasses.replace(resolved.job, template=name)
            try:
                plan(job, resolved.profile, path, resolved.locks)
            except UserError as e:
                problems.setdefault(str(e), []).append(spec.name)
    return [f"{text} (rendering {broke[0]}" + (f" and {len(broke) - 1} other example spec"
                                                f"{'s' if len(broke) > 2 else ''})" if broke[1:] else ")")
            for text, broke in problems.items()]
