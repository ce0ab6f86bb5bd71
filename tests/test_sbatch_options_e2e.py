"""End to end on the local Slurm cluster: the new sbatch option keys reach Slurm as written.

The job waits for its begin time (an hour away), so it never runs: Slurm's record of it
(`scontrol show job`) is read back and the job cancelled."""

import subprocess
import textwrap

import pytest

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def scontrol_job(env, job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    fields: dict[str, str] = {}
    # -o: one line of Key=Value; a value may hold spaces (Comment), so split at " Key=".
    import re

    for match in re.finditer(r"(?:^| )([A-Za-z:/]+)=(.*?)(?= [A-Za-z:/]+=|$)", out.strip()):
        fields.setdefault(match.group(1), match.group(2))
    return fields


def sacctmgr(env, *args: str) -> None:
    subprocess.run(["sacctmgr", "-i", *args], env=env, capture_output=True, text=True,
                   timeout=60)


def test_slurm_gets_account_qos_comment_mail_begin_and_extras(local_cluster, tmp_path):
    cluster, env = local_cluster
    if cluster.accounting:   # an account and a QOS of our own, as a site would have
        sacctmgr(env, "add", "qos", "e2eqos")
        sacctmgr(env, "add", "account", "e2elab", "cluster=hpcsuite")
        import getpass

        sacctmgr(env, "add", "user", getpass.getuser(), "account=e2elab", "qos=normal,e2eqos")
    site = tmp_path / "site"
    site.mkdir()
    (site / "profile.yaml").write_text(textwrap.dedent("""\
        name: localsite
        partitions:
          debug: {cpus_per_node: 1, allow_accounts: [e2elab], allow_qos: [normal, e2eqos]}
          other: {cpus_per_node: 1}
        sbatch_allowed: [nice]
        """))
    env = dict(env, HPCSUITE_SITE_DIR=str(site), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    env.pop("HPCSUITE_PROFILE", None)
    comment = 'e2e "quoted" run # 3; $(not run)'
    account = "account: e2elab, qos: e2eqos, " if cluster.accounting else ""
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: optjob\n"
        f"resources: {{nodes: 1, partition: debug, {account}exclusive: user, "
        "mail_type: 'END,FAIL', mail_user: ada@example.org, begin: now+1hours, "
        f"comment: {comment!r}, extra_sbatch: {{nice: 7}}}}\n"
        "train: {data: {samples: 64}, epochs: 1}\n")

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nresources: {partition: debug, account: elsewhere}\n")
    proc = run_cli("submit", str(bad), cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "resources.account: 'elsewhere' is not allowed on partition " \
        "debug; it allows: e2elab" in proc.stderr and "Traceback" not in proc.stderr

    proc = run_cli("submit", str(spec), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    try:
        job = scontrol_job(env, job_id)
        assert job["JobState"] == "PENDING", job
        # scontrol -o ends some values with a space before the next key; squeue prints the
        # comment alone.
        assert job["Comment"].rstrip(" ") == comment
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%k"], env=env,
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert out == comment + "\n"
        assert job["MailType"] == "END,FAIL" and job["MailUser"] == "ada@example.org"
        assert job["Nice"] == "7"
        assert job["OverSubscribe"] == "USER"
        assert job["Partition"] == "debug"
        assert job["Reason"] in ("BeginTime", "None"), job["Reason"]
        if cluster.accounting:
            assert job["Account"] == "e2elab" and job["QOS"] == "e2eqos", job
    finally:
        subprocess.run(["scancel", job_id], env=env, timeout=60)
