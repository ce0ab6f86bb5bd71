"""How often hpcsuite's reader of the #SBATCH header agrees with the real sbatch.

Generates random #SBATCH lines from pieces that matter to sbatch's tokeniser (quotes,
backslashes, '#', tabs, several options per line, abbreviations, clustered short options),
submits each with `sbatch --hold` to the local cluster, reads back job name, comment and
partition with squeue, cancels the job, and compares with hpcsuite.submit.sbatch_header.

    .venv/bin/hpcsuite cluster up
    .venv/bin/python bench/header_agreement.py [-n 1000] [--seed S] [--budget SECONDS]

A heterogeneous-job separator is refused by hpcsuite (it submits one job) and not compared.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from budget import Budget, cancel_jobs_under  # noqa: E402
from hpcsuite.submit.sbatch_header import HeaderError, parse_header  # noqa: E402
from hpcsuite.slurm import slurm_env  # noqa: E402

PIECES = ["--job-name=", "--comment=", " --comment=", " -p", " -pother", " --partition=other",
          " --part=debug", "'", '"', "\\", " ", "#", "a", "b", "\t", "x y", " -J", " --comment ",
          "\\ ", "''", '""', " hetjob", " packjob", "\\'' --partition=other #'", " -Hp"]


def predicted(script: str):
    try:
        found = {o.name: o.value for o in parse_header(script)}
    except HeaderError as e:
        return "hetjob" if "heterogeneous" in str(e) else "error"
    partition = found.get("partition") or "debug"
    return "error" if partition not in ("debug", "other") else \
        (found.get("job-name"), found.get("comment"), partition)


def actual(script: str, work: Path, env: dict):
    path = work / "probe.sbatch"
    path.write_text(script)
    proc = subprocess.run(["sbatch", "--parsable", "--hold", str(path)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return "error"
    job = proc.stdout.strip().split(";")[0]
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%j\x1f%k\x1f%P"], env=env,
                         capture_output=True, text=True, timeout=60).stdout
    subprocess.run(["scancel", job], env=env, timeout=60)
    name, comment, partition = out.split("\n")[0].split("\x1f")
    return name, (None if comment == "(null)" else comment), partition


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=None)
    Budget.add_argument(ap, 900, "cases")
    args = ap.parse_args()
    budget = Budget.from_args(args)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    env = slurm_env()
    work = Path(tempfile.mkdtemp(prefix="hpcsuite-header-"))
    agree = disagree = skipped = 0
    with budget.watch():
        try:
            for _ in budget.each(range(args.n)):
                line = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8)))
                script = f"#!/bin/bash\n#SBATCH --job-name=base --comment=base\n#SBATCH {line}\ntrue\n"
                want = predicted(script)
                if want == "hetjob":
                    skipped += 1
                    continue
                got = actual(script, work, env)
                if want == got:
                    agree += 1
                else:
                    disagree += 1
                    print(f"DISAGREE {line!r}: reader {want}, sbatch {got}")
        finally:
            if budget.stopped_by:       # a held probe job may not have been cancelled yet
                cancel_jobs_under(env, work)
    budget.report(agree + disagree + skipped, args.n, "cases")
    sbatch = subprocess.run(["sbatch", "--version"], capture_output=True, text=True,
                            env=env).stdout.strip()
    print(f"seed {seed}, {sbatch}: {agree} agree, {disagree} disagree, "
          f"{skipped} heterogeneous-job lines not compared")
    sys.exit(budget.exit_code(1 if disagree else 0))


if __name__ == "__main__":
    main()
