"""The import directions docs/ARCHITECTURE.md promises, read from every module's AST (imports
inside functions included: a lazy import is still a dependency)."""

import ast

import pytest

from conftest import REPO

PACKAGE = REPO / "hpcsuite"
ROOMS = ("cli", "runner", "submit", "runs", "study", "sweep", "site", "runtime", "remote")
# the shared core, at the top
LEAVES = ("errors", "records", "shell", "slurm", "usercode", "alphabeta", "allreduce_sizes",
          "fabrics", "gpuhealth", "world", "mpis")
FRAMEWORKS = ("torch", "tensorflow", "horovod", "keras")

# What each room may import besides itself and the core leaves.
ALLOWED = {
    "cli": set(ROOMS) | {"api"},
    "runner": {"submit", "runs", "runtime.rank.job_io"},
    "study": {"runner", "submit", "runs", "site"},
    "sweep": {"runner", "submit", "runs"},
    # what a spec names (submit.schema reads it), remotes.yaml's place (submit.config), the
    # copy's registry line and run-directory names (runs)
    "remote": {"submit.schema", "submit.config", "runs"},
    "site": {"submit.site_profile", "submit.slurm_rules"},
    "submit": {"runs.rundir", "templates"},
    "runs": set(),
    # submit.config: script mode tried by hand resolves its spec as `hpcsuite submit` would
    "runtime": {"submit.spec", "submit.values", "submit.config", "runs.rundir", "runs.results", "runs.attempts",
                "runs.stragglers", "runs.checkpoint_dir", "runs.script_ranks", "runs.world_change",
                "runs.mlflow_store", "runs.mlflow_run", "runs.monitor_failures", "models"},
}

# runtime/'s rooms (docs/ARCHITECTURE.md, "runtime/ inside"), each importing only those listed:
# the input pipeline and telemetry import nothing of the session or the frameworks, the
# frameworks nothing of the session. runtime/train.py and runtime/hold_term.py, the entry
# points at runtime/'s top, may import any room; no room imports them.
RUNTIME_ROOMS = {
    "rank": set(),
    "input": {"rank"},
    "observe": {"rank"},
    "frameworks": {"rank", "input"},
    "session": {"rank", "input", "observe", "frameworks"},
    "script": {"rank", "input", "observe", "frameworks", "session"},
    "checks": {"rank", "input", "observe", "frameworks"},
}
RUNTIME_TOP = {"__init__", "train", "hold_term"}


def module_name(path):
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path, top_level_only=False):
    """Absolute names (without the leading ``hpcsuite.``) of what the module imports, or every
    imported top-level name for third-party checks."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target in ("hpcsuite",) + tuple(f"hpcsuite.{r}" for r in ROOMS):
                yield from (f"{target}.{a.name}" for a in node.names)
            else:
                yield target


def room_of(dotted):
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else None


def modules():
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_imports_only_what_it_may(room):
    offences = []
    for path in modules():
        if room_of(module_name(path)) != room:
            continue
        for target in imports(path):
            if not target.startswith("hpcsuite.") or target == "hpcsuite.__version__":
                continue
            short = target.split(".", 1)[1]
            if room_of(target) == room or short.split(".")[0] in LEAVES:
                continue
            if not any(short == a or short.startswith(a + ".") for a in ALLOWED[room]):
                offences.append(f"{path.relative_to(REPO)} imports {target}")
    assert not offences, "imports against docs/ARCHITECTURE.md:\n  " + "\n  ".join(offences)


def test_nothing_outside_cli_imports_cli():
    offences = [f"{p.relative_to(REPO)} imports {t}" for p in modules()
                if room_of(module_name(p)) != "cli" and module_name(p) != "hpcsuite.__main__"
                for t in imports(p) if room_of(t) == "cli"]
    assert not offences, offences


def test_the_core_leaves_import_only_each_other():
    for leaf in LEAVES:
        for target in imports(PACKAGE / f"{leaf}.py"):
            if target.startswith("hpcsuite."):
                assert target.split(".")[1] in LEAVES, f"hpcsuite/{leaf}.py imports {target}"


def test_api_is_a_public_face_over_the_runtime():
    """Script mode's code is the runtime's (runtime/script/script_run.py and its neighbours):
    hpcsuite/api.py re-exports it for ``from hpcsuite.api import Run``, and nothing in the
    package imports api (runtime/script/script.py once did: the one import that ran back up)."""
    ours = [t for t in imports(PACKAGE / "api.py") if t.startswith("hpcsuite.")]
    assert ours and all(t.startswith("hpcsuite.runtime.") for t in ours), ours
    offences = [f"{p.relative_to(REPO)} imports {t}" for p in modules() if p.name != "api.py"
                or p.parent != PACKAGE for t in imports(p)
                if t == "hpcsuite.api" or t.startswith("hpcsuite.api.")]
    assert not offences, offences


def test_login_node_code_imports_no_framework_at_module_level():
    """torch, TensorFlow and Horovod load only inside functions of the compute-node path."""
    offences = []
    for path in modules():
        room = room_of(module_name(path))
        if room == "runtime" or path.name == "api.py":
            continue
        offences += [f"{path.relative_to(REPO)} imports {t}" for t in imports(path, top_level_only=True)
                     if t.split(".")[0] in FRAMEWORKS]
    assert not offences, offences


def test_the_rooms_are_packages_and_the_top_holds_only_the_core():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    # results: the README's `hpcsuite.results.Results`, re-exported from runs.results
    assert top == set(LEAVES) | {"__init__", "__main__", "api", "results"}, sorted(top)
    assert all((PACKAGE / r / "__init__.py").is_file() for r in ROOMS)


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 60


def test_no_module_over_450_lines_and_no_function_over_60():
    """Issue R's sizes: a module reads in one sitting, a function on one screen."""
    long_modules, long_functions = [], []
    for path in modules():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{path.relative_to(REPO)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: "
                                          f"{size} lines")
    assert not long_modules and not long_functions, long_modules + long_functions


# ---------------------------------------------------------------------- one way to Slurm

def imported_names(path):
    """(absolute module, name) for every name the module imports (imports inside functions
    included); ``import a.b`` is (``a.b``, None)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            yield from ((target, a.name) for a in node.names)


JOBS = PACKAGE / "runs" / "jobs.py"


def slurm_asking_functions():
    """The functions of runs/jobs.py that ask Slurm: those that use the ``slurm`` module, and
    those that call one that does."""
    functions = {n.name: n for n in ast.parse(JOBS.read_text()).body
                 if isinstance(n, ast.FunctionDef)}
    calls = {name: {c.func.id for c in ast.walk(f) if isinstance(c, ast.Call)
                    and isinstance(c.func, ast.Name)} for name, f in functions.items()}
    asking = {name for name, f in functions.items()
              if any(isinstance(n, ast.Name) and n.id == "slurm" for n in ast.walk(f))}
    while True:
        more = {name for name in functions if calls[name] & asking} - asking
        if not more:
            return asking
        asking |= more


def in_runner(path):
    return room_of(module_name(path)) == "runner" or path == JOBS


def test_only_the_runner_asks_runs_jobs_of_slurm():
    """Submitting, following, querying and cancelling a job go through hpcsuite/runner (issue
    38): outside it nothing takes runs/jobs.py's module, nor a function of it that asks Slurm
    (its constants, types and pure parsers are free to use)."""
    asking = slurm_asking_functions()
    assert {"query", "query_many", "wait", "cancel"} <= asking, asking
    offences = [f"{p.relative_to(REPO)} imports {module}.{name}" for p in modules()
                if not in_runner(p) for module, name in imported_names(p)
                if (module, name) in (("hpcsuite.runs", "jobs"), ("hpcsuite.runs.jobs", None))
                or module == "hpcsuite.runs.jobs" and name in asking]
    assert not offences, offences


# Slurm's job clients, and the modules besides the runner that may run them: the batch
# script's `attempt begin/end` (runs/attempts.py: earlier attempts' states; runs/ownership.py:
# whether a checkpoint directory's owner still runs, on the compute node), the ranks' time-limit watch (runtime/), and the local cluster's teardown (site/
# daemons.py: `cluster down` ends the jobs its own daemons still hold, as their admin).
JOB_CLIENTS = ("sbatch", "scancel", "squeue", "sacct")
CLIENTS_ELSEWHERE = {"hpcsuite.runs.attempts", "hpcsuite.runs.ownership",
                     "hpcsuite.runtime.session.timelimit", "hpcsuite.site.daemons"}


def test_slurms_job_clients_run_only_in_the_runner():
    offences = []
    for path in modules():
        if in_runner(path) or module_name(path) in CLIENTS_ELSEWHERE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "call" and node.args
                    and isinstance(node.args[0], ast.List) and node.args[0].elts
                    and isinstance(node.args[0].elts[0], ast.Constant)
                    and node.args[0].elts[0].value in JOB_CLIENTS):
                offences.append(f"{path.relative_to(REPO)}:{node.lineno} runs "
                                f"{node.args[0].elts[0].value}")
    assert not offences, offences


def test_commands_reach_slurm_only_through_the_runner():
    """cli imports no Slurm effect but the runner's: not hpcsuite.slurm, runs/jobs.py,
    submit/plan.py's acting or lint's questions to Slurm."""
    offences = [f"{p.relative_to(REPO)} imports {module}" + (f".{name}" if name else "")
                for p in modules() if room_of(module_name(p)) == "cli"
                for module, name in imported_names(p)
                if module in ("hpcsuite.slurm", "hpcsuite.runs.jobs")
                or (module, name) in (("hpcsuite", "slurm"), ("hpcsuite.runs", "jobs"),
                                      ("hpcsuite.submit.lint", "slurm_findings"))]
    assert not offences, offences


def test_planning_is_pure():
    """submit/plan.py plans; the runner acts (sbatch, the run directory, the registry)."""
    path = PACKAGE / "submit" / "plan.py"
    names = {module for module, _ in imported_names(path)} | {
        f"{module}.{name}" for module, name in imported_names(path)}
    assert not names & {"subprocess", "hpcsuite.slurm", "hpcsuite.runs.registry",
                        "hpcsuite.runs.attempts", "hpcsuite.runs.jobs"}, names
    defined = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
    assert not defined & {"sbatch", "submit"}, defined


def runtime_room_of(dotted):
    parts = dotted.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["hpcsuite", "runtime"] else None


@pytest.mark.parametrize("room", sorted(RUNTIME_ROOMS))
def test_each_runtime_room_imports_only_the_rooms_below_it(room):
    offences = []
    for path in sorted((PACKAGE / "runtime" / room).glob("*.py")):
        for target in imports(path):
            other = runtime_room_of(target)
            if other is None or other == room:
                continue
            if other not in RUNTIME_ROOMS or other not in RUNTIME_ROOMS[room]:
                offences.append(f"{path.relative_to(REPO)} imports {target}")
    assert not offences, "imports against docs/ARCHITECTURE.md:\n  " + "\n  ".join(offences)


def test_runtime_is_its_rooms_and_its_entry_points():
    """Every runtime module sits in a room with a one-line purpose, except the entry points."""
    root = PACKAGE / "runtime"
    assert {p.stem for p in root.glob("*.py")} == RUNTIME_TOP
    rooms = {p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(RUNTIME_ROOMS)
    for room in rooms:
        doc = ast.get_docstring(ast.parse((root / room / "__init__.py").read_text()))
        assert doc and "\n" not in doc.strip(), f"runtime/{room}/__init__.py: one line saying what it holds"
