"""What hpcsuite says of a user's script (issue 42 points 5, 6, 7, 11 and the Keras 3 hint),
without Slurm: a script that does not compile is refused at lint and submit with file:line;
a rank's failure marker names the exception's type and message, the node and the user's
file:line, and `submit --wait`'s headline shows them with the traceback's last frames; each
rank's word on its script (hpcsuite.api or not, the Horovod world it saw) becomes the lines
`status`, `submit --wait` and `report` say. On the cluster: tests/test_e2e_script_words.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.runs import script_ranks
from hpcsuite.runs.rundir import RunDir, failure_text


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    return tmp_path


# ------------------------------------------------------------------- point 6: compile, not import
@pytest.mark.parametrize("source, said", [
    ("import os\n\ndef main(:\n    pass\n", "train.py:3: SyntaxError: "),
    ("def main():\nreturn 1\n", "train.py:2: IndentationError: expected an indented block"),
    ("x = 1\nreturn x\n", "train.py:2: SyntaxError: 'return' outside function"),   # the compiler's
])
def test_lint_and_submit_refuse_a_script_that_does_not_compile_naming_file_and_line(here, source, said):
    ran = here / "ran"
    (here / "train.py").write_text(source + f"open({str(ran)!r}, 'w').close()\n")
    (here / "job.yaml").write_text("name: s\ntrain: {script: train.py}\n")
    for command in (["lint", "job.yaml"], ["submit", "job.yaml"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2, result.output
        errors = [l for l in result.output.splitlines() if l.startswith("error: ")]
        assert len(errors) == 1 and errors[0].startswith(f"error: job.yaml: train.script: {said}"), \
            result.output
        assert "Traceback" not in result.output
    assert not ran.exists() and not (here / "runs").exists()   # read, never run; nothing submitted


def test_a_script_that_compiles_passes_lint_and_its_warnings_stay_out(here):
    (here / "train.py").write_text("import horovod.torch as hvd\npath = '\\d'\n")  # an invalid escape
    (here / "job.yaml").write_text("name: s\ntrain: {script: train.py}\n")
    result = CliRunner().invoke(main, ["lint", "job.yaml"])
    assert result.exit_code == 0 and "SyntaxWarning" not in result.output, result.output


# ------------------------------------------------------------------- point 11: the marker and the headline
def _rank(job: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_"))}
    env.update(HPCSUITE_RUN_DIR=str(job.parent), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "hpcsuite", "train", "--job", str(job)],
                          cwd=job.parent, env=env, capture_output=True, text=True, timeout=120)


def _script_job(run_dir: Path, script: str, name: str = "train.py") -> Path:
    from rank_by_hand import write_job

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / name).write_text(script)
    return write_job(run_dir, {"name": "s", "output_dir": str(run_dir.parent),
                               "train": {"script": name, "startup_timeout_seconds": 0}})


RAISES = '''import json


def fetch(url):
    raise RuntimeError(f"could not read {url}:\\n<urlopen error [Errno 111] Connection refused>")


def main():
    fetch("http://127.0.0.1:9/data")


main()
'''


def test_a_failing_script_leaves_type_message_node_and_its_line_in_the_marker(tmp_path):
    from hpcsuite.runner.status import reported_error
    from hpcsuite.runtime.rank.job_io import hostname

    job = _script_job(tmp_path / "run", RAISES)
    done = _rank(job)
    assert done.returncode == 1, done.stderr
    said = reported_error(job.parent)
    assert said["rank"] == 0 and said["node"] == hostname()
    assert said["message"] == ("RuntimeError: could not read http://127.0.0.1:9/data: "
                               "<urlopen error [Errno 111] Connection refused>")
    assert said["at"] == "train.py:5 in fetch"
    frames = said["frames"].splitlines()
    assert frames[0] == "Traceback (most recent call last):"
    assert frames[-2:] == ["RuntimeError: could not read http://127.0.0.1:9/data:",
                           "<urlopen error [Errno 111] Connection refused>"]
    assert 'train.py", line 5, in fetch' in said["frames"] and "hpcsuite/" not in said["frames"]
    # The log has the whole report once, every line whole.
    assert done.stderr.count("Traceback (most recent call last)") == 1
    assert f"hpcsuite train: rank 0 on {hostname()} failed:\n" in done.stderr


def test_the_headline_gives_rank_node_message_line_and_the_last_frames_not_the_log(tmp_path):
    from hpcsuite.runner.wait import FAILED, Outcome
    from hpcsuite.runs.jobs import JobState

    run = tmp_path / "run"
    run.mkdir()
    tb = "\n".join(["Traceback (most recent call last):",
                    *[f'  File "train.py", line {n}, in f{n}\n    f{n + 1}()' for n in range(1, 6)],
                    "ValueError: boom"])
    RunDir(run).failed(0).write_text(failure_text(1, 1, tb, node="node2", raised="ValueError: boom",
                                                  at="train.py:5 in f5"))
    state = JobState("7", "FAILED", "1:0", None, None, None)
    noise = "\n".join(["-" * 70, "Primary job  terminated normally, but 1 process returned", "-" * 70])
    outcome = Outcome(job_id="7", run_dir=str(run), exit_class=FAILED, state=state,
                      log="runs/s/slurm-7.out", tail=noise)
    text = outcome.failure()
    first, *rest = text.splitlines()
    assert first == ("job 7 ended FAILED (exit 1:0): rank 1 on node2: ValueError: boom "
                     "(at train.py:5 in f5)")
    assert rest[0] == "Traceback (most recent call last, its last 3 frames):"
    assert 'line 3, in f3' in text and 'line 2, in f2' not in text and "Primary job" not in text
    assert rest[-2:] == ["ValueError: boom", "the whole log: runs/s/slurm-7.out (hpcsuite logs 7)"]


def test_a_marker_without_a_traceback_keeps_the_log_tail_and_old_markers_still_read(tmp_path):
    from hpcsuite.runner.status import reported_error

    run = RunDir(tmp_path)
    run.failed(0).write_text("rank 1\nValueError: x\n")                   # before exit lines
    assert reported_error(tmp_path) == {"attempt": 0, "rank": 1, "message": "ValueError: x",
                                        "node": None, "at": None, "hint": None, "frames": None}
    run.failed(1).write_text(failure_text(0, 2, "error: preflight.fabric: too slow"))
    said = reported_error(tmp_path)
    assert (said["attempt"], said["message"], said["frames"]) == (1, "preflight.fabric: too slow", None)


def test_a_second_rank_does_not_say_above_and_writes_whole_lines(tmp_path):
    RunDir(tmp_path).failed(0).write_text(failure_text(1, 1, "Traceback ...\nValueError: first"))
    code = ("import sys; from pathlib import Path; from hpcsuite.runtime.train import fail; "
            "print('buffered', end='', file=sys.stderr); "
            "fail(Path(sys.argv[1]), 0, 'Traceback ...\\nValueError: second', code=1)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("buffered") and done.stderr.endswith(
        "failed too (ValueError: second); rank 1's failure, the first, is reported in this log "
        f"and in {RunDir(tmp_path).failed(0)}\n"), done.stderr
    assert "above" not in done.stderr


# ------------------------------------------------------------------- Keras 3
@pytest.mark.parametrize("message", [
    "Invalid keyword argument(s) in `compile()`: ({'experimental_run_tf_function'},)",
    "'Variable' object has no attribute 'ref'",
    "in user code:\n\n    File \"functions.py\", line 36, in broadcast_group  *\n        "
    "var.assign(x)\n\n    AttributeError: 'SymbolicTensor' object has no attribute 'assign'\n",
])
def test_the_known_keras_3_errors_point_to_the_docs(tmp_path, message):
    from hpcsuite.runner.status import error_said, reported_error

    kind = "TypeError" if "compile" in message else "AttributeError"
    job = _script_job(tmp_path / "run", f"raise {kind}({message!r})\n")
    assert _rank(job).returncode == 1
    said = reported_error(job.parent)
    assert said["hint"].startswith("Horovod's TF2/Keras examples do not run under Keras 3 "
                                   "(Horovod issue #4290): docs/user/your-code.md#keras-3")
    assert error_said(said).endswith(said["hint"]) and said["message"].startswith(kind)
    if message.startswith("in user code:"):      # TensorFlow's wrapper: its last line
        assert said["message"] == ("AttributeError: 'SymbolicTensor' object has no attribute "
                                   "'assign'")
    page = (Path(__file__).parent.parent / "docs" / "user" / "your-code.md").read_text()
    assert "{#keras-3}" in page


# ------------------------------------------------------------------- points 5 and 7: each rank's word
NO_API = "print('hello from the script')\n"


def test_a_rank_whose_script_never_initialised_horovod_says_it_trained_alone(tmp_path):
    job = _script_job(tmp_path / "run", NO_API)
    done = _rank(job, {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"})
    assert done.returncode == 0, done.stderr
    word = json.loads(RunDir(job.parent).script_word(0, 1).read_text())
    assert word == {"rank": 1, "ranks": 2, "api": False, "horovod_size": None, "mpi_size": None}
    assert "rank 1 of 2 never joined a Horovod world" in done.stderr


def test_a_script_with_horovod_initialised_in_a_world_of_its_own_size_is_not_alone(tmp_path):
    pytest.importorskip("horovod.torch")
    job = _script_job(tmp_path / "run", "import sys\nimport horovod.torch as hvd\nhvd.init()\n"
                                        "hvd.shutdown()\nsys.exit(0)\n")
    done = _rank(job)
    assert done.returncode == 0, done.stderr
    word = json.loads(RunDir(job.parent).script_word(0, 0).read_text())
    assert word["horovod_size"] == 1 and not script_ranks.alone(word)   # seen despite shutdown()


def _word(rank, ranks=2, api=False, size=None, mpi=None):
    return script_ranks.word(rank, ranks, api, size, mpi)


def test_the_lines_a_script_word_gives():
    alone = [_word(0), _word(1)]
    assert script_ranks.lines(alone, "9", results=False) == [
        "warning: none of the 2 ranks joined a Horovod world (the script never called "
        "hvd.init()): each trained alone as a world of one, not one distributed run",
        "completed; the script records nothing through hpcsuite.api: its output is in "
        "`hpcsuite logs 9`"]
    together = [_word(0, size=2), _word(1, size=2)]
    assert script_ranks.lines(together, "9", results=False) == [script_ranks.nothing_recorded_line("9")]
    assert script_ranks.lines(together, "9", results=False, completed=False) == []
    api = [_word(0, api=True, size=2), _word(1, api=True, size=2)]
    assert script_ranks.lines(api, "9", results=True) == []
    assert script_ranks.alone_line([_word(0, size=2), _word(1)]).startswith(
        "warning: rank 1 of 2 never joined a Horovod world")
    assert not script_ranks.alone(_word(0, mpi=2))        # mpi4py's own world: not alone
    assert not script_ranks.alone(_word(0, ranks=1))      # one rank asked for: a world of one


def test_the_latest_attempts_words_are_read(tmp_path):
    run = RunDir(tmp_path)
    for attempt, api in ((0, False), (1, True)):
        run.script_word(attempt, 0).parent.mkdir(parents=True, exist_ok=True)
        run.script_word(attempt, 0).write_text(json.dumps(_word(0, api=api)))
    run.script_word(1, 1).write_text("{half")
    assert script_ranks.read(tmp_path) == [_word(0, api=True)]


def test_report_of_a_script_that_records_nothing_says_so_and_exits_0(here):
    run = here / "runs" / "s" / "5"
    RunDir(run).script_word(0, 0).parent.mkdir(parents=True)
    RunDir(run).script_word(0, 0).write_text(json.dumps(_word(0, ranks=1, size=1)))
    RunDir(run).submit.write_text(json.dumps({"job_id": "5"}))
    result = CliRunner().invoke(main, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert "completed; the script records nothing through hpcsuite.api: its output is in " \
           "`hpcsuite logs" in result.output and "nothing to plot" in result.output
    RunDir(run).failed(0).write_text(failure_text(1, 1, "x"))       # a rank failed: not that
    failed = CliRunner().invoke(main, ["report", str(run)])
    assert failed.exit_code == 2 and "no results yet" in failed.output
