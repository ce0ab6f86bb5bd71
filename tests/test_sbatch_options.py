"""The sbatch options every user needs (account, qos, constraint, exclusive, mail, begin,
comment, the site's allowed extra options) and CPU binding: validated when read, checked
against the site's allow-lists and locks, rendered so that sbatch reads back exactly them."""

import json
import textwrap

import pytest
from click.testing import CliRunner

import hpcsuite.submit.config as config
from hpcsuite.cli import main
from hpcsuite.submit.config import resolve
from hpcsuite.errors import UserError
from hpcsuite.submit.plan import plan
from hpcsuite.submit.sbatch_header import effective, parse_header
from hpcsuite.submit.templating import SearchPath

SITE = """\
name: uni
contact: hpc@uni.example
partitions:
  batch: {cpus_per_node: 8, max_time: "02:00:00", allow_accounts: [physics, chem], allow_qos: [normal, long]}
  fixed: {cpus_per_node: 8, account: ml, qos: gpu, reservation: maint, constraint: ib}
  open: {cpus_per_node: 8}
sbatch_allowed: [licenses, reservation, contiguous, nice]
defaults: {resources: {partition: batch}}
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    site, user, project = tmp_path / "site", tmp_path / "xdg", tmp_path / "proj"
    for d in (site / "templates", user / "hpcsuite", project / ".hpcsuite" / "templates"):
        d.mkdir(parents=True)
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(site))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    monkeypatch.setattr(config, "SYSTEM_DIR", tmp_path / "etc-hpcsuite")
    monkeypatch.chdir(project)
    (site / "profile.yaml").write_text(SITE)
    return {"site": site / "profile.yaml", "spec": project / "job.yaml",
            "templates": project / ".hpcsuite" / "templates", "user": user / "hpcsuite" / "profile.yaml"}


def script_of(site, resources: str, *sets: str, extra: str = "") -> str:
    site["spec"].write_text(f"name: job\nresources: {resources}\n{extra}")
    r = resolve(str(site["spec"]), sets=sets)
    return plan(r.job, r.profile, SearchPath.default(), r.locks).script


def header(script: str) -> dict:
    """What sbatch reads, checked to be the same with the 22.05 rules and later ones."""
    readings = [{o.name: o.value for o in effective(parse_header(script, keep_escaped_space=k)).values()}
                for k in (False, True)]
    assert readings[0] == readings[1]
    return readings[0]


def refusal(site, resources: str, *args: str) -> str:
    """Render the spec through the CLI: exit 2, one `error:` line; that line."""
    site["spec"].write_text(f"name: job\nresources: {resources}\n")
    result = CliRunner().invoke(main, ["render", str(site["spec"]), *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0][len("error: "):]


# ---------------------------------------------------------------------- each key, rendered

@pytest.mark.parametrize("resources, options", [
    ("{account: physics, qos: long}", {"account": "physics", "qos": "long"}),
    ("{constraint: 'skylake&(ib|opa)'}", {"constraint": "skylake&(ib|opa)"}),
    ("{exclusive: true}", {"exclusive": None}),
    ("{exclusive: user}", {"exclusive": "user"}),
    ("{exclusive: mcs}", {"exclusive": "mcs"}),
    ("{mail_type: [END, FAIL], mail_user: ada@example.org}",
     {"mail-type": "END,FAIL", "mail-user": "ada@example.org"}),
    ("{mail_type: 'begin,end,time_limit_90'}", {"mail-type": "BEGIN,END,TIME_LIMIT_90"}),
    ("{mail_type: ALL}", {"mail-type": "ALL"}),
    ("{begin: now+2hours}", {"begin": "now+2hours"}),
    ("{begin: '16:00'}", {"begin": "16:00"}),
    ("{begin: '2027-01-31T08:30:00'}", {"begin": "2027-01-31T08:30:00"}),
    ("{begin: teatime}", {"begin": "teatime"}),
    ("{comment: plain}", {"comment": "plain"}),
    ("{comment: 'lr 0.1, \"no warmup\" # sweep 3'}", {"comment": 'lr 0.1, "no warmup" # sweep 3'}),
    ("{comment: 'it''s a \\ back\\slash'}", {"comment": "it's a \\ back\\slash"}),
    ("{extra_sbatch: {licenses: 'matlab:2', nice: 10, contiguous: true}}",
     {"licenses": "matlab:2", "nice": "10", "contiguous": None}),
    ("{extra_sbatch: {reservation: 'a b'}}", {"reservation": "a b"}),
])
def test_each_key_reaches_sbatch_as_written(site, resources, options):
    found = header(script_of(site, resources))
    for name, value in options.items():
        assert name in found and found[name] == value, (name, found)


def test_unset_keys_add_no_option_and_exclusive_false_is_absent(site):
    found = header(script_of(site, "{exclusive: false, mail_type: []}"))
    for name in ("account", "qos", "constraint", "exclusive", "mail-type", "mail-user", "begin",
                 "comment", "licenses"):
        assert name not in found


def test_the_job_s_account_and_the_partition_s(site):
    assert header(script_of(site, "{partition: fixed}"))["account"] == "ml"
    found = header(script_of(site, "{partition: fixed, account: ml, qos: gpu, constraint: ib}"))
    assert (found["account"], found["qos"], found["reservation"], found["constraint"]) == \
        ("ml", "gpu", "maint", "ib")
    assert header(script_of(site, "{partition: open, account: anyone}"))["account"] == "anyone"


def test_comment_is_shell_quoted_in_the_body_and_json(site):
    script = script_of(site, "{comment: '$(touch /tmp/x); `id`'}")
    assert "#SBATCH --comment=\"$(touch /tmp/x); `id`\"" in script
    job_json = script.split("<<'HPCSUITE_JOB_JSON'\n")[1].split("\n")[0]
    assert json.loads(job_json)["resources"]["comment"] == "$(touch /tmp/x); `id`"


# ---------------------------------------------------------------------- validation

@pytest.mark.parametrize("resources, message", [
    ("{account: 'a b'}", "job.yaml: resources.account: 'a b' is not valid: letters, digits"),
    ("{qos: -high}", "job.yaml: resources.qos: '-high' is not valid"),
    ("{constraint: 'ib;rm'}", "job.yaml: resources.constraint: 'ib;rm' is not valid: a Slurm feature"),
    ("{exclusive: maybe}", "job.yaml: resources.exclusive: 'maybe' is not valid: true, false, user or mcs"),
    ("{exclusive: 1}", "job.yaml: resources.exclusive: 1 is not valid: true, false, user or mcs"),
    ("{mail_type: [END, FIAL]}", "job.yaml: resources.mail_type[1]: 'FIAL' is not one of: NONE, BEGIN"),
    ("{mail_type: 'END FAIL'}", "job.yaml: resources.mail_type[0]: 'END FAIL' is not one of"),
    ("{mail_type: [NONE, END]}", "job.yaml: resources.mail_type: NONE cannot be combined"),
    ("{mail_type: {a: 1}}", "job.yaml: resources.mail_type: expected a list, got a mapping"),
    ("{mail_user: ada}", "job.yaml: resources.mail_user: 'ada' is not valid: an e-mail address"),
    ("{mail_user: 'a@b c'}", "job.yaml: resources.mail_user: 'a@b c' is not valid"),
    ("{begin: now+1hour}", "job.yaml: resources.begin: 'now+1hour' is not valid: Slurm's forms"),
    ("{begin: yesterday}", "job.yaml: resources.begin: 'yesterday' is not valid"),
    ("{begin: '25:00'}", "job.yaml: resources.begin: '25:00' is not a valid time"),
    ("{begin: '2027-02-30'}", "job.yaml: resources.begin: '2027-02-30' is not a valid time"),
    ("{begin: '2027-01-01 10:00'}", "job.yaml: resources.begin: '2027-01-01 10:00' is not valid"),
    ("{begin: 16:00}", 'resources.begin: 16:00 unquoted is the number 960 in YAML (base 60)'),
    ("{comment: ''}", "job.yaml: resources.comment: must not be empty"),
    ("{comment: \"a\\tb\"}", "job.yaml: resources.comment: control character '\\t' is not allowed"),
    ("{comment: 'x' }", None),
    ("{extra_sbatch: {'--licenses': a}}", "job.yaml: resources.extra_sbatch.--licenses: not an sbatch long option"),
    ("{extra_sbatch: {licenses: ''}}", "job.yaml: resources.extra_sbatch.licenses: must not be empty"),
    ("{extra_sbatch: {contiguous: yes-please}}", "resources.extra_sbatch.contiguous: --contiguous takes no value"),
    ("{extra_sbatch: {licenses: true}}", "job.yaml: resources.extra_sbatch.licenses: --licenses needs a value"),
    ("{binding: {bind_to: cores}}", "job.yaml: resources.binding.bind_to: 'cores' is not valid: OpenMPI's --bind-to"),
    ("{binding: {map_by: 'slot; id'}}", "job.yaml: resources.binding.map_by: 'slot; id' is not valid"),
    ("{binding: {cpu_bind: core}}", "job.yaml: resources.binding.cpu_bind: 'core' is not valid: srun's --cpu-bind"),
])
def test_bad_values_are_refused_naming_file_and_key(site, resources, message):
    if message is None:
        script_of(site, resources)
        return
    assert message in refusal(site, resources)


@pytest.mark.parametrize("resources, message", [
    ("{account: biology}", "job.yaml: resources.account: 'biology' is not allowed on partition batch; it allows: physics, chem"),
    ("{account: physic}", "(did you mean \"physics\"?)"),
    ("{qos: urgent}", "job.yaml: resources.qos: 'urgent' is not allowed on partition batch; it allows: normal, long"),
    ("{partition: fixed, account: mine}", "job.yaml: resources.account: partition fixed runs every job with account ml"),
    ("{partition: fixed, qos: low}", "resources.qos: partition fixed runs every job with qos gpu"),
    ("{partition: fixed, constraint: gpu}", "resources.constraint: partition fixed requires the features ib"),
    ("{partition: fixed, extra_sbatch: {reservation: mine}}",
     "resources.extra_sbatch.reservation: the partition sets --reservation for every job"),
    ("{extra_sbatch: {wrap: 'rm -rf ~'}}",
     "job.yaml: resources.extra_sbatch.wrap: --wrap is not an sbatch option this site allows; it allows: licenses, reservation, contiguous, nice"),
    ("{extra_sbatch: {licence: a}}", '(did you mean "licenses"?)'),
    ("{extra_sbatch: {partition: other}}", "resources.extra_sbatch.partition: --partition is not an sbatch option this site allows"),
])
def test_the_site_s_allow_lists_hold(site, resources, message):
    assert message in refusal(site, resources)


def test_a_site_that_allows_nothing_says_so(site):
    site["site"].write_text(SITE.replace("sbatch_allowed: [licenses, reservation, contiguous, nice]\n", ""))
    assert "it allows: none (sbatch_allowed is empty)" in refusal(site, "{extra_sbatch: {licenses: a}}")


@pytest.mark.parametrize("listed, message", [
    ("partition", "sbatch_allowed[0]: hpcsuite writes --partition from resources.partition; lock that key instead"),
    ("comment", "hpcsuite writes --comment from resources.comment"),
    ("wrap", "sbatch_allowed[0]: --wrap cannot be passed through hpcsuite (it replaces the script)"),
    ("chdir", "--chdir cannot be passed through hpcsuite"),
    ("export", "--export cannot be passed through hpcsuite"),
    ("licences", "sbatch_allowed[0]: --licences is not an sbatch option (Slurm 22.05) (did you mean \"licenses\"?)"),
    ("--licenses", "sbatch_allowed[0]: '--licenses' is not valid: an sbatch long option name"),
])
def test_a_site_cannot_allow_what_hpcsuite_writes_or_what_breaks_a_job(site, listed, message):
    site["site"].write_text(SITE.replace("sbatch_allowed: [licenses, reservation, contiguous, nice]",
                                         f"sbatch_allowed: [{listed!r}]"))
    error = refusal(site, "{}")
    assert error.startswith(f"{site['site']}: ") and message in error


def test_only_the_site_lists_allowed_options(site):
    site["user"].write_text("sbatch_allowed: [licenses, wckey]\n")
    assert "sbatch_allowed: only the site profile" in refusal(site, "{}")


# ---------------------------------------------------------------------- locks

@pytest.mark.parametrize("lock, spec, key, value", [
    ("resources.account", "{account: chem}", "resources.account", "chem"),
    ("resources.qos", "{qos: long}", "resources.qos", "long"),
    ("resources.constraint", "{constraint: ib}", "resources.constraint", "ib"),
    ("resources.exclusive", "{exclusive: true}", "resources.exclusive", "user"),
    ("resources.mail_type", "{mail_type: END}", "resources.mail_type", "ALL"),
    ("resources.mail_user", "{mail_user: a@b.org}", "resources.mail_user", "a@b.org"),
    ("resources.comment", "{comment: mine}", "resources.comment", "x y"),
    ("resources.begin", "{begin: now}", "resources.begin", "tomorrow"),
    ("resources.extra_sbatch", "{extra_sbatch: {licenses: a}}", "resources.extra_sbatch.licenses", "a"),
    ("resources.binding", "{binding: {bind_to: core}}", "resources.binding.bind_to", "core"),
])
def test_locked_keys_hold_against_the_spec_and_set(site, lock, spec, key, value):
    site["site"].write_text(SITE + f"locked: [{lock}]\n")
    assert refusal(site, spec).startswith(f"{site['spec']}: {key}: the site fixes {lock}")
    error = refusal(site, "{}", "--set", f"{key}={value}")
    assert error.startswith(f"--set: {key}: the site fixes {lock}"), error


def test_a_whole_resources_lock_covers_the_new_keys(site):
    site["site"].write_text(SITE + "locked: [resources]\n")
    assert "the site fixes resources" in refusal(site, "{qos: long}")
    assert "the site fixes resources" in refusal(site, "{}", "--set", "resources.comment=x")


def test_a_site_default_that_is_locked_is_what_sbatch_reads(site):
    site["site"].write_text(SITE.replace("defaults: {resources: {partition: batch}}",
                                         "defaults: {resources: {partition: batch, account: physics, "
                                         "comment: 'site: charged'}}")
                            + "locked: [resources.account, resources.comment]\n")
    found = header(script_of(site, "{}"))
    assert found["account"] == "physics" and found["comment"] == "site: charged"


@pytest.mark.parametrize("lock, smuggle, message", [
    ("resources.account", "#SBATCH --account=chem", "#SBATCH --account must be 'physics' (the site locks resources.account)"),
    ("resources.exclusive", "#SBATCH --exclusive", "#SBATCH --exclusive is not allowed here (the site locks resources.exclusive)"),
    ("resources.comment", "#SBATCH --comment=x", "#SBATCH --comment is not allowed here (the site locks resources.comment)"),
    ("resources.mail_type", "#SBATCH --mail-type=ALL", "#SBATCH --mail-type is not allowed here"),
    ("resources.begin", "#SBATCH -b now+1days", "#SBATCH --begin is not allowed here"),
])
def test_a_template_cannot_add_or_change_a_locked_option(site, lock, smuggle, message):
    defaults = "defaults: {resources: {partition: batch, account: physics}}"
    site["site"].write_text(SITE.replace("defaults: {resources: {partition: batch}}", defaults)
                            + f"locked: [{lock}]\n")
    (site["templates"] / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n{% block sbatch %}{{ super() }}'
        + smuggle + "\n{% endblock %}\n")
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        script_of(site, "{}")


def test_a_template_must_pass_what_the_job_asks_for(site):
    """A site template written before these keys drops them: refused, not silently lost."""
    (site["templates"] / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n{% block sbatch %}\n'
        "#SBATCH --job-name={{ job.name }}\n#SBATCH --partition=batch\n{% endblock %}\n")
    for resources, message in [
            ("{account: physics}", "#SBATCH --account must be 'physics' (resources.account asks for it)"),
            ("{exclusive: true}", "#SBATCH --exclusive must be there without a value (resources.exclusive"),
            ("{comment: 'a b'}", "#SBATCH --comment must be 'a b' (resources.comment asks for it)"),
            ("{extra_sbatch: {nice: 5}}", "#SBATCH --nice must be '5' (resources.extra_sbatch.nice asks")]:
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            script_of(site, resources)


def test_a_template_cannot_put_a_forbidden_account_past_the_allow_list(site):
    """Not even the site's own template (a project's adds no --account the job did not ask
    for: tests/test_template_options.py)."""
    (site["site"].parent / "templates" / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n{% block sbatch %}{{ super() }}'
        "#SBATCH -A biology\n{% endblock %}\n")
    with pytest.raises(UserError, match=r"#SBATCH --account='biology' is not allowed on partition "
                                        r"batch \(physics, chem\)"):
        script_of(site, "{}")


# ---------------------------------------------------------------------- CPU binding

def launch_line(script: str) -> str:
    return next(l for l in script.splitlines() if l.startswith(("mpirun ", "srun ")))


def test_binding_defaults_are_unchanged(site):
    assert "--map-by slot --bind-to none" in launch_line(script_of(site, "{}"))
    assert "--cpu-bind" not in launch_line(script_of(site, "{}", extra="launcher: srun\n"))


def test_the_site_sets_binding_and_a_job_overrides_it(site):
    site["site"].write_text(SITE + "mpi: {binding: {bind_to: core, map_by: 'ppr:2:socket', "
                                   "cpu_bind: 'verbose,cores'}}\n")
    assert "--map-by ppr:2:socket --bind-to core" in launch_line(script_of(site, "{}"))
    assert "--cpu-bind=verbose,cores" in launch_line(script_of(site, "{}", extra="launcher: srun\n"))
    line = launch_line(script_of(site, "{binding: {bind_to: 'socket:overload-allowed'}}"))
    assert "--map-by ppr:2:socket --bind-to socket:overload-allowed" in line
    line = launch_line(script_of(site, "{binding: {cpu_bind: 'map_cpu:0,2'}}", extra="launcher: srun\n"))
    assert "--cpu-bind=map_cpu:0,2" in line


def test_a_user_profile_cannot_change_the_site_s_binding(site):
    site["user"].write_text("mpi: {binding: {bind_to: core}}\n")
    assert "mpi: only the site profile" in refusal(site, "{}")


# ---------------------------------------------------------------------- hostile input

PAYLOADS = [
    "x\n#SBATCH --partition=other", "x\r--partition=other", "x\0y", "#SBATCH --partition=other",
    "x --partition=other", "x; touch /tmp/hpcsuite-canary", "$(touch /tmp/hpcsuite-canary)",
    "`touch /tmp/hpcsuite-canary`", "x' --partition=other '", 'x" --partition=other "',
    "x\\' --partition=other #'", "\\'' --partition=other #'", "x\\", "x # --partition=other",
    "--wrap=touch /tmp/hpcsuite-canary", "x --wrap 'touch /tmp/hpcsuite-canary'", "-pother",
    "x hetjob --partition=other", "PACKJOB", "x\t--partition=other", "x\x0b-pother",
]
KEYS = ["account", "qos", "constraint", "exclusive", "mail_type", "mail_user", "begin", "comment",
        "extra_sbatch.licenses", "binding.bind_to", "binding.map_by", "binding.cpu_bind",
        "binding.gpu_bind", "gpus_per_task", "after"]


def hostile_spec(key: str, payload: str) -> str:
    value = json.dumps(payload)
    if key == "after":               # a top-level list: a job id or a job name, then the condition
        return f"name: job\nafter: [{value}]\n"
    if key.startswith("extra_sbatch."):
        return f"name: job\nresources: {{extra_sbatch: {{licenses: {value}}}}}\n"
    if "." in key:
        outer, inner = key.split(".")
        return f"name: job\nresources: {{{outer}: {{{inner}: {value}}}}}\n"
    return f"name: job\nresources: {{{key}: {value}}}\n"


def check_hostile(site, key: str, payload: str) -> str:
    """Refused naming the key, or rendered with exactly the asked value and nothing smuggled;
    'refused' or 'accepted'."""
    site["spec"].write_text(hostile_spec(key, payload))
    result = CliRunner().invoke(main, ["render", str(site["spec"])])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    if result.exit_code == 2:
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
        named = "after" if key == "after" else f"resources.{key.split('.')[0]}"
        assert f": {named}" in lines[0], lines[0]
        return "refused"
    assert result.exit_code == 0, result.output
    found = header(result.output)
    assert found.get("partition") == "batch" and "wrap" not in found, (payload, found)
    option = {"mail_type": "mail-type", "mail_user": "mail-user",
              "extra_sbatch.licenses": "licenses"}.get(key, key)
    if key in ("comment", "extra_sbatch.licenses"):
        assert found[option] == payload
    extra = set(found) - {"job-name", "nodes", "ntasks-per-node", "cpus-per-task", "time",
                          "partition", "output", option}
    assert not extra, (payload, extra)
    return "accepted"


@pytest.mark.parametrize("key", KEYS)
def test_hostile_values_are_refused_or_stay_one_value(site, key):
    outcomes = [check_hostile(site, key, p) for p in PAYLOADS]
    if key not in ("comment", "extra_sbatch.licenses", "constraint"):   # -pother is a feature name
        assert set(outcomes) == {"refused"}, list(zip(PAYLOADS, outcomes))


@pytest.mark.parametrize("payload", PAYLOADS)
def test_hostile_after_on_the_command_line_is_refused(site, payload):
    """submit/render --after: one error line, exit 2, nothing rendered."""
    site["spec"].write_text("name: job\n")
    result = CliRunner().invoke(main, ["render", str(site["spec"]), "--after", payload])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: --after: ")


def test_hostile_comment_is_inert_when_the_script_runs(site, tmp_path):
    """The accepted payloads, run by bash: no canary, and sbatch reads the comment back."""
    import subprocess

    canary = tmp_path / "canary"
    for payload in [f"$(touch {canary})", f"`touch {canary}`", f"x; touch {canary}",
                    f"x' ; touch {canary}; '"]:
        script = script_of(site, json.dumps({"comment": payload}))
        assert header(script)["comment"] == payload
        # The header, the run directory and job.json: everything before the environment.
        head = script.split("export OMP_NUM_THREADS")[0]
        subprocess.run(["bash", "-c", head], check=True, cwd=tmp_path,
                       env={"SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"})
        assert not canary.exists()
        job = json.loads((tmp_path / "runs" / "job" / "7" / "job.json").read_text())
        assert job["resources"]["comment"] == payload


# ---------------------------------------------------------------------- config show, lint

def test_config_show_lists_the_new_keys_with_their_origin(site):
    site["spec"].write_text("name: job\nresources: {account: chem, comment: 'a b', "
                            "extra_sbatch: {licenses: 'x:1'}}\n")
    result = CliRunner().invoke(main, ["config", "show", str(site["spec"]), "--origin"])
    assert result.exit_code == 0, result.output
    for key in ("job.resources.account", "job.resources.comment", "job.resources.extra_sbatch.licenses",
                "job.resources.exclusive", "job.resources.mail_type", "site.sbatch_allowed",
                "site.mpi.binding.bind_to", "site.partitions.batch.allow_accounts"):
        assert key in result.output, key
    assert "job.resources.account" in result.output and "spec (" in result.output


def test_lint_checks_the_new_keys(site):
    site["spec"].write_text("name: job\nresources: {account: biology}\n")
    result = CliRunner().invoke(main, ["lint", str(site["spec"])])
    assert result.exit_code == 2 and "resources.account: 'biology' is not allowed" in result.output


PIECES = ["a", " ", "'", '"', "\\", "#", "\t", "$(x)", "`x`", ";", " --partition=other", " -pother",
          "--wrap=x", "#SBATCH", "\\'", "''", '""', " hetjob", "é", "\x7f", "\n", ":"]


def test_random_free_text_reads_back_exactly_or_is_refused(site):
    """Derandomised hypothesis over comment and extra_sbatch values built from sbatch's and
    bash's special characters: accepted text is what sbatch reads (both tokeniser rules),
    with no option besides the job's; refused text names the key."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    counts = {"accepted": 0, "refused": 0}

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(text=st.lists(st.sampled_from(PIECES), min_size=1, max_size=8).map("".join),
           key=st.sampled_from(["comment", "extra_sbatch.licenses"]))
    def case(text, key):
        counts[check_hostile(site, key, text)] += 1

    case()
    assert counts["accepted"] > 50 and counts["refused"] > 50, counts
