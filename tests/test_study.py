"""Study specs, their points, the bundle and the report's arithmetic, without a cluster."""

import subprocess

import pytest

from conftest import run_cli, slurm_says_its_release
from hpcsuite.study import points as st
from hpcsuite.study import bundle as sb
from hpcsuite.study import advice as sa
from hpcsuite.study import report as sr
from hpcsuite.alphabeta import AlphaBeta
from hpcsuite.errors import UserError
from hpcsuite.submit.spec import spec_from_dict

BASE = """name: base
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train: {model: mlp, data: {kind: synthetic, samples: 256, shape: [8]}, batch_size: 16}
"""


def write_study(tmp_path, text, base=BASE):
    (tmp_path / "job.yaml").write_text(base)
    (tmp_path / "model.py").write_text("def build(shape, classes): pass\n")
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No site, user or project profile of this machine."""
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(tmp_path / "no-site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user"))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    return tmp_path


@pytest.mark.parametrize("text, key", [
    ("name: s\nbase: job.yaml\naxes: {gpus: [1]}\n", "axes.gpus"),
    ("name: s\nbase: job.yaml\naxes: {nodes: []}\n", "axes.nodes"),
    ("name: s\nbase: job.yaml\naxes: {nodes: [1, 1]}\n", "axes.nodes"),
    ("name: s\nbase: job.yaml\naxes: {nodes: 2}\n", "axes.nodes"),
    ("name: s\nbase: job.yaml\nmode: sideways\n", "mode"),
    ("name: s\nbase: job.yaml\nrepeats: 0\n", "repeats"),
    ("name: s\nbase: job.yaml\nsteps: .nan\n", "steps"),
    ("name: s\nbase: job.yaml\nbase: other.yaml\n", "base"),
    ("name: 'a b'\nbase: job.yaml\n", "name"),
    ("base: job.yaml\n", "name"),
])
def test_bad_study_specs_name_the_key(tmp_path, text, key):
    path = write_study(tmp_path, text)
    with pytest.raises(UserError) as exc:
        st.load_study(str(path))
    assert str(path) in str(exc.value) and key in str(exc.value)
    proc = run_cli("study", "run", str(path), "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_points_weak_and_strong(tmp_path):
    base = spec_from_dict({"name": "b", "train": {"batch_size": 32}}, "t")
    weak = st.Study(name="s", base="job.yaml", axes={"nodes": [1, 2], "horovod.compression":
                                                     ["none", "fp16"]}, repeats=2)
    points = st.expand(weak, base)
    train = [p for p in points if p.kind == "train"]
    assert len(train) == 8 and len([p for p in points if p.kind == "limit"]) == 8
    assert [p.kind for p in points if p.kind == "allreduce"] == ["allreduce"]
    assert len({p.job_name for p in points}) == len(points)
    # each configuration's limit right after it, repeat by repeat
    assert [p.id for p in points[:4]] == ["p00-r0", "p00L-r0", "p01-r0", "p01L-r0"]
    sets = st.point_sets(weak, base, train[-1], "/x/runs")
    assert 'train.horovod.compression="fp16"' in sets and "train.max_steps=60" in sets
    limit = st.point_sets(weak, base, points[1], "/x/runs")
    assert "train.horovod.allreduce=false" in limit
    strong = st.Study(name="s", base="job.yaml", mode="strong", axes={"nodes": [1, 2, 3],
                                                                      "batch_size": [96]})
    p2 = next(p for p in st.expand(strong, base) if p.axes["nodes"] == 2)
    assert "train.batch_size=48" in st.point_sets(strong, base, p2, "/x")
    bad = st.Study(name="s", base="job.yaml", mode="strong", axes={"nodes": [1, 5],
                                                                   "batch_size": [96]})
    p5 = next(p for p in st.expand(bad, base) if p.axes["nodes"] == 5)
    with pytest.raises(UserError, match="does not divide"):
        st.point_sets(bad, base, p5, "/x")


def test_points_that_break_the_site_are_reported_before_anything_is_submitted(isolated):
    site = isolated / "no-site"
    site.mkdir()
    (site / "profile.yaml").write_text("partitions: {debug: {cpus_per_node: 2, max_time: '00:30:00'}}\n"
                                       "defaults: {resources: {partition: debug}}\n"
                                       "locked: [resources.partition]\n")
    path = write_study(isolated, "name: s\nbase: job.yaml\naxes: {tasks_per_node: [1, 2, 4]}\n")
    proc = run_cli("study", "run", str(path), "--wait", cwd=isolated)
    assert proc.returncode == 2, proc.stderr
    assert "points break the site's rules" in proc.stderr and "tasks_per_node=4" in proc.stderr
    assert "nothing was submitted" in proc.stderr and "Traceback" not in proc.stderr
    assert ".partial" not in proc.stderr and f"{path}: axes: point p02-r0" in proc.stderr
    assert not (isolated / "studies").exists() or not any((isolated / "studies").iterdir())


def test_bundle_holds_inputs_with_their_sha256(isolated):
    path = write_study(isolated, "name: s\nbase: job.yaml\naxes: {nodes: [1, 2]}\nrepeats: 1\n")
    proc = run_cli("study", "run", str(path), "--dry-run", cwd=isolated)
    assert proc.returncode == 0, proc.stderr
    sd = st.StudyDir(isolated / "studies" / "s")
    for name in ("study.yaml", "bundle.json", "points.json", "environment.json", "inputs.sha256",
                 "inputs/job.yaml", "inputs/model.py", "points/p01-r0/job.yaml",
                 "points/p01-r0/job.sbatch"):
        assert (sd.path / name).is_file(), name
    assert not (sd.path / "inputs" / "studies").exists()     # the bundle is not copied into itself
    check = subprocess.run(["sha256sum", "-c", "--quiet", "inputs.sha256"], cwd=sd.path)
    assert check.returncode == 0
    sb.verify_bundle(sd.path)
    (sd.path / "inputs" / "model.py").write_text("changed\n")
    with pytest.raises(UserError, match="model.py changed"):
        sb.verify_bundle(sd.path)
    # the same directory from another study spec is refused
    path.write_text("name: s\nbase: job.yaml\naxes: {nodes: [1, 3]}\n")
    proc = run_cli("study", "run", str(path), "--dry-run", cwd=isolated)
    assert proc.returncode == 2 and "different study.yaml" in proc.stderr


def test_report_arithmetic_and_the_models_reading():
    r = {"step_times_s": [9.0] * 5 + [0.010] * 20, "batch_size_per_rank": 32, "world_size": 2,
         "grad_accumulation": 1}
    thr, step = sr.throughput(r, 5, 20)
    assert step == pytest.approx(0.010) and thr == pytest.approx(6400)
    model = AlphaBeta(alpha_s=1e-4, bandwidth_Bps=1e9, n=2)
    row = {"ranks": 2, "axes": {"nodes": 2, "tasks_per_node": 1},
           "results": {"gradient_bytes": 4_000_000, "gradient_tensors": 6},
           "step_s": {"median": 0.010}, "limit_step_s": {"median": 0.006}}
    m = sa.explain(row, model)
    assert m["predicted_comm_s"] == pytest.approx(2e-4 + 4e-3)
    assert m["measured_overhead_s"] == pytest.approx(0.004)
    assert m["now_of_limit"] == pytest.approx(0.6)
    best = m["knobs"][0]
    assert best["knob"] in ("train.batch_size", "train.grad_accumulation")
    # 6 ms of computation, 4 ms of overhead: 2x gives 0.75, 4x 0.857, 8x 0.923 of the limit
    assert best["of_limit"] == pytest.approx(0.048 / 0.052)
    batch = next(k for k in m["knobs"] if k["knob"] == "train.batch_size")
    assert batch["how"].startswith("8x the per-rank batch: ") and "0.90 of the limit" in batch["how"]
    row["results"].update(batch_size_per_rank=32, grad_accumulation=2)
    knobs = {k["knob"]: k["how"] for k in sa.explain(row, model)["knobs"]}
    assert knobs["train.batch_size"].startswith("8x the per-rank batch (256)")
    assert knobs["train.grad_accumulation"].startswith("accumulate 16 micro-batches")
    assert sa.scale_to_reach(0.006, 0.004) == 8
    assert sa.scale_to_reach(0.006, 0.0001) == 2                  # 2x is the least advised
    assert sa.scale_to_reach(1e-4, 1.0) == sa.MAX_SCALE           # never reached: the most
    fp16 = next(k for k in m["knobs"] if k["knob"] == "train.horovod.compression")
    assert fp16["of_limit"] == pytest.approx(0.006 / (0.006 + 0.004 - 0.002))
    assert sa.dominates_at(model, 4_000_000, 1, 0.006) == 4      # 0.6 ms + 6 ms at 4 ranks
    assert sa.dominates_at(AlphaBeta(alpha_s=1e-3, bandwidth_Bps=1e9, n=2), 0, 1, 0.006) == 4
    # no latency and a bandwidth term that tends to 2S/B = 2 ms: never passes 6 ms
    assert sa.dominates_at(AlphaBeta(alpha_s=0.0, bandwidth_Bps=1e9, n=2), 1e6, 1, 0.006) is None


def test_a_shorter_cycle_is_predicted_from_whole_cycles():
    # The local cluster's 2-node point at batch 128: 1.12 ms of computation, 0.13 ms transfer,
    # steps of 2.2 ms = two 1 ms cycles (each ~1.1 ms long).
    new_cycle, step, now, then = sa.shorter_cycle(2.2e-3, 1.25e-3, 1e-3, floor=3e-4)
    assert (new_cycle, now, then) == (5e-4, 2, 3) and step == pytest.approx(1.65e-3)
    assert sa.shorter_cycle(2.2e-3, 1.25e-3, 1e-3, floor=1e-4)[0] == 2.5e-4    # 5 x 0.25 ms
    assert sa.shorter_cycle(2.2e-3, 1.25e-3, 1e-3, floor=6e-4) is None          # floor above 0.5
    assert sa.shorter_cycle(10e-3, 10e-3, 1e-3, floor=1e-4) is None              # not rounded up
    model, mpi = AlphaBeta(alpha_s=2.5e-4, bandwidth_Bps=2e9, n=2), AlphaBeta(7.5e-6, 1.9e9, n=2)
    row = {"ranks": 2, "axes": {"nodes": 2, "tasks_per_node": 1},
           "results": {"gradient_bytes": 220_000, "gradient_tensors": 6},
           "step_s": {"median": 2.2e-3}, "limit_step_s": {"median": 1.12e-3}}
    knob = next(k for k in sa.explain(row, model, mpi)["knobs"]
                if k["knob"] == "train.horovod.cycle_time_ms")
    assert knob["how"].startswith("0.5:") and "2 of 1 ms now, 3 of 0.5 ms" in knob["how"]
    assert knob["of_limit"] == pytest.approx(1.12 / 1.65, rel=0.05)
    # without MPI's side only halving is offered
    knob = next(k for k in sa.explain(row, model)["knobs"]
                if k["knob"] == "train.horovod.cycle_time_ms")
    assert knob["how"].startswith("0.5:")


def test_study_help_explains():
    proc = run_cli("study", "--help")
    assert proc.returncode == 0 and "no-communication" in proc.stdout and "rerun" in proc.stdout
    for command in ("run", "status", "report", "rerun", "compare"):
        assert run_cli("study", command, "--help").returncode == 0
    proc = run_cli("study", "report", "/nonexistent")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_manifest_leaves_out_hidden_bookkeeping(tmp_path):
    """Submitting from inputs/ leaves the run registry in inputs/.hpcsuite/: not an input."""
    (tmp_path / "inputs" / ".hpcsuite").mkdir(parents=True)
    (tmp_path / "inputs" / ".hpcsuite" / "runs.jsonl").write_text("{}\n")
    (tmp_path / "inputs" / "job.yaml").write_text("name: x\n")
    sb.write_manifest(tmp_path, {})
    assert list(sb.read_manifest(tmp_path)) == ["inputs/job.yaml"]


# ---------------------------------------------------------------------- a finished study, faked

def fake_study(path, steps: dict, mode="weak", model=True, environment=None):
    """A study directory whose points have finished: ``steps`` maps (config, kind, repeat) to
    the per-step seconds of that job (config p00: 1 rank, p01: 2 ranks)."""
    import json

    sd = st.StudyDir(path)
    path.mkdir(parents=True)
    (path / "study.yaml").write_text(f"name: s\nbase: job.yaml\nmode: {mode}\n"
                                     "axes: {nodes: [1, 2]}\nrepeats: 2\nwarmup_steps: 0\n"
                                     "steps: 10\n")
    points, state = [], {}
    for (config, kind, repeat), step in steps.items():
        nodes = 1 if config == "p00" else 2
        pid = f"{config}{'L' if kind == 'limit' else ''}-r{repeat}"
        points.append(st.Point(pid, kind, config, {"nodes": nodes, "tasks_per_node": 1},
                               repeat, f"s-{pid}"))
        job = str(100 + len(points))
        state[pid] = {"job_id": job, "status": "done", "slurm": "RUNNING", "attempts": 1}
        run = path / "runs" / f"s-{pid}" / job
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps({
            "status": "completed", "step_times_s": [step] * 10, "batch_size_per_rank": 32,
            "world_size": nodes, "grad_accumulation": 1, "gradient_bytes": 4_000_000,
            "gradient_tensors": 1}))
    if model:
        points.append(st.Point("a00", "allreduce", "a00", {"nodes": 2, "tasks_per_node": 1}, 0,
                               "s-a00"))
        state["a00"] = {"job_id": "999", "status": "done", "attempts": 1}
        (path / "runs" / "s-a00" / "999").mkdir(parents=True)
        (path / "runs" / "s-a00" / "999" / "allreduce.json").write_text(json.dumps({
            "world_size": 2, "fit": {"horovod": {"alpha_s": 1e-4, "bandwidth_Bps": 1e9, "n": 2}}}))
    (path / "points.json").write_text(json.dumps({"mode": mode,
                                                  "points": [p.to_json() for p in points]}))
    (path / "state.json").write_text(json.dumps(state))
    (path / "environment.json").write_text(json.dumps(environment or {"horovod": "0.28.1"}))
    return sd


def steady(one, one_limit, two, two_limit):
    """Both repeats alike: seconds per step of p00, its limit, p01, its limit."""
    return {(c, k, r): s for r in (0, 1) for c, k, s in (
        ("p00", "train", one), ("p00", "limit", one_limit),
        ("p01", "train", two), ("p01", "limit", two_limit))}


def test_of_limit_is_one_number_in_the_table_and_the_advice(tmp_path):
    # Repeats 10 ms and 12 ms against a 6 ms limit: the median of the throughputs over the
    # limit's is 0.55, the limit's step over the median step 0.545; the report shows one.
    steps = steady(0.005, 0.005, 0.010, 0.006)
    steps[("p01", "train", 1)] = 0.012
    sd = fake_study(tmp_path / "s", steps)
    report = sr.analyse(sd)
    row = report["rows"][1]
    assert row["of_limit"] == pytest.approx(0.006 / 0.011) == sa.of_limit(row)
    assert row["model"]["now_of_limit"] == row["of_limit"] and not row["flags"]
    text = sr.table(report)
    line = next(l for l in text.splitlines() if l.startswith("all") and " 2 " in l)
    assert f" {row['of_limit']:.2f} " in line
    assert f"({row['of_limit']:.2f} of limit)" in text
    assert f"measured now {row['of_limit']:.2f}" in text
    # the columns say what they are
    assert "measured samples/s med [min-max]" in text and "predicted" in text
    assert "comm ms: predicted by the allreduce model" in text
    flat = sr.flat(row)
    assert set(flat) == set(sr.COLUMNS) and flat["measured_of_limit"] == row["of_limit"]
    assert all(c.startswith(("measured_", "predicted_")) for c in sr.COLUMNS
               if c not in ("series", "config", "ranks", "repeats", "flags", "best_knob"))


def test_repeats_that_disagree_are_flagged_not_diagnosed(tmp_path):
    steps = steady(0.005, 0.005, 0.010, 0.006)
    steps[("p01", "train", 1)] = 0.014                    # 1.4x the other repeat
    report = sr.analyse(fake_study(tmp_path / "s", steps))
    row = report["rows"][1]
    assert len(row["flags"]) == 1 and "repeats spread 1.40x" in row["flags"][0]
    assert "knobs" not in row["model"] and "measured_overhead_s" not in row["model"]
    assert row["model"]["predicted_comm_s"] > 0            # the prediction stays
    text = sr.table(report)
    assert "FLAGGED, not diagnosed: repeats spread 1.40x" in text and "overhead" not in text
    assert "p01" in text.splitlines()[-1] and "FLAGGED" in sr.flat(row)["flags"] + "FLAGGED"


def test_a_limit_that_does_not_grow_with_ranks_is_flagged(tmp_path):
    # Weak scaling: 2 ranks should do ~2x the samples/s of 1 without the allreduce; here the
    # limit's step went from 5 to 9 ms (1.11x the throughput): the ranks shared a core.
    report = sr.analyse(fake_study(tmp_path / "w", steady(0.005, 0.005, 0.012, 0.009)))
    row = report["rows"][1]
    assert len(row["flags"]) == 1 and "competed for the CPU" in row["flags"][0]
    assert "grew 1.11x from 1 to 2 ranks, not ~2x" in row["flags"][0]
    assert "knobs" not in row["model"]
    # 1.6x of the 2x expected is within LIMIT_GROWTH_FLAG: read as communication
    report = sr.analyse(fake_study(tmp_path / "ok", steady(0.005, 0.005, 0.012, 0.00625)))
    assert report["rows"][1]["flags"] == [] and report["rows"][1]["model"]["knobs"]
    # strong scaling shrinks the per-rank batch: its limit is not held to that growth
    report = sr.analyse(fake_study(tmp_path / "s", steady(0.005, 0.005, 0.012, 0.009), "strong"))
    assert report["rows"][1]["flags"] == []


def test_flag_thresholds():
    def row(ranks, thr, lim):
        return {"ranks": ranks, "throughput": sr.spread(thr), "limit_throughput": sr.spread(lim)}

    base = row(1, [100, 100], [100, 100])
    assert sr.flags(row(2, [150, 150 * 1.25], [200, 200]), base, "weak") == []
    assert len(sr.flags(row(2, [150, 150 * 1.26], [200, 200]), base, "weak")) == 1
    assert "the limit's repeats" in sr.flags(row(2, [150, 150], [150, 200]), base, "weak")[0]
    assert sr.flags(row(4, [150], [300]), base, "weak") == []              # 0.75 x 4
    assert len(sr.flags(row(4, [150], [299]), base, "weak")) == 1
    assert sr.flags(base, base, "weak") == []                              # the base itself


def test_environment_failures_warn_in_the_report(tmp_path):
    env = {"horovod": "0.28.1", "horovod_build": {"error": "horovodrun --check-build exit 124: "
                                                          "did not answer within 180s"}}
    sd = fake_study(tmp_path / "s", steady(0.005, 0.005, 0.010, 0.006), environment=env)
    report = sr.analyse(sd)
    assert report["warnings"] == [
        "warning: environment.json: horovod_build was not recorded (horovodrun --check-build "
        "exit 124: did not answer within 180s); results are not affected, but comparisons of it "
        "are blind"]
    assert sr.table(report).splitlines()[1] == report["warnings"][0]
    (sd.path / "environment.json").unlink()
    assert "missing or unreadable" in sr.analyse(sd)["warnings"][0]


# ---------------------------------------------------------------------- the environment

def test_environment_is_cached_per_installation_and_failures_are_not(tmp_path, monkeypatch):
    from hpcsuite.study import env as study_env

    asked = []

    def asker(names, horovod):
        asked.append(list(names))
        return {n: ({"error": "mpirun did not answer within 60s"} if n == "mpi" and
                    len(asked) == 1 else f"{n} 1.0") for n in names}

    env = study_env.environment(cache=tmp_path, asker=asker)
    assert env["mpi"] == {"error": "mpirun did not answer within 60s"}
    assert env["horovod_build"] == "horovod_build 1.0" and env["slurm"] == "slurm 1.0"
    env = study_env.environment(cache=tmp_path, asker=asker)
    assert asked == [["horovod_build", "mpi", "slurm"], ["mpi"]]     # the failure asked again
    assert env["mpi"] == "mpi 1.0"
    study_env.environment(cache=tmp_path, asker=asker)
    assert len(asked) == 2                                           # all cached now
    # another installation (here: another Horovod version) asks again
    real = study_env.packages
    monkeypatch.setattr(study_env, "packages", lambda: {**real(), "horovod": "9.9"})
    study_env.environment(cache=tmp_path, asker=asker)
    assert asked[-1] == ["horovod_build", "mpi", "slurm"]


def test_a_dry_run_leaves_only_the_slow_tool_pending(tmp_path):
    from hpcsuite.study import env as study_env

    asked = []

    def asker(names, horovod):
        asked.append(list(names))
        return {n: f"{n} 1.0" for n in names}

    env = study_env.environment(ask=False, cache=tmp_path, asker=asker)
    assert asked == [["mpi", "slurm"]] and study_env.pending(env) == ["horovod_build"]
    assert study_env.warnings(env) == ["warning: environment.json: horovod_build not asked yet "
                                       "(made by a dry run)"]
    env = study_env.environment(cache=tmp_path, asker=asker)           # the first real run
    assert asked[-1] == ["horovod_build"] and study_env.pending(env) == []
    assert study_env.environment(ask=False, cache=tmp_path, asker=asker)["horovod_build"] \
        == "horovod_build 1.0" and len(asked) == 2


def test_a_tool_that_fails_or_hangs_records_its_error(monkeypatch):
    from hpcsuite import slurm
    from hpcsuite.study import env as study_env

    def call(argv, **kw):
        if argv[0] == "mpirun":
            raise UserError("mpirun did not answer within 60s: mpirun --version")
        return slurm.Completed(argv, 1, "", "sbatch: fatal: no configuration\n")

    monkeypatch.setattr(slurm, "call", call)
    assert study_env.ask_tools(["mpi", "slurm", "horovod_build"], horovod=False) == {
        "mpi": {"error": "mpirun did not answer within 60s: mpirun --version"},
        "slurm": {"error": "sbatch exit 1: sbatch: fatal: no configuration"},
        "horovod_build": None}


def test_compare_shows_versions_on_one_line_and_failures_as_warnings():
    from hpcsuite.study import compare as study_compare

    build_text = ("Horovod v0.28.1:\n\nAvailable Frameworks:\n    [X] TensorFlow\n    [X] PyTorch\n"
                  "    [ ] MXNet\n\nAvailable Controllers:\n    [X] MPI\n    [X] Gloo\n\n"
                  "Available Tensor Operations:\n    [ ] NCCL\n    [X] MPI\n    [X] Gloo\n")
    parsed = {"controllers": ["Gloo", "MPI"], "frameworks": ["PyTorch", "TensorFlow"],
              "operations": ["Gloo", "MPI"]}
    a = {"horovod_build": build_text, "mpi": "Open MPI 4.1.4", "made": "1", "host": "x" * 200}
    b = {"horovod_build": parsed, "mpi": {"error": "mpirun did not answer within 60s"},
         "made": "2", "host": "y"}
    diffs, warnings = study_compare.compare_environments(a, b)
    assert [d["key"] for d in diffs] == ["host"]          # an old bundle's text build == parsed
    assert len(diffs[0]["a"]) <= 80 and "\n" not in diffs[0]["a"]
    assert warnings == ["warning: B: environment.json: mpi was not recorded (mpirun did not "
                        "answer within 60s); results are not affected, but comparisons of it "
                        "are blind"]
    b["horovod_build"] = {**parsed, "operations": ["Gloo", "MPI", "NCCL"]}
    diffs, _ = study_compare.compare_environments(a, b)
    build = next(d for d in diffs if d["key"] == "horovod_build")
    assert build["b"] == "controllers Gloo, MPI; frameworks PyTorch, TensorFlow; operations " \
                         "Gloo, MPI, NCCL"


# ---------------------------------------------------------------------- status

def test_status_asks_slurm_for_each_points_job(tmp_path):
    from hpcsuite.study import status as study_status
    from hpcsuite.runs.jobs import JobState

    sd = fake_study(tmp_path / "s", steady(0.005, 0.005, 0.010, 0.006))
    asked = []

    def query(ids):
        asked.append(ids)
        return {j: JobState(j, "COMPLETED" if j != "102" else "FAILED", "0:0", None, None, None,
                            elapsed="00:00:42", source="sacct") for j in ids if j != "999"}

    [first] = [p for p in sd.points() if p.id == "p00-r0"]
    run_dir = sd.run_dir(first, "101")
    (run_dir / "progress.json").write_text('{"step": 7, "max_steps": 10}')
    rows, note = study_status.status(sd, query)
    assert len(asked) == 1 and len(asked[0]) == 9             # one query for every point
    slurm = {r["point"]: (r["slurm"], r["slurm_from"]) for r in rows}
    assert slurm["p00-r0"] == ("COMPLETED", "sacct") and slurm["p00L-r0"] == ("FAILED", "sacct")
    assert slurm["a00"] == (None, "state.json")               # Slurm forgot it: state.json's
    assert "no longer knows the jobs of 1 point(s) (a00)" in note
    # The Slurm part is the record `runs` prints for the same job and the same answer.
    from hpcsuite.runner import describe_many

    [runs_row] = [r.row() for r in describe_many([{"job_id": "101", "run_dir": str(run_dir)}],
                                                 query)]
    [row] = [r for r in rows if r["point"] == "p00-r0"]
    assert (row["slurm"], row["elapsed"], row["step"], row["slurm_from"]) == \
        (runs_row["state"], runs_row["elapsed"], runs_row["step"], runs_row["source"]) == \
        ("COMPLETED", "00:00:42", 7, "sacct")

    def down(ids):
        raise UserError("squeue failed (exit 1): slurm_load_jobs error: Unable to contact "
                        "slurm controller")

    rows, note = study_status.status(sd, down)
    assert {r["slurm"] for r in rows if r["kind"] != "allreduce"} == {"RUNNING"}
    assert {r["slurm_from"] for r in rows} == {"state.json"}
    [row] = [r for r in rows if r["point"] == "p00-r0"]
    assert row["elapsed"] is None and row["step"] == 7         # the run directory still answers
    assert note.startswith("Slurm could not be asked (squeue failed")


def test_status_cli_without_slurm_falls_back_with_a_note(tmp_path):
    import json
    import os

    sd = fake_study(tmp_path / "s", steady(0.005, 0.005, 0.010, 0.006))
    env = {**os.environ, "PATH": str(tmp_path / "no-slurm-here")}
    proc = run_cli("study", "status", str(sd.path), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("note: ") and "Traceback" not in proc.stderr
    rows = json.loads(proc.stdout)
    assert len(rows) == 9 and {r["slurm_from"] for r in rows} == {"state.json"}
    proc = run_cli("study", "status", str(sd.path), env=env)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("p00-r0"))
    assert "RUNNING (state.json)" in line and "command not found" in proc.stderr


def test_the_first_real_run_asks_what_a_dry_run_left_pending(isolated, monkeypatch):
    import json

    from hpcsuite.study import env as study_env

    monkeypatch.setenv("XDG_CACHE_HOME", str(isolated / "cache"))
    asked = []

    def asker(names, horovod):
        asked.append(list(names))
        return {n: f"{n} 1.0" for n in names}

    monkeypatch.setattr(study_env, "ask_tools", asker)
    path = write_study(isolated, "name: s\nbase: job.yaml\nrepeats: 1\n")
    sd = st.create(str(path), None, None, ask_tools=False)
    env = json.loads((sd.path / "environment.json").read_text())
    assert study_env.pending(env) == ["horovod_build"] and asked == [["mpi", "slurm"]]
    sb.complete_environment(sd)
    env = json.loads((sd.path / "environment.json").read_text())
    assert env["horovod_build"] == "horovod_build 1.0" and asked[-1] == ["horovod_build"]
    sb.verify_bundle(sd.path)                     # the manifest records the new environment.json
    sb.complete_environment(sd)
    assert len(asked) == 2                        # nothing pending: nothing asked


def test_compare_warns_of_an_unreadable_environment(tmp_path):
    from hpcsuite.study import compare as study_compare

    a = fake_study(tmp_path / "a", steady(0.005, 0.005, 0.010, 0.006))
    (a.path / "environment.json").write_text("{not json")
    assert "environment.json is missing or unreadable" in study_compare._environment(a)[
        "versions"]["error"]
    diffs, warnings = study_compare.compare_environments(study_compare._environment(a),
                                                         {"horovod": "0.28.1"})
    assert [d["key"] for d in diffs] == ["horovod"] and warnings[0].startswith("warning: A: ")


def test_a_real_run_refuses_points_slurm_can_never_run_and_a_dry_run_asks_nothing(
        isolated, monkeypatch):
    from hpcsuite import slurm

    asked = []

    def call(argv, **kw):                       # a 2-node partition, 1 CPU a node
        asked.append(argv[0])
        if slurm_says_its_release(argv):
            return slurm_says_its_release(argv)
        if argv[:3] == ["scontrol", "show", "partition"]:
            return slurm.Completed(argv, 0, "PartitionName=debug Default=YES MaxNodes=UNLIMITED\n", "")
        if argv[0] == "sinfo":
            return slurm.Completed(argv, 0, "node1|1|(null)\nnode2|1|(null)\n", "")
        raise AssertionError(f"unexpected {argv}")

    monkeypatch.setattr(slurm, "call", call)
    path = write_study(isolated, "name: s\nbase: job.yaml\nrepeats: 1\naxes: {nodes: [1, 4]}\n")
    with pytest.raises(UserError) as exc:
        st.create(str(path), None, None, ask_tools=True)
    assert "points break the site's rules" in str(exc.value)
    assert "resources.nodes: 4 nodes, but partition 'debug' has 2" in str(exc.value)
    assert "point" in str(exc.value) and "nodes=4" in str(exc.value)
    asked.clear()
    monkeypatch.setattr("hpcsuite.study.env.ask_tools", lambda names, horovod: {})
    st.create(str(path), str(isolated / "dry"), None, ask_tools=False)
    assert asked == []


def test_a_studys_after_reaches_every_points_header_and_not_its_bundle(isolated):
    path = write_study(isolated, "name: s\nbase: job.yaml\naxes: {nodes: [1, 2]}\nrepeats: 1\n"
                                 "limit: false\nallreduce_bench: false\nafter: ['41:any', '42']\n")
    proc = run_cli("study", "run", str(path), "--dry-run", cwd=isolated)
    assert proc.returncode == 0, proc.stderr
    sd = st.StudyDir(isolated / "studies" / "s")
    for point in ("p00-r0", "p01-r0"):
        script = (sd.path / "points" / point / "job.sbatch").read_text()
        assert "#SBATCH --dependency=afterany:41,afterok:42\n" in script
        assert "after: []" in (sd.path / "points" / point / "job.yaml").read_text()
    base = (isolated / "job.yaml").read_text()
    (isolated / "job.yaml").write_text(base + "after: [41]\n")
    path.write_text(path.read_text().replace("name: s\n", "name: t\n"))
    proc = run_cli("study", "run", str(path), "--dry-run", cwd=isolated)
    assert proc.returncode == 2 and "base: job.yaml has `after`" in proc.stderr, proc.stderr
