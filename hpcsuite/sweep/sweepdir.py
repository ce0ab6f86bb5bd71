"""The sweep directory, the one owner of its paths::

    SWEEP_DIR/
        sweep.yaml                 the sweep file as given
        elements.json              the sweep: base spec, work directory, job name, metric, and
                                   each element's index, axis values and --set lines
        elements/I/job.json        element I's resolved job; the batch script copies it into
                                   the element's run directory (OUTPUT_DIR/NAME/ARRAYID_I)
        submissions.jsonl          one line per sbatch: array job id, indices, script, time
        scripts/ARRAYID.sbatch     each submission's script, exactly as submitted
        report/                    `hpcsuite sweep report`: sweep.csv, sweep.json, sweep.png

An element's current job is the newest submission holding its index (a resubmitted element
has a one-element array of its own); its run directory is named as Slurm names the element.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
from pathlib import Path

from ..errors import UserError
from ..runs.rundir import CHECKPOINTS, JOB, RunRoot, element_id
from .spec import Element

SWEEP_FILE = "sweep.yaml"
ELEMENTS_FILE = "elements.json"
SUBMISSIONS_FILE = "submissions.jsonl"
REPORT_DIR = "report"
REPORT_CSV, REPORT_JSON, REPORT_PNG = "sweep.csv", "sweep.json", "sweep.png"


class SweepDir:
    def __init__(self, path: str | Path):
        self.path = Path(path).absolute()

    # ------------------------------------------------------------------ paths
    @property
    def sweep_file(self) -> Path:
        return self.path / SWEEP_FILE

    @property
    def elements_file(self) -> Path:
        return self.path / ELEMENTS_FILE

    @property
    def elements_dir(self) -> Path:
        return self.path / "elements"

    def element_job(self, index: int) -> Path:
        return self.elements_dir / str(index) / JOB   # the name the element's run dir gives it

    @property
    def submissions_file(self) -> Path:
        return self.path / SUBMISSIONS_FILE

    def script(self, array_job_id: str) -> Path:
        return self.path / "scripts" / f"{array_job_id}.sbatch"

    def staged_script(self) -> Path:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        return self.path / "scripts" / f".submit-{stamp}.sbatch"

    def checkpoints(self, index: int) -> Path:
        """Element ``index``'s checkpoints, when its job saves them and names no directory."""
        return self.path / CHECKPOINTS / str(index)

    @property
    def report_dir(self) -> Path:
        return self.path / REPORT_DIR

    # ------------------------------------------------------------------ what it holds
    def definition(self) -> dict:
        """elements.json: what the sweep is (written once, by `sweep run`)."""
        if not self.elements_file.is_file():
            raise UserError(f"{self.path}: not a sweep directory (no {ELEMENTS_FILE}); "
                            "`hpcsuite sweep run SWEEP.yaml` makes one")
        data = _read_json(self.elements_file)
        if not isinstance(data, dict) or not isinstance(data.get("elements"), list) \
                or not all(_element_ok(e) for e in data["elements"]):
            raise UserError(f"{self.elements_file}: not a sweep's elements (damaged?)")
        return data

    def elements(self) -> list[Element]:
        return [Element(**e) for e in self.definition()["elements"]]

    def submissions(self) -> list[dict]:
        """Every sbatch of this sweep, oldest first."""
        try:
            raw = self.submissions_file.read_text()
        except FileNotFoundError:
            return []
        out = []
        for number, line in enumerate(raw.splitlines(), 1):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                entry = None
            if not isinstance(entry, dict) or not isinstance(entry.get("array_job_id"), str) \
                    or not isinstance(entry.get("indices"), list):
                raise UserError(f"{self.submissions_file}:{number}: not a submission record "
                                "(damaged?); remove that line to go on")
            out.append(entry)
        return out

    def record_submission(self, entry: dict) -> None:
        """Append one submission under a lock (a resubmit beside another never loses a line)."""
        line = json.dumps(entry, sort_keys=True, ensure_ascii=True) + "\n"
        fd = os.open(self.submissions_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def current_jobs(self) -> dict[int, tuple[str, int]]:
        """Element index -> (its newest element id ARRAYID_I, how many times submitted)."""
        out: dict[int, tuple[str, int]] = {}
        for sub in self.submissions():
            for index in sub["indices"]:
                count = out.get(index, ("", 0))[1]
                out[index] = (element_id(sub["array_job_id"], index), count + 1)
        return out

    def run_dir(self, element_job_id: str) -> Path:
        """The run directory of an element's job (``ARRAYID_I``)."""
        d = self.definition()
        return RunRoot(Path(d["workdir"]) / d["run_root"]).run(element_job_id).path


def _element_ok(e: object) -> bool:
    return isinstance(e, dict) and type(e.get("index")) is int and \
        isinstance(e.get("values"), dict) and isinstance(e.get("sets"), list)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None


def open_sweep(target: str) -> SweepDir:
    """A sweep directory, given as the directory or as its sweep file (then the directory the
    file names)."""
    p = Path(target)
    if p.is_dir():
        sd = SweepDir(p)
        sd.definition()                  # refuses what is not a sweep directory
        return sd
    from .spec import load_sweep

    sweep = load_sweep(target)
    sd = SweepDir(p.resolve().parent / sweep.output_dir / sweep.name)
    if not sd.elements_file.is_file():
        raise UserError(f"{target}: the sweep has not been run yet (no {sd.path}); "
                        "`hpcsuite sweep run` makes it")
    return sd
