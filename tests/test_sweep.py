"""Sweeps without a cluster: the sweep file and its elements, every element checked before
anything is submitted, the job array's header read back, the registry's elements, status,
report and resubmission refusals against a fake Slurm query."""

import json

import pytest

from conftest import run_cli
from hpcsuite.errors import UserError
from hpcsuite.runs import jobs, registry
from hpcsuite.runs.jobs import JobState
from hpcsuite.submit.plan import ArrayPlan, plan
from hpcsuite.submit.sbatch_header import HeaderError
from hpcsuite.submit.site_profile import SiteProfile
from hpcsuite.submit.spec import spec_from_dict
from hpcsuite.submit.strict_yaml import load
from hpcsuite.submit.templating import SearchPath
from hpcsuite.sweep import report as sr
from hpcsuite.sweep import run as sw
from hpcsuite.sweep import spec as ss
from hpcsuite.sweep.status import element_rows
from hpcsuite.sweep.sweepdir import SweepDir

BASE = """name: base
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00", partition: debug}
train:
  model: mlp
  data: {kind: synthetic, samples: 256, shape: [8], classes: 4}
  eval: {split: 0.25}
  batch_size: 16
"""
PROFILE = """name: test
partitions: {debug: {cpus_per_node: 1, max_time: "01:00:00"}}
sweep_max_parallel: 3
locked: [train.precision]
"""
GRID = """name: grid
base: job.yaml
axes:
  train.lr: [0.01, 0.1]
  train.seed: [1, 2, 3]
max_parallel: 2
"""


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A project with a base job and a site profile, no profile of this machine."""
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "profile.yaml").write_text(PROFILE)
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(BASE)
    return tmp_path


def write(work, text, name="sweep.yaml"):
    (work / name).write_text(text)
    return str(work / name)


# ---------------------------------------------------------------------- the sweep file
def test_a_grid_expands_in_order_with_the_last_axis_fastest(work):
    elements = ss.expand(ss.load_sweep(write(work, GRID)))
    assert [e.values for e in elements[:3]] == [{"train.lr": 0.01, "train.seed": 1},
                                                 {"train.lr": 0.01, "train.seed": 2},
                                                 {"train.lr": 0.01, "train.seed": 3}]
    assert len(elements) == 6 and [e.index for e in elements] == list(range(6))
    assert elements[4].sets == ["train.lr=0.1", "train.seed=2"]


RANDOM = """name: rnd
base: job.yaml
random: {count: 20, seed: SEED}
axes:
  train.lr: {log_uniform: [0.0001, 0.1]}
  train.batch_size: {randint: [8, 64]}
  train.optimizer.momentum: {uniform: [0.5, 0.99]}
  train.optimizer.name: [sgd, adam]
"""


def test_random_draws_are_fixed_by_the_seed_and_stay_in_range(work):
    one = ss.expand(ss.load_sweep(write(work, RANDOM.replace("SEED", "7"))))
    again = ss.expand(ss.load_sweep(write(work, RANDOM.replace("SEED", "7"))))
    other = ss.expand(ss.load_sweep(write(work, RANDOM.replace("SEED", "8"))))
    assert [e.values for e in one] == [e.values for e in again]
    assert [e.values for e in one] != [e.values for e in other]
    assert len(one) == 20
    for e in one:
        v = e.values
        assert 0.0001 <= v["train.lr"] <= 0.1 and 8 <= v["train.batch_size"] <= 64
        assert type(v["train.batch_size"]) is int and 0.5 <= v["train.optimizer.momentum"] <= 0.99
        assert v["train.optimizer.name"] in ("sgd", "adam")
    lrs = sorted(e.values["train.lr"] for e in one)
    assert lrs[0] < 0.001 and lrs[-1] > 0.01       # log-uniform reaches both decades


@pytest.mark.parametrize("value", [0.1, 1e-05, 3, True, False, "sgd", "true", "10:00", "a b",
                                   "123", "", "x: y", "'q'", "é"])
def test_set_text_reads_back_as_the_value(value):
    text = ss.set_text("train.any", value)
    back = load(text) if text else ""
    assert back == value and isinstance(back, str) == isinstance(value, str), (value, text, back)
    assert ss.set_text("env.X", "a b") == "a b"      # env takes its text as typed


@pytest.mark.parametrize("text, key, words", [
    ("name: s\nbase: job.yaml\naxes: {train.lrr: [1]}\n", "axes.train.lrr", 'did you mean "train.lr"'),
    ("name: s\nbase: job.yaml\naxes: {}\n", "axes", "no axes"),
    ("name: s\nbase: job.yaml\naxes: {train.lr: []}\n", "axes.train.lr", "non-empty list"),
    ("name: s\nbase: job.yaml\naxes: {train.lr: 0.1}\n", "axes.train.lr", "non-empty list"),
    ("name: s\nbase: job.yaml\naxes: {train.lr: [0.1, 0.1]}\n", "axes.train.lr", "twice"),
    ("name: s\nbase: job.yaml\naxes: {train.lr: [[0.1]]}\n", "axes.train.lr[0]", "one value"),
    ("name: s\nbase: job.yaml\naxes: {name: [a, b]}\n", "axes.name", "sets name"),
    ("name: s\nbase: job.yaml\naxes: {train.lr: {uniform: [0, 1]}}\n", "axes.train.lr",
     "needs random"),
    ("name: s\nbase: job.yaml\nrandom: {count: 2}\naxes: {train.lr: {normal: [0, 1]}}\n",
     "axes.train.lr", "expected one of"),
    ("name: s\nbase: job.yaml\nrandom: {count: 2}\naxes: {train.lr: {log_uniform: [0, 1]}}\n",
     "axes.train.lr.log_uniform", "low > 0"),
    ("name: s\nbase: job.yaml\nrandom: {count: 2}\naxes: {train.lr: {uniform: [1, 0]}}\n",
     "axes.train.lr.uniform", "below high"),
    ("name: s\nbase: job.yaml\nrandom: {count: 2}\naxes: {train.seed: {randint: [1, 2.5]}}\n",
     "axes.train.seed.randint", "two integers"),
    ("name: s\nbase: job.yaml\nrandom: {count: 0}\naxes: {train.lr: [1]}\n", "random.count",
     "below the minimum"),
    ("name: s\nbase: job.yaml\naxes: {train.lr: [.nan]}\n", "axes.'train.lr'[0]", "not a finite"),
    ("name: s\nbase: job.yaml\naxes: {train.seed: [010]}\n", "axes.'train.seed'[0]", "octal"),
    ("name: s\nbase: job.yaml\naxes: {'a b': [1]}\n", "axes", "not a dotted job key"),
    ("name: s\nbase: job.yaml\naxes: {train.seed: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]," +
     " train.lr: [" + ", ".join(str(i) for i in range(1, 101)) + "]}\n", "axes", "1100 elements"),
    ("name: s\nbase: job.yaml\nmetric: {name: accuracy}\naxes: {train.lr: [1]}\n", "metric.name",
     "is not valid"),
    ("name: 'a b'\nbase: job.yaml\naxes: {train.lr: [1]}\n", "name", "is not valid"),
    ("name: s\nbase: nothere.yaml\naxes: {train.lr: [1]}\n", "base", "no such file"),
])
def test_bad_sweep_files_are_one_line_naming_the_key(work, text, key, words):
    path = write(work, text)
    proc = run_cli("sweep", "run", path, "--dry-run", cwd=work)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: {key}"), lines
    assert words in lines[0]


# ---------------------------------------------------------------------- every element checked
def test_every_element_is_planned_and_the_array_runs_one_script(work):
    planned = sw.plan_sweep(write(work, GRID), against_slurm=False)
    assert planned.array.spec == "0-5%2"
    assert "#SBATCH --array=0-5%2\n" in planned.request.script
    assert "#SBATCH --output=runs/grid/slurm-%A_%a.out" in planned.request.script
    assert 'RUN_DIR=runs/grid/"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in planned.request.script
    assert "HPCSUITE_JOB_JSON" not in planned.request.script      # the element's job.json, copied
    assert [(j.train.lr, j.train.seed) for j in planned.jobs] == [
        (0.01, 1), (0.01, 2), (0.01, 3), (0.1, 1), (0.1, 2), (0.1, 3)]
    assert {j.name for j in planned.jobs} == {"grid"}
    base = planned.jobs[0].to_dict()
    for job in planned.jobs[1:]:    # an element differs from another in its axes only
        other = job.to_dict()
        assert {k for k in base["train"] if base["train"][k] != other["train"][k]} <= {"lr", "seed"}
        assert {k: v for k, v in base.items() if k != "train"} == \
            {k: v for k, v in other.items() if k != "train"}


def test_max_parallel_defaults_to_and_stops_at_the_sites(work):
    planned = sw.plan_sweep(write(work, GRID.replace("max_parallel: 2\n", "")), against_slurm=False)
    assert planned.array.spec == "0-5%3"
    with pytest.raises(UserError, match=r"sweep.yaml: max_parallel: 4 is above this site's "
                                        r"sweep_max_parallel \(3\)"):
        sw.plan_sweep(write(work, GRID.replace("max_parallel: 2", "max_parallel: 4")),
                      against_slurm=False)


@pytest.mark.parametrize("axis, message", [
    # a bad value in one element refuses the sweep, naming the element and the key
    ("train.batch_size: [16, 0]", "elements[1].train.batch_size: 0 is below the minimum 1 "
                                  "(element 1: train.batch_size=0)"),
    # the site's lock holds for a sweep axis as for --set
    ("train.precision: [fp32, amp]", "elements[1].train.precision: the site fixes "
                                     "train.precision"),
    # lint: more ranks x CPUs than the partition's node has
    ("train.lr: [0.1]\n  resources.cpus_per_task: [4]", "elements[0].resources.tasks_per_node: "
                                                         "1 ranks x 4 CPUs"),
    # an axis that changes the script (header, environment) cannot share one array
    ("resources.nodes: [1, 2]", "axes.resources.nodes: element 1 (resources.nodes=2) renders "
                                "another batch script than element 0"),
    ("env.NCCL_DEBUG: [INFO, WARN]", "axes.env.NCCL_DEBUG: element 1 (env.NCCL_DEBUG=WARN)"),
    ("train.lr: [0.1, 0.2]\n  train.horovod.fusion_threshold_mb: [1, 2]",
     "axes.train.horovod.fusion_threshold_mb: element 1"),
])
def test_one_bad_element_refuses_the_sweep(work, axis, message):
    path = write(work, f"name: s\nbase: job.yaml\naxes:\n  {axis}\n")
    with pytest.raises(UserError) as exc:
        sw.plan_sweep(path, against_slurm=False)
    assert str(exc.value).startswith(f"{path}: ") and message in str(exc.value), str(exc.value)
    proc = run_cli("sweep", "run", path, "--dry-run", cwd=work)
    assert proc.returncode == 2 and message in proc.stderr and not (work / "sweeps").exists()


def test_each_element_gets_its_own_checkpoints(work):
    (work / "job.yaml").write_text(BASE + "  checkpoint: {every_steps: 5}\n")
    planned = sw.plan_sweep(write(work, GRID), against_slurm=False)
    dirs = [j.train.checkpoint.dir for j in planned.jobs]
    assert dirs == [str(planned.sd.checkpoints(i)) for i in range(6)]
    assert planned.elements[2].sets[-1] == f"train.checkpoint.dir={planned.sd.checkpoints(2)}"
    (work / "job.yaml").write_text(BASE + "  checkpoint: {every_steps: 5, dir: ck}\n")
    with pytest.raises(UserError, match="train.checkpoint.dir: elements 0 and 1 would both keep"):
        sw.plan_sweep(write(work, GRID), against_slurm=False)


# ---------------------------------------------------------------------- the header read-back
def _job():
    return spec_from_dict({"name": "s", "resources": {"time": "00:05:00"}}, "test")


def _template(tmp_path, header_line):
    d = tmp_path / "templates"
    d.mkdir(exist_ok=True)
    (d / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n{% block sbatch %}{{ super() }}'
        + header_line + "\n{% endblock %}\n")
    return SearchPath((("cli", d), *SearchPath.builtin_only().dirs))


def test_the_header_must_carry_the_sweeps_array_exactly(tmp_path):
    array = ArrayPlan(spec="0-3%2", elements=str(tmp_path), digest="d")
    script = plan(_job(), SiteProfile(python="python3"), SearchPath.builtin_only(),
                  array=array).script
    assert "#SBATCH --array=0-3%2" in script
    with pytest.raises(HeaderError, match=r"#SBATCH --array must be '0-3%2'.*--array='0-9'"):
        plan(_job(), SiteProfile(), _template(tmp_path, "#SBATCH --array=0-9"), array=array)
    with pytest.raises(HeaderError, match=r"#SBATCH --array must be '0-3%2'.*'0-3%2 '"):
        plan(_job(), SiteProfile(), _template(tmp_path, "#SBATCH -a '0-3%2 '"), array=array)
    # a template that drops it (the elements would never run) is refused too
    d = tmp_path / "drop"
    d.mkdir()
    (d / "horovod.sbatch.j2").write_text(
        (SearchPath.builtin_only().which("horovod")).read_text().replace("#SBATCH --array", "# no"))
    with pytest.raises(HeaderError, match="#SBATCH --array must be '0-3%2'.*missing"):
        plan(_job(), SiteProfile(), SearchPath((("cli", d),)), array=array)


def test_a_plain_job_may_not_become_an_array(tmp_path):
    with pytest.raises(HeaderError, match=r"#SBATCH --array is not allowed here \(hpcsuite "
                                          r"submits one job here"):
        plan(_job(), SiteProfile(), _template(tmp_path, "#SBATCH --array=0-99"))


# ---------------------------------------------------------------------- registry and Slurm ids
def test_the_registry_derives_an_arrays_elements(tmp_path):
    registry.record(tmp_path, {"job_id": "40", "name": "plain", "run_dir": str(tmp_path / "r/40")})
    registry.record(tmp_path, {"job_id": "41", "name": "grid", "run_dir": str(tmp_path / "runs/grid"),
                               "array": {"sweep": "grid", "sweep_dir": "/s", "indices": [0, 1, 2]}})
    rows = registry.expand(registry.load(tmp_path))
    assert [r["job_id"] for r in rows] == ["40", "41", "41_0", "41_1", "41_2"]
    assert rows[3]["run_dir"] == str(tmp_path / "runs/grid/41_1") and rows[3]["index"] == 1
    assert registry.find(tmp_path, "41_2")["run_dir"] == str(tmp_path / "runs/grid/41_2")
    assert registry.find(tmp_path, str(tmp_path / "runs/grid/41_0"))["job_id"] == "41_0"
    assert registry.find(tmp_path, "grid") is None        # a name is a plain job's
    with pytest.raises(UserError, match="41 is a job array of 3 element"):
        from hpcsuite.runner import describe
        describe("41", tmp_path)
    with open(registry.path_in(tmp_path), "a") as f:
        f.write(json.dumps({"job_id": "42", "run_dir": "x", "array": {"indices": ["0"]}}) + "\n")
    with pytest.raises(UserError, match=r"runs.jsonl:3: not a run record"):
        registry.load(tmp_path)


def test_element_ids_are_job_ids():
    assert jobs._check_id("41_3") == "41_3"
    for bad in ("41_", "_3", "41_3_1", "41-3", "４１"):
        with pytest.raises(UserError, match="ARRAYID_INDEX"):
            jobs._check_id(bad)
    out = "41_0|COMPLETED|0:0|00:00:10||/w\n41_0.batch|COMPLETED|0:0|00:00:10|300M|\n" \
          "41_[1-2%1]|PENDING|0:0|00:00:00||/w\n"
    found = jobs.parse_sacct(out, {"41_0", "41_1"})
    assert set(found) == {"41_0"} and found["41_0"].max_rss == "300M"


# ---------------------------------------------------------------------- status, report, resubmit
def _submitted(work, states, results):
    """The grid sweep written and recorded as array 50 (no sbatch), its run directories with
    ``results`` (index -> val accuracy), and a fake query answering ``states``."""
    planned = sw.plan_sweep(write(work, GRID), against_slurm=False)
    sd = sw.create(planned)
    sd.record_submission({"array_job_id": "50", "indices": list(range(6))})
    for index, accuracy in results.items():
        run = sd.run_dir(f"50_{index}")
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps({
            "status": "completed", "loss": [2.0, 1.0 - accuracy], "samples_per_s": 100.0 + index,
            "eval": [{"accuracy": accuracy / 2, "loss": 3.0}, {"accuracy": accuracy, "loss": 2.0}]}))

    def query(ids):
        return {j: JobState(j, states.get(j, "COMPLETED"), "0:0", None, None, None)
                for j in ids}
    return sd, query


def test_status_and_report_rank_the_elements(work):
    sd, query = _submitted(work, {"50_5": "RUNNING", "50_4": "FAILED"},
                           {0: 0.5, 1: 0.9, 2: 0.7, 3: 0.6})
    rows, note = element_rows(sd, query)
    assert note is None
    assert [rows[i]["done"] for i in range(6)] == [True] * 4 + [False, False]
    assert rows[4]["finished"] and not rows[5]["finished"] and rows[5]["state"] == "RUNNING"
    data = sr.report(sd, query)
    assert data["best"] == 1 and [r["best"] for r in data["rows"]] == [False, True] + [False] * 4
    assert data["rows"][1]["val_accuracy"] == 0.9 and data["rows"][1]["final_loss"] == pytest.approx(0.1)
    assert data["rows"][4]["metric"] is None
    written = sr.write(sd, data)
    assert [p.name for p in written] == ["sweep.csv", "sweep.json", "sweep.png"]
    assert written[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv_rows = written[0].read_text().splitlines()
    assert csv_rows[0].startswith("index,train.lr,train.seed,job_id,state")
    assert csv_rows[2].endswith(",yes")
    text = "\n".join(sr.table(data))
    assert "* 1" in text and "best by val_accuracy (max): element 1 (train.lr=0.01, train.seed=2)" in text
    assert "best val acc" in text.splitlines()[0] and "best val loss" in text.splitlines()[0]
    assert sr.BEST_NOTE in text


def test_the_validation_columns_are_the_best_epochs_not_the_last(work):
    """A run whose accuracy fell and whose loss rose after its best epoch: the report shows
    the best of each, and says so under the table."""
    sd, query = _submitted(work, {}, {0: 0.5})
    run = sd.run_dir("50_0")
    (run / "results.json").write_text(json.dumps({
        "status": "completed", "loss": [2.0, 1.0],
        "eval": [{"accuracy": 0.4, "loss": 2.5}, {"accuracy": 0.8, "loss": 1.5},
                 {"accuracy": 0.6, "loss": 1.9}]}))
    data = sr.report(sd, query)
    row = data["rows"][0]
    assert (row["val_accuracy"], row["val_loss"]) == (0.8, 1.5)
    lines = sr.table(data)
    assert "80.00%" in lines[1] and "1.5000" in lines[1]
    assert lines[-1] == sr.BEST_NOTE and "each at its own epoch" in lines[-1]


def test_a_min_metric_picks_the_lowest(work):
    sd, query = _submitted(work, {}, {0: 0.5, 1: 0.9, 2: 0.7})
    d = json.loads(sd.elements_file.read_text())
    d["metric"] = {"name": "loss", "goal": None}
    sd.elements_file.write_text(json.dumps(d))
    data = sr.report(sd, query)
    assert data["metric"] == {"name": "loss", "goal": "min"} and data["best"] == 1


def test_resubmit_refuses_what_cannot_run_again(work):
    sd, query = _submitted(work, {"50_5": "RUNNING", "50_4": "FAILED"}, {0: 0.5})
    with pytest.raises(UserError, match="element 5 is RUNNING as job 50_5; `hpcsuite cancel 50_5`"):
        sw.resubmit(sd, 5, query=query, against_slurm=False)
    with pytest.raises(UserError, match="element 0 completed as job 50_0"):
        sw.resubmit(sd, 0, query=query, against_slurm=False)
    with pytest.raises(UserError, match="no element 9; the sweep has elements 0 to 5"):
        sw.resubmit(sd, 9, query=query, against_slurm=False)
    (work / "job.yaml").write_text(BASE.replace("batch_size: 16", "batch_size: 32"))
    with pytest.raises(UserError, match=r"element 4 now resolves to another job "
                                        r"\(train.batch_size: 16 then, 32 now\)"):
        sw.resubmit(sd, 4, query=query, against_slurm=False)


def test_a_sweep_directory_is_never_overwritten(work):
    planned = sw.plan_sweep(write(work, GRID), against_slurm=False)
    sw.create(planned)
    with pytest.raises(UserError, match="already exists"):
        sw.create(planned)
    job = json.loads(planned.sd.element_job(3).read_text())
    assert (job["train"]["lr"], job["train"]["seed"], job["name"]) == (0.1, 1, "grid")
    assert SweepDir(planned.sd.path).elements()[3].sets == ["train.lr=0.1", "train.seed=1"]


def test_model_and_data_arguments_are_axes(work):
    """Model arguments (train.model_args.NAME, for a FILE.py:function builder) and a data
    factory's (train.data.args.NAME) vary like any key; the rest of the mapping stays."""
    (work / "net.py").write_text("def build(shape, classes, hidden=8, depth=1): pass\n")
    (work / "job.yaml").write_text(BASE.replace("  model: mlp\n", "  model: net.py:build\n"
                                                "  model_args: {depth: 2}\n"))
    planned = sw.plan_sweep(write(work, "name: m\nbase: job.yaml\naxes:\n"
                                        "  train.model_args.hidden: [16, 32]\n"), against_slurm=False)
    assert [j.train.model_args for j in planned.jobs] == [{"depth": 2, "hidden": 16},
                                                          {"depth": 2, "hidden": 32}]
    (work / "job.yaml").write_text(BASE)            # the built-in mlp takes no arguments
    with pytest.raises(UserError, match=r"elements\[0\].train.model_args: .*built-in model 'mlp'"):
        sw.plan_sweep(write(work, "name: b\nbase: job.yaml\naxes:\n"
                                  "  train.model_args.hidden: [16]\n"), against_slurm=False)


def test_a_resubmitted_element_waits_so_the_sweep_keeps_max_parallel(work, monkeypatch):
    """%2 throttles the first array only: element 4 resubmitted while 50_1 and 50_2 run and
    50_3 and 50_5 wait must start after all of them but the newest one (50_5) have ended."""
    from hpcsuite import slurm

    planned = sw.plan_sweep(write(work, GRID), against_slurm=False)
    sd = sw.create(planned)
    sd.record_submission({"array_job_id": "50", "indices": list(range(6)), "array": "0-5%2"})
    states = {"50_0": "COMPLETED", "50_1": "RUNNING", "50_2": "RUNNING", "50_3": "PENDING",
              "50_4": "FAILED", "50_5": "PENDING"}

    def query(ids):
        return {j: JobState(j, states[j], "0:0", None, None, None) for j in ids if j in states}
    sbatched = []

    def fake(argv, **kw):
        sbatched.append(argv)
        return slurm.Completed(argv, 0, "60\n", "")
    monkeypatch.setattr(slurm, "call", fake)
    assert sw.max_parallel(sd) == 2
    done = sw.resubmit(sd, 4, query=query, against_slurm=False)
    assert done.job_id == "60" and done.max_parallel == 2
    assert done.waits_for == ["50_1", "50_2", "50_3"]
    assert "--dependency=afterany:50_1:50_2:50_3" in sbatched[-1]
    assert sd.submissions()[-1]["waits_for"] == ["50_1", "50_2", "50_3"]

    # the resubmission is one of the sweep's jobs now: the next one waits for it too
    states.update({"60_4": "PENDING", "50_0": "FAILED"})
    rows = element_rows(sd, query)[0]
    assert sw.waits_for(sd, rows, 2) == ["50_1", "50_2", "50_3", "50_5"]
    assert sw.waits_for(sd, rows, 5) == ["50_1"] and sw.waits_for(sd, rows, 6) == []
    # only one running, nothing waiting: it may run beside it at once
    states.update({"50_2": "COMPLETED", "50_3": "COMPLETED", "50_5": "COMPLETED",
                   "60_4": "COMPLETED"})
    assert sw.waits_for(sd, element_rows(sd, query)[0], 2) == []
    assert sw.throttle_dependency(planned.jobs[0], ["50_1"]) == "afterany:50_1"
