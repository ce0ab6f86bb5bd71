"""What `--remote` costs and saves (issue 54), against what a user does by hand, in one run.

A login node is this machine behind a jump host (tests/sshd.py: two Debian sshd on 127.0.0.1,
the account hpcuser and its venv of this checkout). A project of a spec, its model file and
DATA_MB npy shards of 1 MB is rendered there, from here:

- bytes: what the first `render --remote` sends, a second one with nothing changed, and a third
  after one data file changed; against `tar c project | ssh login tar x`, the whole copy a
  user without hpcsuite sends each time;
- connections: how many times the login node authenticated a user (sshd's "Accepted
  publickey" lines) for N commands: hpcsuite's one shared connection against a plain `ssh`
  per command (a site with a second factor asks that many times);
- time: a second `render` of the unchanged project, with the digests kept from the first
  send and with every file read again; a warm `hpcsuite runs --remote` (the shared connection, the version check, the
  remote hpcsuite's start) against `ssh login hpcsuite runs` by hand (a new connection each
  time) and the same command run on the login node itself.

Root only. Prints one JSON object and the ratios.

    python bench/remote.py [--data-mb 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
USER = "hpcuser"


def hpcsuite(env: dict, cwd: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hpcsuite", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"hpcsuite {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return time.perf_counter() - t0, done


def sent_bytes(stderr: str) -> int:
    """The bytes a `sent A of B file(s), X of Y ...` line says went."""
    line = next(line for line in stderr.splitlines() if line.startswith("sent "))
    amount = line.split(", ", 1)[1].split(" of ", 1)[0]
    number, unit = amount.split()
    return int(float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit])


def accepted(site) -> int:
    return site.logs["login"].read_text(errors="replace").count("Accepted publickey")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-mb", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/remote.py starts sshd and uses the account hpcuser: run as root")
    from sshd import make_site

    pw = pwd.getpwnam(USER)
    venv = Path(pw.pw_dir) / "venv-hpcsuite"
    if not (venv / "bin" / "hpcsuite").exists():
        raise SystemExit("no hpcuser venv: bash scripts/test_account.sh --venv")
    base = Path(tempfile.mkdtemp(prefix="hs-b-", dir="/tmp"))
    os.chmod(base, 0o755)
    workdir = f"bench-remote-{os.getpid()}"
    project = base / "project"
    (project / "code").mkdir(parents=True)
    (project / "data").mkdir()
    (project / "code" / "model.py").write_text("def build(shape, classes):\n    ...\n")
    import numpy as np

    rng = np.random.default_rng(0)

    def shard(i: int) -> None:      # 1 MB of inputs, and its labels
        rows = (1 << 20) // 64          # 16 float32 a row
        np.save(project / "data" / f"inputs-{i:05d}.npy",
                rng.standard_normal((rows, 16), dtype="f4"))
        np.save(project / "data" / f"labels-{i:05d}.npy", rng.integers(0, 4, rows))

    for i in range(args.data_mb):
        shard(i)
    (project / "job.yaml").write_text(
        "name: bench\nresources: {nodes: 1, time: '00:05:00'}\n"
        "train:\n  model: code/model.py:build\n  data: {kind: npy, path: data}\n")
    (base / "run").mkdir(mode=0o700)
    out: dict = {"data_mb": args.data_mb, "repeats": args.repeats}
    site = make_site(base / "site", USER)
    try:
        (base / "xdg" / "hpcsuite").mkdir(parents=True)
        (base / "xdg" / "hpcsuite" / "remotes.yaml").write_text(json.dumps({"hpc": {
            "host": "hpc-login", "workdir": f"~/{workdir}", "command": f"{venv}/bin/hpcsuite",
            "ssh_options": ["-F", str(site.config)]}}))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCSUITE_"))}
        env.update(XDG_CONFIG_HOME=str(base / "xdg"), XDG_RUNTIME_DIR=str(base / "run"),
                   XDG_CACHE_HOME=str(base / "cache"))

        # bytes: first, unchanged, one file changed; the whole copy by hand
        before = accepted(site)
        t_first, first = hpcsuite(env, project, "render", "job.yaml", "--remote", "hpc")
        t_second, second = hpcsuite(env, project, "render", "job.yaml", "--remote", "hpc")
        # the same, its files' digests not kept from the last send: each file read again
        shutil.rmtree(base / "cache", ignore_errors=True)
        t_hashing, _ = hpcsuite(env, project, "render", "job.yaml", "--remote", "hpc")
        shard(0)
        _, third = hpcsuite(env, project, "render", "job.yaml", "--remote", "hpc")
        tar = subprocess.run(f"tar -C {shlex.quote(str(project))} -cf - . | wc -c", shell=True,
                             capture_output=True, text=True, check=True)
        out["bytes"] = {"first": sent_bytes(first.stderr), "unchanged": sent_bytes(second.stderr),
                        "one_changed": sent_bytes(third.stderr),
                        "whole_copy_by_hand": int(tar.stdout.split()[0])}

        # connections: N hpcsuite commands against N plain ssh commands
        n = args.repeats
        times_remote = []
        for _ in range(n):
            t, _ = hpcsuite(env, project, "runs", "--remote", "hpc")
            times_remote.append(t)
        auth_hpcsuite = accepted(site) - before
        before = accepted(site)
        times_ssh, times_there = [], []
        by_hand = f"mkdir -p ~/{workdir} && cd ~/{workdir} && {venv}/bin/hpcsuite runs"
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(["ssh", "-F", str(site.config), "hpc-login", by_hand],
                           capture_output=True, check=True, timeout=120)
            times_ssh.append(time.perf_counter() - t0)
        auth_ssh = accepted(site) - before
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(["runuser", "-u", USER, "--", "bash", "-c", by_hand],
                           capture_output=True, check=True, timeout=120)
            times_there.append(time.perf_counter() - t0)
        out["authentications"] = {"hpcsuite_commands": 4 + n, "hpcsuite": auth_hpcsuite,
                                  "plain_ssh_commands": n, "plain_ssh": auth_ssh}
        out["seconds"] = {"first_render_cold": round(t_first, 3),
                          "render_unchanged": round(t_second, 3),
                          "render_unchanged_digests_taken_again": round(t_hashing, 3),
                          "runs_remote_warm_median": round(statistics.median(times_remote), 3),
                          "runs_by_plain_ssh_median": round(statistics.median(times_ssh), 3),
                          "runs_on_the_login_node_median": round(statistics.median(times_there), 3)}
    finally:
        site.stop()
        shutil.rmtree(Path(pw.pw_dir) / workdir, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    b, s = out["bytes"], out["seconds"]
    out["ratios"] = {
        "unchanged_over_first_bytes": round(b["unchanged"] / b["first"], 4),
        "one_changed_over_whole_copy_bytes": round(b["one_changed"] / b["whole_copy_by_hand"], 4),
        "remote_warm_over_plain_ssh_time": round(s["runs_remote_warm_median"]
                                                 / s["runs_by_plain_ssh_median"], 3),
        "remote_warm_over_login_node_time": round(s["runs_remote_warm_median"]
                                                  / s["runs_on_the_login_node_median"], 3)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
