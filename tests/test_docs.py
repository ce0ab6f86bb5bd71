"""The docs site (mkdocs.yml, docs/): the reference pages generated from the code are the ones
committed, the site builds with --strict (a broken link, a missing anchor or a page left out
of the nav fails), and the built site, opened in Debian's headless Chromium, shows a reference
page's key table and finds a key through its search."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading
import urllib.request

import pytest

import chromium
from conftest import REPO


@functools.cache
def generator():
    # scripts/ is on the path when the generator runs as a script; its two helpers live there
    if str(REPO / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_generated_reference_pages_are_current():
    gen = generator()
    stale = gen.stale(gen.pages())
    names = ", ".join(str(p.relative_to(REPO)) for p in stale)
    assert not stale, (f"generated docs are stale: {names}; regenerate them with "
                       f"{gen.REGENERATE} and commit the result")


def test_the_reference_names_every_key_and_command():
    """Every dotted key the schemas accept and every command has its row or section."""
    import click

    from hpcsuite.cli import main
    from hpcsuite.study.points import Study
    from hpcsuite.submit.schema import key_paths
    from hpcsuite.submit.site_profile import SiteProfile
    from hpcsuite.submit.spec import JobSpec
    from hpcsuite.sweep.spec import Sweep

    pages = {p.name: text for p, text in generator().pages().items()}
    for page, schema in (("job-spec.md", JobSpec), ("site-profile.md", SiteProfile),
                         ("sweep.md", Sweep), ("study.md", Study)):
        for key in key_paths(schema):
            assert _row_of(key.replace("partitions.", "partitions.NAME."), pages[page]), \
                f"{page} has no row for {key}"
    gen = generator()
    paths = [ctx.command_path for ctx, _ in gen.reference_cli.commands(main, click.Context(main, info_name="hpcsuite"))]
    assert len(paths) > 30 and "hpcsuite study predict" in paths
    for path in paths:
        assert f"## `{path}`" in pages["cli.md"], path


def _row_of(key: str, page: str) -> bool:
    """The key's row, or (a record met again, as train.eval.data) its row in the section its
    parent links to."""
    if f"| `{key}` |" in page:
        return True
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:cut])
        line = next((l for l in page.splitlines() if l.startswith(f"| `{parent}` |")), "")
        if "](#" in line:
            target = line.split("](#", 1)[1].split(")", 1)[0]
            return f"| `{target}.{'.'.join(parts[cut:])}` |" in page
    return False


def test_a_new_schema_key_reaches_the_reference():
    """A field added to a record (as train.tracking will be) is in the page without any edit."""
    from hpcsuite.submit.spec import Train

    gen = generator()
    extra = dataclasses.field(default=3, metadata={"help": "a key added later", "min": 1})
    added = dataclasses.make_dataclass("Later", [("later_key", int, extra)], bases=(Train,),
                                       frozen=True)
    page = gen.schema_page("t", "x", "", added, gen.job_lock)
    assert "| `later_key` | integer | `3` | at least 1 | a key added later |" in page


ERROR_WORDING = re.compile(r"\bnot (a|an|one of|valid)\b", re.IGNORECASE)


def test_the_reference_says_what_is_allowed_not_the_error_text():
    """The *allowed* column describes values and keys positively ("keys: environment variable
    names"), while the refusal a user gets keeps its own wording ("not a valid environment
    variable name")."""
    from hpcsuite.errors import ConfigError
    from hpcsuite.submit.schema import build
    from hpcsuite.submit.spec import JobSpec

    pages = {p.name: text for p, text in generator().pages().items() if p.name != "cli.md"}
    allowed = {}
    for name, text in pages.items():
        header = None
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip("|").split(" | ")] if line.startswith("| ") else []
            if cells and cells[0] == "key":
                header = cells
            elif cells and header and "allowed" in header and cells[0] != "---":
                allowed[f"{name} {cells[0]}"] = cells[header.index("allowed")]
    assert len(allowed) > 150, len(allowed)
    wrong = {k: v for k, v in allowed.items() if ERROR_WORDING.search(v)}
    assert not wrong, wrong
    assert allowed["job-spec.md `env`"].startswith("keys: environment variable names"), allowed
    assert allowed["job-spec.md `train.model_args`"].startswith("keys: Python argument names")
    assert allowed["job-spec.md `resources.extra_sbatch`"].startswith(
        "keys: sbatch long option names")
    with pytest.raises(ConfigError, match="env.1X: not a valid environment variable name"):
        build(JobSpec, {"name": "j", "env": {"1X": "a"}}, "job.yaml")


def test_a_mapping_with_a_key_pattern_needs_its_positive_keys_text():
    gen = generator()
    assert gen.allowed_text({"key_pattern": "[a-z]+", "keys": "names"}) == "keys: names (`[a-z]+`)"
    with pytest.raises(ValueError, match="no keys= text"):
        gen.allowed_text({"key_pattern": "[a-z]+", "key_help": "not a name"})


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(REPO / "mkdocs.yml"), "-d", str(out)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}{proc.stderr}"
    return out


def test_the_site_builds_strict_with_every_page(site):
    for page in ("index.html", "user/quickstart/index.html", "ARCHITECTURE/index.html",
                 "BENCHMARKS/index.html", "CLUSTER/index.html", "reference/job-spec/index.html",
                 "reference/cli/index.html", "search/search_index.json"):
        assert (site / page).is_file(), page


@pytest.fixture
def served(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


SEARCH_DONE = ("(() => { const m = document.querySelector('.md-search-result__meta');"
               " return m && !/Initializing/.test(m.textContent) && m.textContent.trim(); })()")


@pytest.mark.timeout(120)
def test_a_reference_page_renders_and_its_search_finds_a_key(served):
    assert chromium.binary(), ("chromium is not installed: scripts/setup.sh installs it with the "
                               "Debian packages (apt-get install chromium)")
    with urllib.request.urlopen(f"{served}/search/search_index.json", timeout=10) as answer:
        assert "resources.gpu_sharing" in answer.read().decode()
    with chromium.Browser() as browser:
        tab = browser.open(f"{served}/reference/job-spec/?q=gpu_sharing")
        assert browser.wait_for(tab, "location.pathname === '/reference/job-spec/' && "
                                     "document.readyState === 'complete'")
        keys = browser.evaluate(tab, "[...document.querySelectorAll('table td:first-child code')]"
                                     ".map(c => c.textContent)")
        assert {"name", "train.batch_size", "resources.gpu_sharing"} <= set(keys), keys[:20]
        assert browser.evaluate(tab, "document.querySelector('.md-search__input').value") \
            == "gpu_sharing"
        found = browser.wait_for(tab, SEARCH_DONE)
        assert found and "matching document" in found, found
        links = browser.evaluate(tab, "[...document.querySelectorAll('.md-search-result__item a')]"
                                      ".map(a => a.getAttribute('href'))")
        assert any("/reference/job-spec/" in link for link in links), links


def test_readme_is_short_and_its_links_resolve():
    """The README is the front door (under 8,000 characters, the two commands first); every
    page it points to exists."""
    import re

    text = (REPO / "README.md").read_text()
    assert len(text) < 8000, len(text)
    assert text.startswith("# hpcsuite\n\n```bash\nmake demo   #") and "\nmake test   #" in text[:300]
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) > 20, links
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, missing


def test_benchmarks_open_with_the_summary_of_the_quality_bars():
    text = (REPO / "docs" / "BENCHMARKS.md").read_text()
    first = text.split("\n## ", 2)[1]
    assert first.startswith("Summary"), first[:80]
    header = "| quality bar | latest figure | met? | command | date |"
    rows = [l for l in first.split(header, 1)[1].splitlines() if l.startswith("| ") and "---" not in l]
    assert len(rows) >= 10, rows
    assert all(len(r.split(" | ")) == 5 for r in rows), rows


# ---------------------------------------------------------------------- the user docs' blocks
# Every ```yaml and ```bash block of docs/user is checked (tests/docblocks.py says how), so an
# example cannot rot: a whole file is linted against the local cluster's site profile, a
# fragment's keys go through the schema, a shell line names commands and options that exist.

def _local_profile(tmp_path, gpus: int = 0):
    from hpcsuite.site.slurm_conf import render_profile

    path = tmp_path / f"local-profile-{gpus}.yaml"
    path.write_text(render_profile(gpus))
    return path


def _quiet_env(tmp_path) -> dict:
    """No user or project layer but the ones a test writes, no ambient profile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCSUITE_", "SLURM_"))}
    return {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)}


def _yaml_blocks():
    import docblocks

    return [b for b in docblocks.blocks() if b.lang == "yaml"]


def test_the_user_docs_have_their_blocks_and_few_fragments():
    import docblocks

    found = docblocks.blocks()
    langs = {b.lang for b in found}
    assert langs <= {"yaml", "bash", "shell", "python"}, langs   # a new language needs its check
    for b in found:
        if b.lang == "python":          # a line of a script: it compiles
            compile(b.text, b.where, "exec")
    yaml_blocks = [b for b in found if b.lang == "yaml"]
    fragments = [b for b in yaml_blocks if b.kind != "file"]
    assert len(yaml_blocks) >= 5 and len(fragments) <= 3, [b.where for b in fragments]


@pytest.mark.parametrize("block", _yaml_blocks(), ids=lambda b: b.where)
def test_every_yaml_block_of_the_user_docs_is_checked(block, tmp_path):
    from conftest import run_cli
    from hpcsuite.submit.schema import build
    from hpcsuite.submit.spec import JobSpec
    from hpcsuite.submit.strict_yaml import load

    if block.kind != "file":
        parts = [line for line in block.text.splitlines() if line.strip()
                 and not line.lstrip().startswith("#")] if block.kind == "alternatives" \
            else [block.text]
        for part in parts:
            build(JobSpec, load(part), block.where, partial=True)    # one ConfigError if not
        return
    data = load(block.text)
    shown = block.shows
    if shown is not None:
        assert data == load(shown.read_text()), f"{block.where} differs from {shown}"
        target, cwd = shown, shown.parent
    else:
        target, cwd = tmp_path / "job.yaml", tmp_path
        target.write_text(block.text)
    profile = _local_profile(tmp_path)
    if "axes" in data and "mode" in data:           # a study file
        argv = ["study", "run", str(target), "--dry-run", "--dir", str(tmp_path / "study")]
    elif "axes" in data:                            # a sweep file
        argv = ["sweep", "run", str(target), "--dry-run", "--dir", str(tmp_path / "sweep")]
    else:
        argv = ["lint", "--no-slurm", str(target)]
    proc = run_cli(*argv, "--profile", str(profile), cwd=cwd, env=_quiet_env(tmp_path), timeout=60)
    assert proc.returncode == 0, f"{block.where}: hpcsuite {' '.join(argv)}:\n{proc.stdout}{proc.stderr}"
    assert "error" not in proc.stderr.lower(), proc.stderr


def test_every_shell_block_of_the_user_docs_names_commands_and_options_that_exist():
    import docblocks
    from hpcsuite.cli import main

    shell = [b for b in docblocks.blocks() if b.lang in ("bash", "shell")]
    assert len(shell) >= 6
    problems = [p for b in shell for p in docblocks.shell_problems(b, main)]
    assert not problems, problems
    lines = sum(len(docblocks.commands(b.text)) for b in shell)
    assert lines > 30, lines


def test_the_shell_checker_finds_what_has_rotted():
    import docblocks
    from hpcsuite.cli import main

    page = REPO / "docs" / "user" / "quickstart.md"
    bad = docblocks.Block(page, 1, "bash", "hpcsuite submit job.yaml --wiat\n"
                          "hpcsuite templates list|whch\nmake demoo\ncd examples/nowhere\n"
                          "eval \"$(hpcsuite clster env)\"\nfrobnicate --now\n")
    problems = " ".join(docblocks.shell_problems(bad, main))
    for word in ("--wiat", "whch", "demoo", "examples/nowhere", "clster", "frobnicate"):
        assert word in problems, (word, problems)
    ok = docblocks.Block(page, 1, "bash", "hpcsuite logs RUN [-f] [--rank N] [-n 50]; "
                         "hpcsuite cancel RUN  # a comment's --words\n"
                         "hpcsuite study predict s --nodes 1,2 \\\n    --fabric ib-hdr\n")
    assert docblocks.shell_problems(ok, main) == []


def test_every_shipped_example_lints_quietly_on_the_local_cluster(tmp_path):
    """The examples a user runs on the project's own cluster (examples/, and sbatch/'s specs
    for its debug partition) lint without a warning that no partition is set: the local
    cluster's profile names the partition a job without one goes to."""
    from conftest import run_cli
    from hpcsuite.submit.golden import example_specs

    specs = [p for p in sorted((REPO / "examples").glob("*/*.yaml"))
             if "axes" not in p.read_text()]
    specs += [p for p in example_specs(REPO / "sbatch") if "partition: debug" in p.read_text()
              and "container:" not in p.read_text()]     # the local cluster runs no containers
    assert len(specs) >= 10, specs
    profile = _local_profile(tmp_path)
    for spec in specs:
        proc = run_cli("lint", "--no-slurm", "--profile", str(profile), str(spec), cwd=spec.parent,
                       env=_quiet_env(tmp_path), timeout=60)
        assert proc.returncode == 0, f"{spec}: {proc.stdout}{proc.stderr}"
        assert "partition" not in proc.stderr, f"{spec}: {proc.stderr}"
