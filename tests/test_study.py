"""Study specs, their points, the bundle and the report's arithmetic, without a cluster."""

import subprocess

import pytest

from conftest import run_cli
from hpcsuite import study as st
from hpcsuite import study_report as sr
from hpcsuite.alphabeta import AlphaBeta
from hpcsuite.errors import UserError
from hpcsuite.spec import spec_from_dict

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
    st.verify_bundle(sd.path)
    (sd.path / "inputs" / "model.py").write_text("changed\n")
    with pytest.raises(UserError, match="model.py changed"):
        st.verify_bundle(sd.path)
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
    m = sr.explain(row, model)
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
    knobs = {k["knob"]: k["how"] for k in sr.explain(row, model)["knobs"]}
    assert knobs["train.batch_size"].startswith("8x the per-rank batch (256)")
    assert knobs["train.grad_accumulation"].startswith("accumulate 16 micro-batches")
    assert sr.scale_to_reach(0.006, 0.004) == 8
    assert sr.scale_to_reach(0.006, 0.0001) == 2                  # 2x is the least advised
    assert sr.scale_to_reach(1e-4, 1.0) == sr.MAX_SCALE           # never reached: the most
    fp16 = next(k for k in m["knobs"] if k["knob"] == "train.horovod.compression")
    assert fp16["of_limit"] == pytest.approx(0.006 / (0.006 + 0.004 - 0.002))
    assert sr.dominates_at(model, 4_000_000, 1, 0.006) == 4      # 0.6 ms + 6 ms at 4 ranks
    assert sr.dominates_at(AlphaBeta(alpha_s=1e-3, bandwidth_Bps=1e9, n=2), 0, 1, 0.006) == 4
    # no latency and a bandwidth term that tends to 2S/B = 2 ms: never passes 6 ms
    assert sr.dominates_at(AlphaBeta(alpha_s=0.0, bandwidth_Bps=1e9, n=2), 1e6, 1, 0.006) is None


def test_a_shorter_cycle_is_predicted_from_whole_cycles():
    # The local cluster's 2-node point at batch 128: 1.12 ms of computation, 0.13 ms transfer,
    # steps of 2.2 ms = two 1 ms cycles (each ~1.1 ms long).
    new_cycle, step, now, then = sr.shorter_cycle(2.2e-3, 1.25e-3, 1e-3, floor=3e-4)
    assert (new_cycle, now, then) == (5e-4, 2, 3) and step == pytest.approx(1.65e-3)
    assert sr.shorter_cycle(2.2e-3, 1.25e-3, 1e-3, floor=1e-4)[0] == 2.5e-4    # 5 x 0.25 ms
    assert sr.shorter_cycle(2.2e-3, 1.25e-3, 1e-3, floor=6e-4) is None          # floor above 0.5
    assert sr.shorter_cycle(10e-3, 10e-3, 1e-3, floor=1e-4) is None              # not rounded up
    model, mpi = AlphaBeta(alpha_s=2.5e-4, bandwidth_Bps=2e9, n=2), AlphaBeta(7.5e-6, 1.9e9, n=2)
    row = {"ranks": 2, "axes": {"nodes": 2, "tasks_per_node": 1},
           "results": {"gradient_bytes": 220_000, "gradient_tensors": 6},
           "step_s": {"median": 2.2e-3}, "limit_step_s": {"median": 1.12e-3}}
    knob = next(k for k in sr.explain(row, model, mpi)["knobs"]
                if k["knob"] == "train.horovod.cycle_time_ms")
    assert knob["how"].startswith("0.5:") and "2 of 1 ms now, 3 of 0.5 ms" in knob["how"]
    assert knob["of_limit"] == pytest.approx(1.12 / 1.65, rel=0.05)
    # without MPI's side only halving is offered
    knob = next(k for k in sr.explain(row, model)["knobs"]
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
    st.write_manifest(tmp_path, {})
    assert list(st.read_manifest(tmp_path)) == ["inputs/job.yaml"]
