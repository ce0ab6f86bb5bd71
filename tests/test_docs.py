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
import subprocess
import sys
import threading
import urllib.request

import pytest

import chromium
from conftest import REPO


@functools.cache
def generator():
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
    paths = [ctx.command_path for ctx, _ in gen._cli().commands(main, click.Context(main, info_name="hpcsuite"))]
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
