"""Scaling studies: a base job swept over axes, each point a Slurm job, kept in one bundle.

A study spec (YAML, validated like a job spec) names a base job spec and the axes to sweep.
:func:`plan` expands it into points (every combination of the axes, times the repeats), each
a complete job spec checked against the site's rules before anything is submitted. Beside the
training points come the no-communication limit (the same job with
``train.horovod.allreduce: false``) and one allreduce benchmark per multi-rank allocation, so
the report can read each point's efficiency against what the hardware allows and explain it
with the ring-allreduce model (:mod:`hpcsuite.alphabeta`).

The study directory is the bundle::

    study.yaml             the study spec as given
    bundle.json            where the base spec sits in inputs/, external inputs, when made
    inputs/                the base spec's directory: spec, user code, data
    points.json            the expanded points (id, kind, axes, repeat, job name)
    points/ID/job.yaml     each point's resolved job spec; job.sbatch, the rendered script
    environment.json       versions: hpcsuite, Python, torch, TensorFlow, Horovod build, MPI, Slurm, git
    inputs.sha256          sha256 of every input (``sha256sum -c`` reads it)
    state.json             job id, Slurm state and attempts of each point
    runs/                  the jobs' run directories (results.json, logs)

Every point runs from ``inputs/``, so a study is re-run from its bundle alone
(:func:`rerun`) and two bundles are compared input by input (:mod:`hpcsuite.study.compare`).
The bundle's files and their sha256 are :mod:`hpcsuite.study.bundle`'s, following the points
in Slurm :mod:`hpcsuite.study.run`'s, the versions :mod:`hpcsuite.study.env`'s.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import os
import shutil
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from ..runs import registry
from ..errors import ConfigError, UserError, show
from ..submit.knobs import SWEEPABLE
from ..records import Record, meta, record
from ..submit.schema import build, read_yaml
from ..submit.spec import AFTER, AFTER_HELP, PATH, PATH_HELP, JobSpec
from .bundle import (BUNDLE_FILE, POINTS_FILE, STATE_FILE, STUDY_FILE, copy_inputs, external_inputs,
                     file_sha256, verify_bundle, write_environment, write_manifest)

MAX_ATTEMPTS = 3

# Axis names a study may sweep, and the job key each sets.
AXES = {
    "nodes": "resources.nodes",
    "tasks_per_node": "resources.tasks_per_node",
    "batch_size": "train.batch_size",
    "precision": "train.precision",
    "grad_accumulation": "train.grad_accumulation",
}
HOROVOD_AXES = SWEEPABLE      # horovod.<knob>: the knobs hpcsuite.submit.knobs marks sweepable


@record
class Study(Record):
    name: str = field(metadata=meta("study name (the study directory and job names derive from it)",
                                  pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}",
                                  pattern_help="letters, digits, _ . - (at most 40)"))
    base: str = field(metadata=meta("the base job spec (YAML), relative to the study file",
                                  pattern=PATH, pattern_help=PATH_HELP))
    mode: Literal["weak", "strong"] = field(default="weak", metadata=meta(
        "weak: batch_size is per rank and stays fixed; strong: batch_size is the global batch, "
        "split over the ranks"))
    axes: dict[str, list[Any]] = field(default_factory=dict, metadata=meta(
        "what to sweep: nodes, tasks_per_node, batch_size, precision, grad_accumulation, "
        f"horovod.<knob> ({', '.join(SWEEPABLE)})"))
    repeats: int = field(default=2, metadata=meta("jobs per point", min=1, max=50))
    warmup_steps: int = field(default=10, metadata=meta("steps left out of the timing", min=0,
                                                      max=100000))
    steps: int = field(default=50, metadata=meta("measured steps per job", min=3, max=10**7))
    limit: bool = field(default=True, metadata=meta(
        "also run each point without the gradient allreduce: the no-communication limit"))
    allreduce_bench: bool = field(default=True, metadata=meta(
        "measure allreduce on each multi-rank allocation, for the ring-allreduce model"))
    max_in_flight: int = field(default=1, metadata=meta(
        "jobs of this study queued or running at once (jobs that run together share nodes "
        "and network: more finishes sooner and measures noisier)", min=1, max=1000))
    output_dir: str = field(default="studies", metadata=meta(
        "where the study directory goes, relative to the study file",
        pattern=PATH, pattern_help=PATH_HELP))
    after: list[str] = field(default_factory=list, metadata=meta(
        "every job of the study starts only after these jobs: JOB, JOB:any or JOB:notok "
        "(a job id, or the name of a job submitted from the base spec's directory)",
        pattern=AFTER, pattern_help=AFTER_HELP, coerce=True))


def load_study(path: str) -> Study:
    study = build(Study, read_yaml(path), path)
    for key, values in study.axes.items():
        if key not in AXES and not (key.startswith("horovod.") and key[8:] in HOROVOD_AXES):
            valid = ", ".join([*AXES, *(f"horovod.{k}" for k in HOROVOD_AXES)])
            raise ConfigError(path, f"axes.{key}", f"not an axis a study sweeps; valid: {valid}")
        if not isinstance(values, list) or not values:
            raise ConfigError(path, f"axes.{key}", "expected a non-empty list of values")
        if len(values) > 64:
            raise ConfigError(path, f"axes.{key}", f"{len(values)} values; at most 64")
        if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
            raise ConfigError(path, f"axes.{key}", "a value appears twice")
    count = 1
    for values in study.axes.values():
        count *= len(values)
    if count * study.repeats > 2000:
        raise ConfigError(path, "axes", f"{count} points × {study.repeats} repeats is more than "
                                        "2000 jobs")
    return study


def axis_key(axis: str) -> str:
    return AXES.get(axis) or f"train.{axis}"


# ---------------------------------------------------------------------- points

@record
class Point(Record):
    id: str                     # p03-r1, p03L-r1 (limit), a02 (allreduce benchmark)
    kind: str                   # train | limit | allreduce
    config: str                 # p03: the configuration (same for its repeats and its limit)
    axes: dict                  # axis -> value, with nodes and tasks_per_node always present
    repeat: int
    job_name: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def ranks(self) -> int:
        return int(self.axes["nodes"]) * int(self.axes["tasks_per_node"])


def expand(study: Study, base: JobSpec) -> list[Point]:
    """Every point, in submission order: repeat by repeat, each configuration's training job
    next to its limit, so slow drift of the machine falls on both alike."""
    axes = dict(study.axes)
    axes.setdefault("nodes", [base.resources.nodes])
    axes.setdefault("tasks_per_node", [base.resources.tasks_per_node])
    names = list(axes)
    configs = [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]
    points = []
    for repeat in range(study.repeats):
        for i, config in enumerate(configs):
            cid = f"p{i:02d}"
            kinds = ["train", "limit"] if study.limit and not base.train.script else ["train"]
            for kind in kinds:
                pid = f"{cid}{'L' if kind == 'limit' else ''}-r{repeat}"
                points.append(Point(pid, kind, cid, config, repeat, f"{study.name}-{pid}"))
    if study.allreduce_bench:
        places = sorted({(int(c["nodes"]), int(c["tasks_per_node"])) for c in configs})
        for j, (nodes, tpn) in enumerate(p for p in places if p[0] * p[1] >= 2):
            pid = f"a{j:02d}"
            points.append(Point(pid, "allreduce", pid, {"nodes": nodes, "tasks_per_node": tpn},
                                0, f"{study.name}-{pid}"))
    return points


def point_sets(study: Study, base: JobSpec, point: Point, output_dir: str) -> list[str]:
    """The --set assignments that make ``point`` out of the base job."""
    values: dict[str, Any] = {axis_key(a): v for a, v in point.axes.items()}
    if study.mode == "strong":
        global_batch = point.axes.get("batch_size", base.train.batch_size)
        ranks = point.ranks
        if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch % ranks:
            raise UserError(f"axes.batch_size: strong scaling splits the global batch "
                            f"{show(global_batch)} over {ranks} ranks, which does not divide it")
        values["train.batch_size"] = global_batch // ranks
    values.update({
        "name": point.job_name, "output_dir": output_dir,
        "train.max_steps": study.warmup_steps + study.steps,
        "train.epochs": 1000000,                 # max_steps ends the job
        "train.checkpoint.every_steps": 0, "train.checkpoint.every_minutes": 0,
        "train.checkpoint.resume": False, "train.preemption.requeue": False,
    })
    if point.kind == "limit":
        values["train.horovod.allreduce"] = False
    tracking = base.train.tracking
    if tracking is not None and tracking.mlflow.experiment is None:
        values["train.tracking.mlflow.experiment"] = study.name   # the points, one experiment
    return [f"{k}={json.dumps(v)}" for k, v in values.items()]


# ---------------------------------------------------------------------- a study directory

class StudyDir:
    """A study's directory: its bundle, points and state."""

    def __init__(self, path: Path):
        # Absolute: the points are submitted from inside it (inputs/, where sbatch runs), and
        # a path given relative to here would be taken from there a second time.
        self.path = Path(path).absolute()

    @property
    def study_file(self) -> Path:
        return self.path / STUDY_FILE

    def study(self) -> Study:
        return load_study(str(self.study_file))

    def bundle(self) -> dict:
        return self._json(BUNDLE_FILE)

    def points(self) -> list[Point]:
        return [Point(**p) for p in self._json(POINTS_FILE)["points"]]

    def point_spec(self, point: Point) -> Path:
        return self.path / "points" / point.id / "job.yaml"

    def point_script(self, point: Point) -> Path:
        """The point's rendered script, named as a run directory names its own."""
        from ..runs.rundir import SCRIPT

        return self.path / "points" / point.id / SCRIPT

    @property
    def workdir(self) -> Path:
        """Where the jobs are submitted from: the base spec's directory in the bundle."""
        return self.path / "inputs"

    @property
    def runs(self) -> Path:
        return self.path / "runs"

    def state(self) -> dict:
        return self._json(STATE_FILE) if (self.path / STATE_FILE).is_file() else {}

    def save_state(self, state: dict) -> None:
        from ..runs.results import write_json_atomic

        write_json_atomic(self.path / STATE_FILE, state)

    def run_dir(self, point: Point, job_id: str) -> Path:
        return self.runs / point.job_name / job_id

    def _json(self, name: str) -> dict:
        path = self.path / name
        if not path.is_file():
            raise UserError(f"{self.path}: not a study directory (no {name})")
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None


def point_request(sd: StudyDir, study: Study, base_spec: Path, base: JobSpec, point: Point,
                  profile_path: str | None, from_bundle: bool, against_slurm: bool = False):
    """Resolve, lint and render one point (:func:`hpcsuite.runner.prepare`); (JobSpec,
    BatchRequest). Raises UserError.

    At planning the point is the base spec with the point's --set assignments; from the
    bundle it is the point's resolved job.yaml (so a re-run is the same job whatever the
    user's and project's profiles say), with the output directory of this study directory.
    An allreduce benchmark is always built afresh (:func:`hpcsuite.study.allreduce_job.
    job_spec`): it runs hpcsuite's installed rank program. ``against_slurm``: also refuse what
    Slurm's partition can never give the point."""
    import yaml

    from ..runner import LintFailed, prepare
    from .allreduce_job import job_spec

    if point.kind == "allreduce":
        spec_path = sd.path / "points" / point.id / "allreduce.yaml"
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(yaml.safe_dump(job_spec(
            None, point.axes["nodes"], point.axes["tasks_per_node"], str(sd.runs),
            budget_s=None, name=point.job_name, base=base), sort_keys=False))
        spec, sets = str(spec_path), []
    elif from_bundle:
        spec, sets = str(sd.point_spec(point)), [f"output_dir={json.dumps(str(sd.runs))}"]
    else:
        spec, sets = str(base_spec), point_sets(study, base, point, str(sd.runs))
    try:
        prepared = prepare(spec, profile_path, None, sets, against_slurm, cwd=base_spec.parent,
                           after=tuple(study.after))
    except LintFailed as e:
        raise UserError("; ".join(f"{f.key}: {f.message}" for f in e.errors)) from None
    return prepared.request.job, prepared.request


def create(study_path: str, directory: str | None, profile_path: str | None,
           ask_tools: bool = True) -> StudyDir:
    """Make the study directory and its bundle, and check every point against the site before
    anything is submitted. An existing directory of the same study is returned as it is.
    ``ask_tools=False`` (a dry run) leaves the tools' versions not yet cached pending."""
    study = load_study(study_path)
    src = Path(study_path).resolve()
    sd = StudyDir(Path(directory) if directory else src.parent / study.output_dir / study.name)
    if sd.study_file.is_file():
        if file_sha256(sd.study_file) != file_sha256(src):
            raise UserError(f"{sd.path}: holds a study made from a different {STUDY_FILE}; give "
                            "another --dir, or remove it")
        return sd
    if sd.path.exists() and any(sd.path.iterdir()):
        raise UserError(f"{sd.path}: exists and is not a study directory; give another --dir")
    base_src = (src.parent / study.base).resolve()
    if not base_src.is_file():
        raise ConfigError(study_path, "base", f"{study.base}: no such file")
    tmp = sd.path.with_name(f".{sd.path.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        shutil.copy2(src, tmp / STUDY_FILE)
        copy_inputs(base_src.parent, tmp / "inputs", exclude=sd.path.parent)
        staged = StudyDir(tmp)
        base_spec = tmp / "inputs" / base_src.name
        try:
            _plan_points(staged, study, base_spec, profile_path, study_path, ask_tools)
        except UserError as e:   # name the user's files, not the bundle being made
            raise UserError(str(e).replace(str(tmp / "inputs"), str(base_src.parent))) from None
        base = base_job(base_spec, profile_path)
        external = {p: file_sha256(Path(p)) for p in external_inputs(base)
                    if Path(p).is_file()}
        (tmp / BUNDLE_FILE).write_text(json.dumps({
            "study": study.name, "base": base_src.name, "source": str(src),
            "external": external, "git": registry.git_state(base_src.parent),
            "made": dt.datetime.now().isoformat(timespec="seconds")}, indent=2) + "\n")
        write_environment(tmp, ask=ask_tools)
        write_manifest(tmp, external)
        sd.path.parent.mkdir(parents=True, exist_ok=True)
        if sd.path.exists():
            sd.path.rmdir()
        os.replace(tmp, sd.path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sd


def base_job(base_spec: Path, profile_path: str | None) -> JobSpec:
    from ..submit.config import resolve

    return resolve(str(base_spec), profile_path, cwd=base_spec.parent).job


def _plan_points(sd: StudyDir, study: Study, base_spec: Path, profile_path: str | None,
                 source: str, against_slurm: bool = False) -> None:
    """Expand, resolve and render every point; all problems reported together, exit 2
    (a real run also asks Slurm what its partitions can give; a dry run asks nothing)."""
    import yaml

    base = base_job(base_spec, profile_path)
    if base.after:
        raise ConfigError(source, "base", f"{study.base} has `after`: a study's jobs wait "
                                          "through the study's own `after` (a point's bundled "
                                          "job keeps no job ids)")
    if base.train.script and study.limit:
        study = dataclasses.replace(study, limit=False)   # the script does its own allreduce
    points = expand(study, base)
    problems = []
    for point in points:
        try:
            job, request = point_request(sd, study, base_spec, base, point, profile_path,
                                          from_bundle=False, against_slurm=against_slurm)
        except UserError as e:
            axes = ", ".join(f"{k}={v}" for k, v in point.axes.items())
            problems.append(f"{source}: axes: point {point.id} ({axes}): {e}")
            continue
        sd.point_spec(point).parent.mkdir(parents=True, exist_ok=True)
        bundled = dataclasses.replace(job, after=[])      # job ids belong to this cluster, now
        sd.point_spec(point).write_text(yaml.safe_dump(bundled.to_dict(), sort_keys=False))
        sd.point_script(point).write_text(request.script)
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise UserError(f"{len(problems)} of {len(points)} points break the site's rules or the "
                        "job schema; nothing was submitted:\n  " + "\n  ".join(shown))
    from ..runs.results import write_json_atomic

    write_json_atomic(sd.path / POINTS_FILE, {"mode": study.mode,
                                              "points": [p.to_json() for p in points]})


def rerun(bundle: Path, directory: Path | None) -> StudyDir:
    """A fresh study directory holding the bundle's inputs, points and study spec (not its
    results), ready for :func:`run`."""
    src = StudyDir(bundle)
    verify_bundle(bundle)
    study = src.study()
    dest = directory or bundle.parent / f"{bundle.name}-rerun-{dt.datetime.now():%Y%m%d-%H%M%S}"
    if dest.exists() and any(dest.iterdir()):
        raise UserError(f"{dest}: exists and is not empty; give another --dir")
    tmp = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name in (STUDY_FILE, BUNDLE_FILE, POINTS_FILE):
            shutil.copy2(bundle / name, tmp / name)
        # Not the run registry of the first run's submissions (inputs/.hpcsuite/).
        shutil.copytree(bundle / "inputs", tmp / "inputs", symlinks=True,
                        ignore=shutil.ignore_patterns(".hpcsuite"))
        shutil.copytree(bundle / "points", tmp / "points", symlinks=True)
        write_environment(tmp)
        meta = json.loads((tmp / BUNDLE_FILE).read_text())
        meta["rerun_of"] = {"path": str(bundle.resolve()), "study": study.name}
        (tmp / BUNDLE_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        write_manifest(tmp, meta.get("external", {}))
        if dest.exists():
            dest.rmdir()
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return StudyDir(dest)


def open_study(path: str) -> StudyDir:
    """A study directory, given as the directory or as its study spec (then the directory
    the spec names)."""
    p = Path(path)
    if p.is_dir():
        sd = StudyDir(p)
        sd.points()                        # refuses what is not a study directory
        return sd
    study = load_study(path)
    sd = StudyDir(p.resolve().parent / study.output_dir / study.name)
    if not (sd.path / POINTS_FILE).is_file():
        raise UserError(f"{path}: the study has not been run yet (no {sd.path}); "
                        "`hpcsuite study run` makes it")
    return sd

