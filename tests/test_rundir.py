"""The run directory has one owner (hpcsuite.runs.rundir): its layout, the names the batch shell gets
from it, and a check that no other module or template spells a run-directory file name."""

import ast
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hpcsuite.runs import rundir
from hpcsuite.submit.plan import plan
from hpcsuite.submit.site_profile import SiteProfile
from hpcsuite.runs.rundir import RunDir, RunRoot
from hpcsuite.submit.spec import spec_from_dict
from hpcsuite.submit.templating import SearchPath

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------- the layout
def test_paths_of_one_run(tmp_path):
    run = RunDir(tmp_path / "runs" / "mlp" / "42")
    p = run.path
    assert (run.job, run.profile, run.script, run.submit, run.attempts) == (
        p / "job.json", p / "profile.json", p / "job.sbatch", p / "submit.json", p / "attempts.jsonl")
    assert (run.progress, run.results, run.preempted) == (
        p / "progress.json", p / "results.json", p / "PREEMPTED")
    assert run.ready_mark(2, 3) == p / "ready" / "attempt-2" / "rank-3"
    assert run.stop_requested(1) == p / "STOP-REQUESTED-attempt-1"
    assert run.failed("0") == p / "FAILED-attempt-0"
    assert run.startup_word(1, 3) == p / "startup" / "attempt-1" / "rank-3.json"
    assert run.attempt_results(4) == p / "results-attempt-4.json"
    assert run.rank_record(5) == p / "rank-5.json"
    assert run.rank_log(5) == p / "logs" / "rank-5.log" and run.rank_log(5).parent == run.logs
    assert run.ledger(1, 2) == p / "ledger" / "rank-1-attempt-2.txt"
    assert run.timeline_window(10, 15) == p / "horovod-timeline-steps-10-15.json"
    assert (run.allreduce, run.allreduce_csv) == (p / "allreduce.json", p / "allreduce.csv")
    assert run.tensorboard == p / "tensorboard"
    assert run.tensorboard_events(1.5e9, "node1", 42) == \
        p / "tensorboard" / "events.out.tfevents.1500000000.node1.42"
    assert run.slurm_log("42") == tmp_path / "runs" / "mlp" / "slurm-42.out"
    assert run.root == RunRoot(tmp_path / "runs" / "mlp")
    assert run.default_checkpoints == tmp_path / "runs" / "mlp" / "checkpoints"


def test_run_root(tmp_path):
    root = RunRoot.of(tmp_path / "runs", "mlp")
    assert root.path == tmp_path / "runs" / "mlp"
    assert root.run("7") == RunDir(root.path / "7")
    assert root.local("20240101-000000").path == root.path / "local" / "20240101-000000"
    assert root.checkpoints == root.path / "checkpoints"
    assert root.slurm_log("7") == root.path / "slurm-7.out"
    assert root.staged_script("S").parent == root.path and root.staged_script("S").name.endswith(".sbatch")
    # the batch script spells the root relative to the submit directory, as the spec gave it
    assert rundir.run_root("runs/", "mlp") == "runs/mlp"
    assert rundir.slurm_log_pattern("runs/mlp") == "runs/mlp/slurm-%j.out"


def test_a_str_path_becomes_a_path():
    assert RunDir("runs/mlp/1").path == Path("runs/mlp/1")
    assert RunRoot("runs/mlp").path == Path("runs/mlp")


def test_listings_read_back_what_the_names_write(tmp_path):
    run = RunDir(tmp_path)
    for n in (10, 2, 0):
        run.attempt_results(n).write_text("{}")
    (tmp_path / "results-attempt-x.json").write_text("{}")
    (tmp_path / "results-attempt-1.json.tmp").write_text("{}")
    assert run.attempt_results_files() == {0: run.attempt_results(0), 2: run.attempt_results(2),
                                           10: run.attempt_results(10)}

    run.ledger_dir.mkdir()
    for rank, attempt in ((1, 0), (0, 1), (0, 0)):
        run.ledger(rank, attempt).write_text("")
    assert run.ledger_files() == {run.ledger(0, 0): 0, run.ledger(0, 1): 1, run.ledger(1, 0): 0}
    assert list(run.ledger_files()) == sorted(run.ledger_files())

    for first, last in ((30, 35), (5, 10)):
        run.timeline_window(first, last).write_text("[]")
    (tmp_path / "horovod-timeline-steps-a-b.json").write_text("[]")
    assert run.timeline_windows() == [run.timeline_window(5, 10), run.timeline_window(30, 35)]

    assert run.tensorboard_files() == []
    run.tensorboard.mkdir()
    for seconds in (1_800_000_000, 999_999_999):       # the time orders the attempts' files
        run.tensorboard_events(seconds, "node1", 7).write_bytes(b"")
    (run.tensorboard / "notes.txt").write_text("")
    assert run.tensorboard_files() == [run.tensorboard_events(999_999_999, "node1", 7),
                                       run.tensorboard_events(1_800_000_000, "node1", 7)]
    assert rundir.timeline_window_steps(run.timeline_window(5, 10).name) == (5, 10)
    assert rundir.timeline_window_steps("horovod-timeline.json") is None

    run.failed(1).write_text("")
    run.failed(0).write_text("")
    assert run.failed_markers() == [run.failed(0), run.failed(1)]
    assert all(RunDir.is_outcome(p.name) for p in [run.results, *run.failed_markers()])
    assert not RunDir.is_outcome(run.progress.name)


# ---------------------------------------------------------------------- the batch shell's names
def test_the_shell_builds_the_names_python_reads(tmp_path):
    """The template's names, expanded by bash in attempt 3, are the paths RunDir gives."""
    names = RunDir.template_names()
    run = RunDir(tmp_path / "7")
    words = [rundir.in_shell(names[k]) for k in ("job", "attempts", "ready", "stop_requested")]
    done = subprocess.run(["bash", "-c", "printf '%s\\n' " + " ".join(words)], check=True,
                          capture_output=True, text=True,
                          env={"RUN_DIR": str(run.path), "SLURM_RESTART_COUNT": "3", "PATH": "/usr/bin:/bin"})
    assert done.stdout.splitlines() == [str(run.job), str(run.attempts), str(run.ready(3)),
                                        str(run.stop_requested(3))]
    # attempt 0 when Slurm has not requeued (no SLURM_RESTART_COUNT)
    done = subprocess.run(["bash", "-c", "printf '%s\\n' " + words[3]], check=True,
                          capture_output=True, text=True, env={"RUN_DIR": str(run.path)})
    assert done.stdout.strip() == str(run.stop_requested(0))


def test_the_names_need_no_quoting_in_the_shell():
    """They reach the script unquoted (inside the template's double quotes)."""
    for key, name in RunDir.template_names().items():
        literal = name.replace(rundir.SHELL_ATTEMPT, "").replace(rundir.SHELL_PID, "")
        assert shlex.quote(literal) == literal, key


def test_the_rendered_script_writes_where_rundir_says(tmp_path):
    job = spec_from_dict({"name": "mlp", "train": {"checkpoint": {"every_steps": 10}}}, "test")
    script = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    names = RunDir.template_names()
    assert f'> "$RUN_DIR/{names["stop_requested"]}"' in script
    assert f'"$RUN_DIR/{names["ready"]}"' in script
    assert f"--job {rundir.in_shell(rundir.JOB)}" in script
    head = script.split("\nHPCSUITE_PY=")[0]
    (tmp_path / "job.sh").write_text(head + f'\nprintf "%s" "${rundir.ENV}" > env.txt\n')
    subprocess.run(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, check=True,
                   env={"SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"})
    run = RunRoot.of(tmp_path / job.output_dir, job.name).run("7")
    assert json.loads(run.job.read_text())["name"] == "mlp"
    assert (tmp_path / "env.txt").read_text() == str(run.path)
    assert sorted(p.name for p in run.path.iterdir()) == [rundir.JOB]   # the staged copy renamed in
    # A requeued attempt runs it again over the same run directory: replaced whole.
    run.job.write_text("{}")
    subprocess.run(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, check=True,
                   env={"SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"})
    assert json.loads(run.job.read_text())["name"] == "mlp"
    assert sorted(p.name for p in run.path.iterdir()) == [rundir.JOB]


# ---------------------------------------------------------------------- nobody else spells them
# A name is spelled when a string literal is (or holds, as a path) a run-directory file name.
# Docstrings and comments are prose and are not looked at; a literal with spaces (a message,
# a help text) counts only where it builds a path ("{run_dir}/results.json", "$RUN_DIR/...").
_FILES = (r"job\.json|results\.json|progress\.json|attempts\.jsonl|submit\.json|profile\.json|"
          r"job\.sbatch|allreduce\.json|allreduce\.csv|horovod-timeline\.json|horovod-autotune\.csv")
# (not the plots' names: a study's report draws its own throughput.png)
NAME = re.compile(
    rf"(?:^|/|\"|')(?:{_FILES})(?:$|[\"'/])"
    r"|STOP-REQUESTED|FAILED-attempt|results-attempt-|horovod-timeline-steps-|events\.out\.tfevents"
    r"|(?:^|/)rank-(?:\{\}|\*|\d)"                  # rank-{rank}.json, logs/rank-*.log
    r"|(?:^|/)attempt-(?:\{\}|\*|\d|\$)"            # ready/attempt-{n}
    r"|-attempt-\{\}"                               # {FAILED}-attempt-{n}
    r"|(?:^|/)(?:ready|logs|ledger|tensorboard)/"
    r"|slurm-(?:%j|\{\}|\*|\d+)\.out"
    r"|\$\{?RUN_DIR\}?/(?!\{\{)")                  # a template's "$RUN_DIR/name"
# One-word names that are also ordinary words (PREEMPTED is a Slurm state): spelled only where
# they are a path part (``x / "logs"``, ``x.glob("FAILED-*")``, ``name.startswith("FAILED")``)
# or a module's or class's constant of their own (``MARKER = "PREEMPTED"``).
SHORT = {rundir.PREEMPTED, rundir.READY, rundir.FAILED, rundir.LOGS, rundir.LEDGER,
         rundir.STOP_REQUESTED, rundir.CHECKPOINTS, rundir.LOCAL, rundir.TENSORBOARD}
_PATH_CALLS = {"glob", "rglob", "joinpath", "with_name", "startswith", "endswith", "Path"}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _text(node: ast.AST) -> str | None:
    """A string literal's text, an f-string's with ``{}`` for each replacement field."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _spells(text: str) -> bool:
    if not any(c.isspace() for c in text):
        return bool(NAME.search(text))
    # prose: only words that build a path from a value or the shell's run directory
    return any(NAME.search(w) for w in text.split() if "{}/" in w or "RUN_DIR" in w)


def spelled_in_python(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    skip = _docstrings(tree)
    parts = set()              # f-string parts: judged as their whole f-string
    short = set()              # literals used as a path part
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef)):
            short.update(id(s.value) for s in node.body if isinstance(s, (ast.Assign, ast.AnnAssign)))
        if isinstance(node, ast.JoinedStr):
            parts.update(id(v) for v in node.values)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            short.update(id(n) for n in (node.left, node.right))
        elif isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else \
                getattr(node.func, "id", None)
            if called in _PATH_CALLS:
                short.update(id(a) for a in node.args)
    found = []
    for node in ast.walk(tree):
        text = _text(node)
        if text is None or id(node) in skip or id(node) in parts:
            continue
        head = re.split(r"[-/*.{]", text, maxsplit=1)[0]
        if _spells(text) or (id(node) in short and head in SHORT):
            found.append((node.lineno, text))
    return sorted(found)


def spelled_in_template(text: str) -> list[tuple[int, str]]:
    text = re.sub(r"\{#.*?#\}", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.strip()
        if code.startswith("#") and not code.startswith(("#!", "#SBATCH")):
            continue       # a comment in the rendered script: prose
        if any(NAME.search(w) for w in code.split()):
            found.append((number, code))
    return found


@pytest.mark.parametrize("source, expected", [
    ('"""Writes results.json and rank-N.json."""\n# and job.json\nx = 1\n', []),
    ('def f():\n    """logs/rank-N.log, PREEMPTED"""\n', []),
    ('path = run_dir / "results.json"\n', [1]),
    ('path = run_dir / "PREEMPTED"\n', [1]),
    ('TERMINAL = {"PREEMPTED", "FAILED"}\nif state == "PREEMPTED": pass\n', []),
    ('MARKER = "PREEMPTED"\n', [1]),
    ('def f():\n    state = "PREEMPTED"\n', []),
    ('p = d / "logs" / f"rank-{rank}.log"\n', [1, 1]),
    ('ok = p.name.startswith("FAILED")\n', [1]),
    ('x = f"{d}/slurm-{job_id}.out"\n', [1]),
    ('x = f"{root}/slurm-%j.out"\n', [1]),
    ('x = Raw(\'"$RUN_DIR/job.json"\')\n', [1]),
    ('x = f"{sd.path / \'points\' / p.id / \'job.sbatch\'}"\n', [1]),
    ('raise E(f"job {job_id} completed; no results.json in {run_dir}")\n', []),
    ('help = "Only rank N\'s log (run directory logs/rank-N.log) instead"\n', []),
    ('msg = f"wrote {run_dir}/results.json"\n', [1]),
    ('prom = f"hpcsuite-{job_id}-rank-{rank}.prom"\n', []),
    ('g = p.glob("results-attempt-*.json")\n', [1]),
    ('d = run_dir / "tensorboard"\n', [1]),
    ('f = d.glob("events.out.tfevents.*")\n', [1]),
    ('from tensorboard.compat.proto import event_pb2\nhelp = "TensorBoard event files"\n', []),
])
def test_the_check_finds_literals_not_prose(source, expected):
    assert [line for line, _ in spelled_in_python(source)] == expected


def test_the_template_check_skips_comments():
    text = ('{# writes job.json #}\n# recorded in $RUN_DIR/attempts.jsonl\n'
            'cat > "$RUN_DIR/{{ rundir.job }}"\ncat > "$RUN_DIR/job.json"\n')
    assert spelled_in_template(text) == [(4, 'cat > "$RUN_DIR/job.json"')]


def test_no_module_or_template_spells_a_run_directory_name():
    """Issue R: run-directory names come from hpcsuite.runs.rundir (the template: its ``rundir``)."""
    offences = []
    for path in sorted((REPO / "hpcsuite").rglob("*.py")):
        if path == REPO / "hpcsuite" / "runs" / "rundir.py":
            continue
        offences += [f"{path.relative_to(REPO)}:{n}: {t!r}" for n, t in spelled_in_python(path.read_text())]
    for path in sorted((REPO / "templates").rglob("*.j2")):
        offences += [f"{path.relative_to(REPO)}:{n}: {t}" for n, t in spelled_in_template(path.read_text())]
    assert not offences, ("run-directory names spelled outside hpcsuite/runs/rundir.py (take them from "
                          "rundir.RunDir, or in a template from its `rundir` context):\n  "
                          + "\n  ".join(offences))
