"""The job's preflight step (issue O, points 2 and 3): the spec's keys, the bar (a number or the
site's fabric), the batch script's step, who pairs with whom, the verdict and its line, each
rank's GPU on recorded NVML answers, and the step itself under mpirun (several "nodes" on this
machine, told apart by SLURMD_NODENAME; no Slurm)."""

import json
import os
import shutil
import subprocess
import sys
from itertools import combinations

import pytest
from test_gpuhealth import HEALTHY, RECORDED, fake_nvml
from test_locks import SITE, layers  # noqa: F401 (the fixture)

from hpcsuite.errors import ConfigError, UserError
from hpcsuite.runtime.checks import preflight_step as step
from hpcsuite.submit.spec import spec_from_dict


def job(**preflight):
    return spec_from_dict({"name": "pf", "preflight": preflight}, "job.yaml")


# ---------------------------------------------------------------------- the keys
def test_off_by_default_and_bad_values_name_the_key():
    assert not spec_from_dict({"name": "pf"}, "t").preflight.enabled
    assert job(gpu=True).preflight.enabled and job(fabric={}).preflight.fabric.min_busbw_gbps == "site"
    for bad, key in [({"fabric": {"min_busbw_gbps": 0}}, "preflight.fabric.min_busbw_gbps"),
                     ({"fabric": {"min_busbw_gbps": "fast"}}, "preflight.fabric.min_busbw_gbps"),
                     ({"fabric": {"size_mb": 4096}}, "preflight.fabric.size_mb"),
                     ({"fabric": {"sizemb": 4}}, "preflight.fabric.sizemb"),
                     ({"gpu": "yes"}, "preflight.gpu"), ({"gpu_free_gib": -1}, "preflight.gpu_free_gib")]:
        with pytest.raises(ConfigError, match=f"job.yaml: {key}"):
            job(**bad)


def test_a_site_sets_the_preflight_and_may_lock_it(layers):  # noqa: F811
    from hpcsuite.submit.config import resolve

    site = SITE.replace("defaults: {resources: {partition: batch}}",
                        "defaults: {resources: {partition: batch}, preflight: {fabric: "
                        "{min_busbw_gbps: 2}}}\nfabric: 10gbe-tcp")
    layers["site"].write_text(site)
    assert resolve(str(layers["spec"])).job.preflight.fabric.min_busbw_gbps == 2.0
    assert resolve(str(layers["spec"]), sets=["preflight.fabric.min_busbw_gbps=3"]).job \
        .preflight.fabric.min_busbw_gbps == 3.0
    layers["site"].write_text(site.replace("locked: [resources.partition]",
                                           "locked: [resources.partition, preflight]"))
    with pytest.raises(UserError, match="preflight"):
        resolve(str(layers["spec"]), sets=["preflight.fabric.min_busbw_gbps=3"])


# ---------------------------------------------------------------------- the bar and the script
def profile(**kw):
    from hpcsuite.submit.schema import build
    from hpcsuite.submit.site_profile import SiteProfile

    return build(SiteProfile, kw, "profile.yaml")


def test_the_bar_is_the_number_or_80_percent_of_the_sites_fabric():
    from hpcsuite.submit.preflight import args, required_busbw_gbps

    assert required_busbw_gbps(job(gpu=False), profile()) is None
    assert required_busbw_gbps(job(fabric={"min_busbw_gbps": 3.5}), profile()) == 3.5
    assert required_busbw_gbps(job(fabric={}), profile(fabric="ib-hdr")) == pytest.approx(19.2)
    assert required_busbw_gbps(job(fabric={}), profile(fabric={"bandwidth": 5.0})) == 4.0
    with pytest.raises(UserError, match="preflight.fabric.min_busbw_gbps: site, but the site "
                                        "profile names no fabric"):
        required_busbw_gbps(job(fabric={}), profile())
    assert args(job(), profile()) is None
    assert [str(a) for a in args(job(fabric={}), profile(fabric="10gbe-tcp"))][-2:] == \
        ["--min-busbw-gbps", "0.6"]
    with pytest.raises(UserError, match="preflight.gpu: the job asks for no GPU"):
        args(job(gpu=True), profile())


def script_of(spec: dict, **site) -> str:
    from hpcsuite.submit.plan import plan
    from hpcsuite.submit.templating import SearchPath

    return plan(spec_from_dict({"name": "pf", **spec}, "job.yaml"), profile(**site),
                SearchPath.builtin_only()).script


def test_the_script_runs_the_step_with_the_ranks_launcher_before_training():
    text = script_of({"resources": {"nodes": 2}, "preflight": {"fabric": {"size_mb": 4}}},
                     fabric="25gbe-tcp")
    lines = text.splitlines()
    pre = next(i for i, l in enumerate(lines) if " -m hpcsuite preflight " in l)
    train = next(i for i, l in enumerate(lines) if " -m hpcsuite train " in l)
    begin = next(i for i, l in enumerate(lines) if "attempt begin" in l)
    assert begin < pre < train
    assert lines[pre].startswith("mpirun -np 2 -npernode 1 ")
    assert lines[pre].split(" -m hpcsuite ")[0] == lines[train].split(" -m hpcsuite ")[0]
    assert lines[pre].endswith('preflight --job "$RUN_DIR/job.json" --min-busbw-gbps 1.5 || status=$?')
    assert 'attempt end --run-dir "$RUN_DIR" --status "$status" || exit $?' in lines[pre + 2]
    assert lines[pre + 3] == '  exit "$status"'
    assert " -m hpcsuite preflight " not in script_of({})


def test_a_failed_step_ends_the_script_with_its_status_before_training(tmp_path):
    """The script's own lines, run by bash with the launcher and hpcsuite faked: exit 2, the
    attempt recorded with status 2, training never started."""
    text = script_of({"preflight": {"fabric": {"min_busbw_gbps": 1}}})
    body = text[text.index('HPCSUITE_PY='):]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mpirun").write_text('#!/bin/sh\necho "$@" >> "$LOG"\n'
                                 'case "$*" in *preflight*) exit 2;; esac\n')
    (fake / "py").write_text('#!/bin/sh\necho "py $*" >> "$LOG"\ncase "$*" in *"attempt end"*) '
                             'exit 2;; esac\n')
    for f in fake.iterdir():
        f.chmod(0o755)
    body = body.replace("HPCSUITE_PY=" + body.split("\n")[0].split("=", 1)[1], "HPCSUITE_PY=py")
    log = tmp_path / "log"
    done = subprocess.run(["bash", "-c", "set -euo pipefail\nRUN_DIR=.\n" + body], cwd=tmp_path,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
                               "LOG": str(log)})
    calls = log.read_text().splitlines()
    assert done.returncode == 2
    assert [c.split(" -m hpcsuite ")[-1].split(" --")[0] for c in calls] == \
        ["attempt begin", "preflight", "attempt end"]
    assert calls[-1].endswith("--status 2")


# ---------------------------------------------------------------------- who pairs with whom
@pytest.mark.parametrize("n", range(1, 18))
def test_every_pair_once_in_rounds_of_disjoint_pairs(n):
    rounds = step.pair_rounds(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(combinations(range(n), 2))
    for r in rounds:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)


@pytest.mark.parametrize("n", [2, 3, 17, 18, 64, 513])
def test_above_16_nodes_each_node_meets_its_two_ring_neighbours(n):
    kind, rounds = step.schedule(n)
    assert kind == ("pairs" if n <= 16 else "ring")
    if kind == "pairs":
        return
    pairs = sorted(p for r in rounds for p in r)
    assert pairs == sorted({tuple(sorted((i, (i + 1) % n))) for i in range(n)})
    assert len(rounds) <= 3
    for r in rounds:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))


def pair(a, b, gbps):
    return {"nodes": [a, b], "busbw_Bps": gbps * 1e9}


def test_the_verdict_names_slow_pairs_and_a_node_whose_every_pair_is_slow():
    pairs = [pair("n1", "n2", 9), pair("n1", "n3", 2), pair("n2", "n3", 2.5),
             pair("n1", "n4", 9), pair("n2", "n4", 9), pair("n3", "n4", 1)]
    slow, culprits = step.verdict(pairs, 5e9)
    assert [p["nodes"] for p in slow] == [["n1", "n3"], ["n2", "n3"], ["n3", "n4"]]
    assert culprits == ["n3"]
    assert step.fabric_line(slow, culprits, 5e9, len(pairs)) == (
        "preflight.fabric: 3 of 6 node pair(s) below the 5 GB/s busbw required: n1-n3 2 GB/s, "
        "n2-n3 2.5 GB/s, n3-n4 1 GB/s; slow node(s): n3")
    # two nodes: one pair, no node to blame over the other
    slow, culprits = step.verdict([pair("node1", "node2", 0.6)], 1e13)
    assert culprits == [] and step.fabric_line(slow, culprits, 1e13, 1) == (
        "preflight.fabric: 1 of 1 node pair(s) below the 10000 GB/s busbw required: "
        "node1-node2 0.6 GB/s")
    assert step.verdict([pair("a", "b", 1)], 1e9) == ([], [])    # at the bar passes


# ---------------------------------------------------------------------- each rank's GPU
def gpu_job(**kw):
    return spec_from_dict({"name": "pf", "resources": {"gpus_per_node": 1},
                           "preflight": {"gpu": True, **kw}}, "job.yaml")


def test_a_ranks_gpu_is_read_through_nvml_and_judged(monkeypatch):
    nvml = fake_nvml(**RECORDED)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    got = step.check_gpu(gpu_job(gpu_free_gib=35), 0)
    assert [f["what"] for f in got["findings"]] == ["remapped_rows", "processes", "memory"]
    assert got["line"].startswith("GPU 0 (NVIDIA A100-SXM4-40GB): row remapping pending")
    assert step.gpu_line([{"rank": 1, "host": "node2", **got}]).startswith(
        "preflight.gpu: 1 rank(s) with an unfit GPU: rank 1 on node2: GPU 0 (NVIDIA A100")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert step.check_gpu(gpu_job(), 0)["line"] == "no GPU visible to this rank"


def test_a_healthy_recorded_gpu_passes(monkeypatch):
    recorded = {**RECORDED, "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
                "nvmlDeviceGetComputeRunningProcesses": []}
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(**recorded))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    got = step.check_gpu(gpu_job(gpu_free_gib=20), 0)
    assert got["findings"] == [] and got["line"].endswith(": healthy")
    assert HEALTHY["name"]   # the recorded H100 of test_gpuhealth stays the reference


class OneRank:
    """COMM_WORLD of one rank, for the step's bookkeeping without MPI."""
    rank, size = 0, 1

    def gather(self, value, root=0):
        return [value]

    def bcast(self, value, root=0):
        return value


def test_the_step_fails_on_an_unfit_gpu_and_records_every_ranks_answers(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(**RECORDED))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu7")
    record, lines = step.run(gpu_job(), None, OneRank())
    assert not record["passed"] and "fabric" not in record and record["hosts"] == ["gpu7"]
    assert record["gpu"][0]["answers"]["remapped_rows"]["pending"] is True
    assert lines == ["preflight.gpu: 1 rank(s) with an unfit GPU: rank 0 on gpu7: GPU 0 (NVIDIA "
                     "A100-SXM4-40GB): row remapping pending (needs a GPU reset); held by 1 "
                     "other process(es) (pid 99; 0.0 GiB)"]
    step.report_failure(tmp_path, lines)
    from hpcsuite.runner.status import reported_error

    assert reported_error(tmp_path)["message"] == lines[0]


# ---------------------------------------------------------------------- the step under mpirun
def run_step(tmp_path, nodes, bar):
    (tmp_path / "job.json").write_text(json.dumps(spec_from_dict(
        {"name": "pf", "preflight": {"fabric": {"size_mb": 1}}}, "t").to_dict()))
    argv = ["mpirun", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
            "-x", f"HPCSUITE_RUN_DIR={tmp_path}"]
    for i, node in enumerate(nodes):
        argv += [":"] if i else []
        argv += ["-np", "1", "env", f"SLURMD_NODENAME={node}", sys.executable, "-m", "hpcsuite",
                 "preflight", "--job", str(tmp_path / "job.json"), "--min-busbw-gbps", str(bar)]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")


@needs_mpirun
def test_three_nodes_pass_a_bar_they_reach(tmp_path):
    """node2 has two ranks: its first one measures, the other waits."""
    done = run_step(tmp_path, ["node1", "node2", "node2", "node3"], 0.001)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "preflight.json").read_text())
    assert record["passed"] and record["hosts"] == ["node1", "node2", "node2", "node3"]
    f = record["fabric"]
    assert [p["nodes"] for p in f["pairs"]] == [["node1", "node2"], ["node1", "node3"],
                                                 ["node2", "node3"]]
    for p in f["pairs"]:
        assert p["busbw_Bps"] == pytest.approx((1 << 20) / p["seconds"], rel=1e-12)
        assert min(p["repeats_s"]) <= p["seconds"] <= max(p["repeats_s"])
    assert f["required_busbw_Bps"] == pytest.approx(1e6) and f["schedule"] == "pairs"
    assert "hpcsuite preflight: passed (3 node pair(s), lowest busbw" in done.stdout
    assert not list(tmp_path.glob("FAILED-*"))


@needs_mpirun
def test_a_bar_no_link_reaches_ends_the_step_with_exit_2_naming_the_pair(tmp_path):
    done = run_step(tmp_path, ["node1", "node2"], 10000)
    assert done.returncode == 2, done.stdout + done.stderr
    record = json.loads((tmp_path / "preflight.json").read_text())
    assert not record["passed"] and record["fabric"]["slow_pairs"] == [["node1", "node2"]]
    line = ("hpcsuite preflight: preflight.fabric: 1 of 1 node pair(s) below the 10000 GB/s "
            "busbw required: node1-node2 ")
    assert line in done.stderr
    from hpcsuite.runner.status import reported_error

    said = reported_error(tmp_path)
    assert said["rank"] == 0 and said["message"].startswith("preflight.fabric: 1 of 1 node pair")


def test_a_preflight_the_site_cannot_run_is_refused_naming_the_file_that_asked(layers):  # noqa: F811
    from hpcsuite.submit.config import resolve

    layers["spec"].write_text("name: job\npreflight: {fabric: {size_mb: 4}}\n")
    with pytest.raises(ConfigError, match=r"job.yaml: preflight.fabric.min_busbw_gbps: site, "
                                          "but the site profile names no fabric"):
        resolve(str(layers["spec"]))
    layers["spec"].write_text("name: job\npreflight: {gpu: true}\n")
    with pytest.raises(ConfigError, match="job.yaml: preflight.gpu: the job asks for no GPU"):
        resolve(str(layers["spec"]))


# ---------------------------------------------------------------------- doctor and bench
def test_doctor_shows_the_sites_fabric_and_the_bar_it_sets():
    from hpcsuite.site.doctor import check_fabric

    none = check_fabric(profile())
    assert none.status == "warn" and none.detail.startswith("the site profile names no fabric: "
                                                            "a job's preflight.fabric with "
                                                            "min_busbw_gbps: site")
    assert "add fabric: to the site profile" in none.hint
    c = check_fabric(profile(fabric="ib-hdr"))
    assert c.status == "pass" and c.detail.endswith(
        "preflight.fabric min_busbw_gbps: site asks 19.2 GB/s busbw of each node pair (80%)")
    told = check_fabric(profile(fabric={"bandwidth": 1.0, "latency": 10.0,
                                        "source": "nominal: loopback"}))
    assert told.detail.startswith("site profile: 1 GB/s, 10 us per step between nodes; one flat "
                                  "ring (nominal: loopback); preflight.fabric min_busbw_gbps: "
                                  "site asks 0.8 GB/s"), told.detail


def test_the_local_clusters_profile_names_its_fabric_and_its_nodes(tmp_path, monkeypatch):
    """`hpcsuite cluster up` writes a profile whose fabric lets `min_busbw_gbps: site` run (a
    nominal loopback figure, said so), whose comment says what the nodes are, and which sends
    a job without a partition to Slurm's default one."""
    from hpcsuite.site.doctor import check_fabric
    from hpcsuite.site.slurm_conf import render_profile
    from hpcsuite.submit.strict_yaml import load

    for gpus, shape in ((0, "two 1-core nodes on this machine"),
                        (2, "two 2-core nodes with 2 GPUs each on this machine")):
        text = render_profile(gpus)
        assert shape in text, text
        data = load(text)
        assert data["defaults"] == {"resources": {"partition": "debug"}}
        fabric = data.pop("fabric")
        assert fabric["source"].startswith("nominal: TCP over loopback")
        line = check_fabric(profile(fabric=fabric)).detail
        assert "(nominal: TCP over loopback" in line and "site asks 0.2 GB/s" in line, line
    # `preflight: {fabric: {}}` (min_busbw_gbps: site) resolves against it: 80 % of 0.25 GB/s.
    from hpcsuite.submit.config import resolve
    from hpcsuite.submit.preflight import required_busbw_gbps

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local.yaml").write_text(render_profile())
    (tmp_path / "job.yaml").write_text("name: j\nresources: {nodes: 2}\npreflight: {fabric: {}}\n")
    r = resolve(str(tmp_path / "job.yaml"), str(tmp_path / "local.yaml"))
    assert r.job.resources.partition == "debug"
    assert required_busbw_gbps(r.job, r.profile) == pytest.approx(0.2)


def test_bench_allreduce_sets_its_mpi_busbw_beside_the_preflight_bar(tmp_path, monkeypatch):
    from test_alphabeta import ab, fake_measurements, invoke

    from conftest import SBATCH
    from hpcsuite import slurm

    site = tmp_path / "profile.yaml"
    site.write_text((SBATCH / "profile.yaml").read_text() + "\nfabric: 25gbe-tcp\n")
    sizes = [4096, 1 << 20]

    def fake_call(argv, **kw):
        if argv[0] == "sbatch":
            return slurm.Completed(argv, 0, "4242\n", "")
        if argv[0] == "sacct":
            return slurm.Completed(argv, 1, "", "sacct: error: accounting storage is disabled")
        run_dir = tmp_path / "runs" / "allreduce-bench" / "4242"
        r = ab.report(sizes, fake_measurements(sizes, 2, 2e-6, 1e9, 100),
                      fake_measurements(sizes, 2, 5e-4, 1e9, 10), 2, ["node1", "node2"], {}, {})
        (run_dir / ab.REPORT).write_text(json.dumps(r))
        return slurm.Completed(argv, 0, "JobId=4242 JobState=COMPLETED ExitCode=0:0 "
                               f"StdOut={tmp_path}/runs/allreduce-bench/slurm-4242.out\n", "")

    monkeypatch.setattr(slurm, "call", fake_call)
    monkeypatch.chdir(tmp_path)
    base = ["bench", "allreduce", "--sizes", "4K,1M", "--profile", str(site)]
    result = invoke(*base)
    assert result.exit_code == 0, result.output
    # 1 MiB over 2 ranks: t = 2*2us + S/1e9, busbw = S/t = 0.996 GB/s; the bar 0.8 x 1.875
    assert "preflight: MPI busbw 0.996 GB/s at 1 MiB; a job's preflight.fabric (min_busbw_gbps: " \
           "site) asks 1.5 GB/s of each node pair: NOT reached" in result.output
    got = json.loads(invoke(*base, "--json").stdout)["preflight"]
    assert got["bar_GBps"] == 1.5 and got["bytes"] == 1 << 20 and not got["reached"]
